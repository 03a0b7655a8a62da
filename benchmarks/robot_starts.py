"""Falls from a standing start: the exported actor started many times on every command of the
tracking grid, counted where it falls in its first seconds.

    python benchmarks/robot_starts.py --model runs/go1/policy.onnx [--starts 64] [--seconds 3] \\
        [--out FILE.json]

The tracking report (``robotrl.runners.tracking``) starts each command once, so a policy that
falls in one start out of ten looks fall-free on it. Here every command of ``COMMAND_GRID`` gets
``--starts`` worlds, each from the task's own reset (its pose noise and random heading), on
native MuJoCo with nominal physics; a world counts as fallen if the task terminates it
(tilted past its fall angle or the trunk below its minimum height) within ``--seconds``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from common import banner, machine_meta, write_json
from rich.console import Console
from rich.table import Table
from robot_sim2sim import grid_env, onnx_policy

from robotrl.runners.tracking import COMMAND_GRID


def falls_from_start(policy, meta, starts: int, seconds: float, seed: int = 0) -> list[dict]:
    """One row per grid command: the fraction of ``starts`` worlds that fell within
    ``seconds``, and the trunk's lowest height over the starts."""
    grid = [list(c) for c in COMMAND_GRID]
    env = grid_env(meta, per_command=starts, seed=seed)  # world i holds grid[i % len(grid)]
    base = getattr(env, "unwrapped", env)
    obs = env.reset(seed=seed)
    fell = torch.zeros(env.num_envs, dtype=torch.bool)
    lowest = torch.full((env.num_envs,), float("inf"), dtype=torch.float64)
    r = base.task.root_qpos
    with torch.inference_mode():
        for _ in range(int(round(seconds / env.spec.control_dt))):
            out = env.step(policy(obs))
            obs = out.obs
            alive = ~fell
            lowest[alive] = torch.minimum(lowest[alive], base.sim.qpos[alive, r + 2])
            fell |= out.terminated.bool()
    rows = []
    for k, command in enumerate(grid):
        mine = torch.arange(env.num_envs) % len(grid) == k
        rows.append({"command": command, "starts": int(mine.sum()),
                     "fell": int(fell[mine].sum()),
                     "fell_fraction": float(fell[mine].double().mean()),
                     "lowest_trunk_height": float(lowest[mine].min())})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--starts", type=int, default=64, help="worlds a command")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.starts < 1 or args.seconds <= 0:
        raise SystemExit(f"--starts must be >= 1 and --seconds > 0; got {args.starts}, "
                         f"{args.seconds}")
    torch.set_num_threads(1)
    console = Console()
    console.print(banner("robot falls from a start", f"model {args.model}",
                         f"{args.starts} starts a command, {args.seconds:g} s each"))
    policy, meta = onnx_policy(args.model)
    rows = falls_from_start(policy, meta, args.starts, args.seconds, args.seed)
    table = Table(title=f"{meta['task']}: {args.model}")
    for col in ("command (vx, vy, yaw)", "fell", "of", "lowest trunk m"):
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(", ".join(f"{v:g}" for v in row["command"]), str(row["fell"]),
                      str(row["starts"]), f"{row['lowest_trunk_height']:.3f}")
    console.print(table)
    from scipy.stats import binomtest

    fell = sum(r["fell"] for r in rows)
    total = sum(r["starts"] for r in rows)
    ci = binomtest(fell, total).proportion_ci(0.95, method="wilson")
    console.print(f"fell in {fell} of {total} starts: {fell / total:.1%} [{ci.low:.1%}, "
                  f"{ci.high:.1%}] (95% Wilson interval)")
    if args.out is not None:
        write_json(args.out, {"model": str(args.model), "task": meta["task"],
                              "starts": args.starts, "seconds": args.seconds, "seed": args.seed,
                              "fell": fell, "total": total,
                              "fell_fraction_ci95": [ci.low, ci.high], "commands": rows,
                              "machine": machine_meta()}, console)


if __name__ == "__main__":
    main()
