"""Deploy-loop latency: a 2x256 MLP actor in onnxruntime at 500 Hz on one CPU core.

    python benchmarks/deploy_latency.py [--tasks ant hopper] [--seconds 10] [--hz 500]
                                        [--core 0] [--source sim|replay] [--out FILE.json]
                                        [--save DIR | --load DIR]

For each task: export a 2x256 MLP actor with the task's observation and action sizes (through
``robotrl.sim2real.export``, so the file is the verified artifact a robot would run), then run
``robotrl.sim2real.deploy.run_loop`` for ``--seconds`` at ``--hz`` with the process pinned to one
core (``os.sched_setaffinity``, like ``taskset -c``), one onnxruntime intra-op thread and one
torch thread. ``--source sim`` steps one simulated world per tick (the whole loop a robot runs);
``--source replay`` feeds recorded observations (the model and the loop only); ``--load`` reruns
saved models with numpy and onnxruntime alone (e.g. on a quieter machine). Target (issue 5):
model-call p99 < 1 ms. Timings depend on the machine's load: quote them with its description.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from pathlib import Path

import numpy as np

# numpy + onnxruntime only: with --load, the loop runs on a machine without torch or mujoco
from robotrl.sim2real.deploy import DeployConfig, OnnxPolicy, format_report, run_loop


class ReplaySource:
    """Cycles through recorded observations; ``write`` discards the action."""

    def __init__(self, observations: np.ndarray) -> None:
        self.observations = observations
        self.k = 0

    def read(self) -> np.ndarray:
        return self.observations[self.k % len(self.observations)]

    def write(self, action: np.ndarray) -> None:
        self.k += 1


def export_mlp_actor(task: str, path: Path) -> tuple[np.ndarray, dict]:
    """Export a 2x256 ELU MLP actor for ``task`` to ``path``; returns 2000 recorded obs
    [2000, obs_dim] and the export report."""
    import torch

    from robotrl.envs import make, make_task
    from robotrl.nn.actor import DeterministicActor
    from robotrl.nn.mlp import mlp
    from robotrl.nn.normalizer import RunningNormalizer
    from robotrl.sim2real.export import export_policy
    from robotrl.sim2real.verify import record_observations

    torch.set_num_threads(1)
    spec_task = make_task(task)
    low, high = spec_task.action_bounds()
    torch.manual_seed(0)
    network = mlp(spec_task.obs_dim, (256, 256), low.numel(), "elu", out_gain=0.01)
    env = make(task, 8, num_threads=1, seed=0)
    normalizer = RunningNormalizer(spec_task.obs_dim)
    obs = env.reset(seed=0)
    for _ in range(100):  # statistics of a random-action rollout
        normalizer.update(obs)
        obs = env.step(torch.rand(8, low.numel()) * (high - low) + low).obs
    actor = DeterministicActor(network, spec_task.obs_dim, low, high, "clip", normalizer)
    obs = record_observations(actor, env, 2000, seed=1)
    meta = {"metadata_version": 1, "task": task, "obs_dim": actor.obs_dim,
            "action_dim": actor.act_dim, "action_low": low.tolist(), "action_high": high.tolist(),
            "input_name": "obs", "output_name": "action", "control_hz": 1 / spec_task.dt}
    report = export_policy(actor, "onnx", path, meta, obs, obs_source="rollout")
    return obs.numpy(), report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["ant", "hopper"])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--hz", type=float, default=500.0)
    parser.add_argument("--core", type=int, default=None, help="pin to this core (default: last)")
    parser.add_argument("--source", choices=("sim", "replay"), default="sim")
    parser.add_argument("--save", type=Path, default=None,
                        help="keep the exported models and observations in this folder")
    parser.add_argument("--load", type=Path, default=None,
                        help="use models and observations saved with --save (no export, no "
                        "torch; implies --source replay)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args()
    source_kind = "replay" if args.load else args.source

    core = args.core if args.core is not None else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, pinned to "
          f"core {core}; onnxruntime 1 intra-op thread, torch 1 thread; load average "
          f"{os.getloadavg()[0]:.2f}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.load or args.save or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for task in args.tasks:
            path = folder / f"{task}.onnx"
            if args.load:
                observations = np.load(folder / f"{task}_obs.npy")
                max_diff = float("nan")
            else:
                observations, export = export_mlp_actor(task, path)
                np.save(folder / f"{task}_obs.npy", observations)
                max_diff = max(export["max_abs_diff"].values())
            policy = OnnxPolicy(str(path), threads=1)
            if source_kind == "sim":
                from robotrl.sim2real.deploy import SimSource

                source = SimSource(task, seed=0)
            else:
                source = ReplaySource(observations)
            cfg = DeployConfig(hz=args.hz, seconds=args.seconds)
            report = run_loop(policy, source, cfg, policy.low, policy.high)
            report.pop("actions")
            report.update(obs_dim=policy.obs_dim, act_dim=policy.act_dim, source=source_kind,
                          export_max_abs_diff=max_diff)
            results[task] = report
            print(f"\n{task}: 2x256 MLP, obs {policy.obs_dim} -> action {policy.act_dim}, "
                  f"source {source_kind}, export max abs diff {max_diff:.1e}")
            print(format_report(report))
            verdict = "meets" if report["model_ms"]["p99"] < 1.0 else "MISSES"
            print(f"  -> model-call p99 {report['model_ms']['p99']:.3f} ms {verdict} the 1 ms "
                  "target")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
