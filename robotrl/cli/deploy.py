"""``robotrl deploy model=FILE.onnx|.pt2|.pt [hz=500] [seconds=10] [source=sim|module:attr] [task=...]``."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

from robotrl.cli.args import parse_kv

KEYS: dict[str, type] = {
    "model": str, "hz": float, "seconds": float, "source": str, "task": str, "seed": int,
    "max_delta": float, "timeout_ms": float, "safe_action": str, "hold_steps": int, "out": str,
}


def load_source(spec: str, task: str, seed: int, options: dict | None = None) -> object:
    """``sim``: one simulated world of ``task`` (with task ``options``); ``module:attr``: a
    user ObservationSource (an instance, or a class / factory called without arguments)."""
    from robotrl.sim2real.deploy import ObservationSource, SimSource

    if spec == "sim":
        return SimSource(task, seed, **(options or {}))
    if ":" not in spec:
        raise SystemExit(f"source must be 'sim' or 'module:attr', got {spec!r}")
    module_name, attr = spec.split(":", 1)
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise SystemExit(f"cannot load source {spec!r}: {err}") from None
    source = obj() if inspect.isclass(obj) or inspect.isfunction(obj) else obj
    if not isinstance(source, ObservationSource):
        raise SystemExit(f"source {spec!r} has no read() and write(action) methods")
    return source


def deploy_main(argv: list[str]) -> None:
    import torch

    from robotrl.checkpoint import write_json
    from robotrl.logging import console
    from robotrl.sim2real.deploy import (
        DeployConfig,
        SimSource,
        format_report,
        load_policy,
        run_loop,
    )

    args = parse_kv(argv, KEYS)
    if "model" not in args:
        raise SystemExit("robotrl deploy needs model=FILE (.onnx, .pt2 or .pt from robotrl export)")
    try:
        cfg = DeployConfig(
            hz=float(args.get("hz", 500.0)), seconds=float(args.get("seconds", 10.0)),
            max_delta=float(args.get("max_delta", 0.0)),
            obs_timeout=float(args.get("timeout_ms", 0.0)) / 1e3,
            safe_action=str(args.get("safe_action", "last")),
            hold_steps=int(args.get("hold_steps", 100)),
        )
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    torch.set_num_threads(1)
    model = str(args["model"])
    if not Path(model).is_file():
        raise SystemExit(f"error: model {model!r} does not exist")
    try:
        policy = load_policy(model, threads=cfg.threads)
    except ImportError:
        raise SystemExit("deploying an ONNX model needs onnxruntime: "
                         "pip install 'robotrl[onnx]'") from None
    except Exception as err:  # noqa: BLE001 - onnxruntime and torch raise their own types
        raise SystemExit(f"error: {model!r} is not a robotrl export ({err}); deploy runs the "
                         "ONNX, pt2 and TorchScript files of `robotrl export`") from None
    task = str(args.get("task", policy.metadata.get("task", "")))
    # the options the policy was trained with (they can change the observation), unless the
    # task is overridden
    options = policy.metadata.get("task_options", {}) if "task" not in args else {}
    source = load_source(str(args.get("source", "sim")), task, int(args.get("seed", 0)), options)
    console.print(f"deploying {model} ({task}, obs {policy.obs_dim} -> action {policy.act_dim}) "
                  f"at {cfg.hz:g} Hz for {cfg.seconds:g} s; model trained at "
                  f"{policy.metadata.get('control_hz', float('nan')):g} Hz")
    report = run_loop(policy, source, cfg, policy.low, policy.high)
    console.print(format_report(report), markup=False)
    report.pop("actions")
    if isinstance(source, SimSource) and source.returns:
        returns = source.returns
        console.print(f"  sim: {len(returns)} episodes, mean return "
                      f"{sum(returns) / len(returns):.1f}")
        report["sim_returns"] = returns
    if "out" in args:
        write_json(Path(str(args["out"])), report)
        console.print(f"wrote {args['out']}")
