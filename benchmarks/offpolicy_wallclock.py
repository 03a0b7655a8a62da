"""Off-policy learning against the wall clock (issue 19): ours (SAC, CrossQ, FastTD3) next to
Stable-Baselines3's SAC and sb3-contrib's CrossQ, each for the same minutes of training on
this machine, one after the other in one process.

    python benchmarks/offpolicy_wallclock.py --task halfcheetah --minutes 10
    python benchmarks/offpolicy_wallclock.py --task hopper --minutes 10 --contestants crossq sb3_crossq
    python benchmarks/offpolicy_wallclock.py --task walker2d --minutes 5 --plot walker2d.png
    python benchmarks/offpolicy_wallclock.py --replot run.json --plot run.png --task hopper

Ours run from the Hydra configs (``robotrl train algo=<name> env=<task>``, tuned files
included) through ``common.ours_wallclock``; the peers with their published defaults (SB3 SAC
with rl-zoo's HalfCheetah warm-up of 10k random steps; sb3-contrib CrossQ with its defaults and
a 5k warm-up, our CrossQ's), one Gymnasium ``*-v5`` env each. Every contestant is evaluated
deterministically every ``--eval-every`` seconds of *training* time (evaluations are not
charged), on 10 fresh episodes seeded alike. torch uses ``--torch-threads`` threads for all.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: no spin-wait stalls

import torch
from common import (
    TimedEvals,
    banner,
    check,
    fresh_dir,
    machine_meta,
    ours_wallclock,
    print_checks,
    sb3_eval,
    sb3_policy,
    write_json,
)
from rich.console import Console
from rich.table import Table

from robotrl.envs.registry import task_class

OURS = {name: [f"algo={name}"] for name in ("sac", "crossq", "fasttd3")}
"""Our contestants: name -> ``robotrl train`` overrides."""
PEERS = ("sb3_sac", "sb3_crossq")
TARGETS = {"halfcheetah": ((10, 5000.0), (30, 8000.0))}
"""Issue 19's targets: (minutes, return) for the best off-policy default."""


def _sb3_model(name: str, task: str, seed: int) -> Any:
    import gymnasium as gym

    env = gym.make(task_class(task).gym_id)
    if name == "sb3_sac":
        from stable_baselines3 import SAC

        return SAC("MlpPolicy", env, learning_starts=10_000, seed=seed, device="cpu", verbose=0)
    from sb3_contrib import CrossQ

    return CrossQ("MlpPolicy", env, learning_starts=5_000, seed=seed, device="cpu", verbose=0)


def sb3_wallclock(name: str, args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """A Stable-Baselines3 contestant for ``args.minutes`` of training, evaluated on the
    training clock like ours."""
    from stable_baselines3.common.callbacks import BaseCallback
    from torch.utils.tensorboard import SummaryWriter

    run_dir = fresh_dir(Path(args.runs) / f"{name}_{args.task}_{args.minutes:g}min", console)
    model = _sb3_model(name, args.task, args.seed)
    evaluate = sb3_eval(args.task, args.eval_episodes, args.seed)
    evals = TimedEvals(lambda: evaluate(sb3_policy(model, None)),
                       SummaryWriter(str(run_dir), filename_suffix=".evals"), args.eval_every,
                       60 * args.minutes)

    class Clock(BaseCallback):
        def _on_step(self) -> bool:
            if evals.due():
                evals.evaluate(self.num_timesteps)
            return not evals.out_of_time()

    console.print(f"[dim]{args.task}: {name}, {args.minutes:g} min ...[/]")
    evals.begin()
    model.learn(total_timesteps=10**9, callback=Clock())
    seconds = evals.finish(model.num_timesteps)
    return {"label": name, "budget_min": args.minutes, "run_dir": str(run_dir),
            "train_seconds": seconds, "eval_seconds": evals.eval_s, "steps": model.num_timesteps,
            "updates": int(model._n_updates), "final": evals.curve[-1], "curve": evals.curve}


def best_within(curve: list[dict[str, float]], minutes: float) -> float:
    """The best evaluation return at or before ``minutes`` of training."""
    return max(p["return"] for p in curve if p["seconds"] <= 60 * minutes + 1)


def figure(runs: dict[str, dict[str, Any]], task: str, path: str) -> None:
    """Evaluation return against training minutes and against env steps, one line each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for name, run in runs.items():
        curve = run["curve"]
        style = "-" if name in OURS else "--"
        label = f"ours {name}" if name in OURS else name.replace("_", " ")
        returns = [p["return"] for p in curve]
        axes[0].plot([p["seconds"] / 60 for p in curve], returns, style, marker=".", label=label)
        stepped = [p for p in curve if p["steps"] > 0]  # the log axis has no 0
        axes[1].plot([p["steps"] for p in stepped], [p["return"] for p in stepped], style,
                     marker=".", label=label)
    axes[0].set_xlabel("training minutes (2 CPU cores)")
    axes[1].set_xlabel("env steps")
    axes[1].set_xscale("log")
    axes[1].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ticks = [m * 10**e for e in range(3, 8) for m in (1, 2, 5)]
    low, high = axes[1].get_xlim()
    axes[1].set_xticks([t for t in ticks if low <= t <= high],
                       [f"{t / 1000:g}k" for t in ticks if low <= t <= high])
    axes[0].set_ylabel("deterministic evaluation return")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"{task}: off-policy learning against the wall clock")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="halfcheetah", help="registry name (default: halfcheetah)")
    p.add_argument("--minutes", type=float, default=10.0, help="training minutes of each")
    p.add_argument("--contestants", nargs="+", default=[*OURS, *PEERS],
                   choices=[*OURS, *PEERS])
    p.add_argument("--overrides", nargs="*", default=[], metavar="KEY=VALUE",
                   help="extra `robotrl train` overrides for ours")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--eval-every", type=float, default=60.0,
                   help="seconds of training between evaluations")
    p.add_argument("--torch-threads", type=int, default=2)
    p.add_argument("--runs", default="runs/bench/offpolicy_wallclock", help="run directories")
    p.add_argument("--out", help="the JSON of every figure (default: benchmarks/figures/"
                   "offpolicy_<task>_<minutes>min.json)")
    p.add_argument("--plot", metavar="PNG", help="draw the curves (minutes and steps) to PNG")
    p.add_argument("--replot", metavar="JSON", help="only draw --plot from an earlier --out")
    args = p.parse_args(argv)
    args.out = args.out or f"benchmarks/figures/offpolicy_{args.task}_{args.minutes:g}min.json"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replot:
        import json

        if not args.plot:
            raise SystemExit("--replot needs --plot PNG (where to draw the figure)")
        figure(json.loads(Path(args.replot).read_text())["runs"], args.task, args.plot)
        return 0
    torch.set_num_threads(args.torch_threads)
    console = Console(width=max(Console().width, 100))
    console.print(banner(f"off-policy wall clock: {args.task}", f"{args.minutes:g} min each, "
                         f"seed {args.seed}, {args.torch_threads} torch threads", sb3=True))
    runs: dict[str, dict[str, Any]] = {}
    for name in args.contestants:
        t0 = time.perf_counter()
        if name in OURS:
            extra = [*OURS[name], f"torch_threads={args.torch_threads}", *args.overrides]
            runs[name] = ours_wallclock(args.task, args.minutes,
                                        f"{name}_{args.task}_{args.minutes:g}min", extra, args,
                                        console)
        else:
            runs[name] = sb3_wallclock(name, args, console)
        runs[name]["wall_s"] = time.perf_counter() - t0
    marks = sorted({m for m in (1, 2, 5, 10, 20, 30) if m <= args.minutes + 1e-9})
    table = Table(title=f"{args.task}: best deterministic evaluation within the minutes of "
                        "training (env steps at the end)")
    table.add_column("contestant")
    for m in marks:
        table.add_column(f"{m} min", justify="right")
    table.add_column("env steps", justify="right")
    for name, run in runs.items():
        table.add_row(name, *(f"{best_within(run['curve'], m):.0f}" for m in marks),
                      f"{run['steps']:,}")
    console.print(table)
    checks = []
    for minutes, target in TARGETS.get(args.task, ()):
        if args.minutes + 1e-9 < minutes:
            continue
        ours = {n: best_within(runs[n]["curve"], minutes) for n in runs if n in OURS}
        if ours:
            best = max(ours, key=ours.get)
            checks.append(check(f"{args.task}: best of ours ({best}) >= {target:g} within "
                                f"{minutes} min", ours[best], ours[best] >= target))
    for name in runs:
        if name in OURS:
            for peer in (p for p in runs if p in PEERS):
                gap = best_within(runs[name]["curve"], args.minutes) - best_within(
                    runs[peer]["curve"], args.minutes)
                checks.append(check(f"{name} >= {peer} within {args.minutes:g} min",
                                    round(gap, 1), gap >= 0))
    print_checks(console, checks, lambda c: f" ({c['value']})")
    write_json(args.out, {"meta": machine_meta(sb3=True), "args": vars(args), "runs": runs,
                          "checks": checks}, console)
    if args.plot:
        figure(runs, args.task, args.plot)
        console.print(f"figure written to {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
