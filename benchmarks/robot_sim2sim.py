"""Sim-to-sim of an exported legged policy: the ONNX actor's velocity tracking in native MuJoCo,
in MJX on CPU JAX, under held-out physics and under latency, beside a control policy.

    python benchmarks/robot_sim2sim.py --model runs/go1/policy.onnx \\
        [--control runs/go1-nolatency/policy.onnx] [--seconds 10] [--no-mjx] [--out FILE.json]

The file is the artifact a robot runs (``robotrl export``); the policy here is onnxruntime on
the ``policy`` observation group, nothing of the training run. Rows, each the tracking report
of ``robotrl.runners.tracking`` on its fixed command grid (12 commands, one world each):

* ``native``: native MuJoCo, nominal physics (the reference); with ``--repeats N`` also from
  reset seeds 1..N-1 (the same physics, other starting states: the ratio's own spread);
* ``mjx``: the same worlds on the mjx backend (MJX on CPU JAX, float32), from the same seed;
* ``held-out``: mass x0.8 and x1.2, friction x0.3 (0.1 beyond the 'legged' training ranges,
  0.9-1.1 and 0.4-1.25; ``--mass 0.7,1.3 --friction 0.3`` for others), and action latency of
  2 control steps, each alone, on native MuJoCo;
* with ``--control``: the control policy's ``native`` and ``latency 2`` rows (a policy trained
  without latency randomization, evaluated with it).

The issue's bar (92): each row's linear and yaw-rate RMSE within 20% of the ``native`` row's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import banner, machine_meta, write_json
from rich.console import Console
from rich.table import Table

from robotrl.envs import make
from robotrl.runners.tracking import COMMAND_GRID, velocity_tracking
from robotrl.sim2real.export import read_metadata
from robotrl.sim2real.gap import perturbation

MASSES, FRICTIONS = (0.8, 1.2), (0.3,)
"""Held-out physics by default: 0.1 beyond the 'legged' preset's training ranges (mass 0.9-1.1,
friction 0.4-1.25); ``--mass``/``--friction`` give others (a policy trained on wider ranges)."""


def held_out(masses: tuple[float, ...] = MASSES,
             frictions: tuple[float, ...] = FRICTIONS) -> dict[str, dict[str, float]]:
    """The held-out rows' perturbations: each mass and friction factor alone, then latency 2."""
    rows: dict[str, dict[str, float]] = {f"mass x{m:g}": {"mass": m} for m in masses}
    rows.update({f"friction x{f:g}": {"friction": f} for f in frictions})
    rows["latency 2"] = {"delay": 2}
    return rows


def factors(text: str) -> tuple[float, ...]:
    """``--mass 0.7,1.3``: positive factors, comma-separated."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated factors such as 0.8,1.2, "
                                         f"got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"factors must be > 0, got {text!r}")
    return values


def onnx_policy(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    meta = read_metadata(path)

    def policy(obs: dict[str, torch.Tensor]) -> torch.Tensor:
        x = obs["policy"].cpu().numpy().astype(np.float32)
        (y,) = session.run([meta["output_name"]], {meta["input_name"]: x})
        return torch.from_numpy(y)

    return policy, meta


def grid_env(meta: dict[str, Any], per_command: int = 1, backend: str = "mujoco", seed: int = 0,
             **perturb: Any) -> Any:
    """The exported policy's task (its options from the ONNX metadata) on ``per_command`` worlds
    for each command of ``COMMAND_GRID`` (world i holds command i % 12), ``perturb`` as fixed
    physics."""
    options = {k: v for k, v in meta["task_options"].items() if k != "command_grid"}
    kwargs: dict[str, Any] = {"num_threads": 1} if backend == "mujoco" else {}
    if perturb:
        kwargs["randomization"] = perturbation(**perturb)
    return make(meta["task"], per_command * len(COMMAND_GRID), backend=backend, seed=seed,
                command_grid=COMMAND_GRID, **options, **kwargs)


def track(policy: Any, meta: dict[str, Any], seconds: float, backend: str = "mujoco",
          seed: int = 0, **perturb: Any) -> dict[str, Any]:
    env = grid_env(meta, backend=backend, seed=seed, **perturb)
    start = time.perf_counter()
    report = velocity_tracking(env, env.reset(seed=seed), policy, seconds)
    report["wall_s"] = time.perf_counter() - start
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--control", type=Path)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--no-mjx", action="store_true")
    parser.add_argument("--repeats", type=int, default=1,
                        help="also run the native row from reset seeds 1..N-1: its own spread, "
                             "against which a held-out row's ratio reads")
    parser.add_argument("--mass", type=factors, default=MASSES,
                        help="held-out whole-robot mass factors (default 0.8,1.2)")
    parser.add_argument("--friction", type=factors, default=FRICTIONS,
                        help="held-out friction factors (default 0.3)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/figures/robot_sim2sim.json"))
    parser.add_argument("--figure", type=Path, help="a PNG of the rows' tracking errors")
    args = parser.parse_args()
    torch.set_num_threads(1)
    console = Console()
    console.print(banner("robot sim-to-sim", f"model {args.model}", f"{args.seconds:g} s a command"))
    policy, meta = onnx_policy(args.model)
    rows: dict[str, dict[str, Any]] = {"native": track(policy, meta, args.seconds)}
    for seed in range(1, args.repeats):  # the native row's own spread: other starting states
        rows[f"native, reset seed {seed}"] = track(policy, meta, args.seconds, seed=seed)
    if not args.no_mjx:
        rows["mjx"] = track(policy, meta, args.seconds, backend="mjx")
    for name, perturb in held_out(args.mass, args.friction).items():
        rows[name] = track(policy, meta, args.seconds, **perturb)
    if args.control is not None:
        control, control_meta = onnx_policy(args.control)
        rows["control: native"] = track(control, control_meta, args.seconds)
        rows["control: latency 2"] = track(control, control_meta, args.seconds, delay=2)
    base = rows["native"]
    table = Table(title=f"{meta['task']}: {args.model}")
    for col in ("row", "lin RMSE m/s", "yaw RMSE rad/s", "falls/min", "vs native", "wall s"):
        table.add_column(col, justify="right")
    for name, r in rows.items():
        ref = rows["control: native"] if name.startswith("control") else base
        ratio = max(r["lin_vel_rmse"] / ref["lin_vel_rmse"], r["yaw_rate_rmse"] / ref["yaw_rate_rmse"])
        r["worst_ratio_to_native"] = ratio
        table.add_row(name, f"{r['lin_vel_rmse']:.3f}", f"{r['yaw_rate_rmse']:.3f}",
                      f"{r['falls_per_minute']:.2f}", f"x{ratio:.2f}", f"{r['wall_s']:.0f}")
    console.print(table)
    write_json(args.out, {"model": str(args.model), "control": str(args.control or ""),
                          "seconds": args.seconds, "rows": rows, "metadata_task": meta["task"],
                          "machine": machine_meta()}, console)
    console.print(json.dumps({k: round(v["worst_ratio_to_native"], 3) for k, v in rows.items()}))
    if args.figure is not None:
        figure(rows, f"{meta['task']}: the exported actor's tracking", args.figure)
        console.print(f"figure written to {args.figure}")


def figure(rows: dict[str, dict[str, Any]], title: str, path: Path) -> None:
    """Linear and yaw-rate RMSE of each row as bars, the native row's +20% as a dashed line and
    the issue's absolute bar (0.25 m/s, 0.3 rad/s) as a dotted one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=False)
    for ax, key, unit, bar in ((axes[0], "lin_vel_rmse", "m/s", 0.25),
                               (axes[1], "yaw_rate_rmse", "rad/s", 0.3)):
        values = [rows[n][key] for n in names]
        colours = ["tab:gray" if n.startswith("control") else "tab:blue" for n in names]
        ax.bar(range(len(names)), values, color=colours)
        ax.axhline(rows["native"][key] * 1.2, ls="--", color="tab:red", lw=1,
                   label="native + 20%")
        ax.axhline(bar, ls=":", color="tab:green", lw=1.2, label=f"issue 92's bar ({bar})")
        ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel(f"{key.replace('_', ' ')} ({unit})")
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
