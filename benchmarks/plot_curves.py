"""Evaluation return against wall-clock minutes, ours next to SB3, from TensorBoard event dirs.

    python benchmarks/plot_curves.py --runs benchmarks/results --out benchmarks/results/curves.png
    python benchmarks/plot_curves.py --runs runs/hopper benchmarks/results/sb3_hopper --x steps
    python benchmarks/plot_curves.py --runs benchmarks/results --rollout   # + training returns

A run is a directory holding ``events.out.tfevents.*`` files; each ``--runs`` path is a run or a
folder searched for runs. Its task is ``env.task`` of its ``config.yaml`` (robotrl runs), else
read from a ``ours_<task>``, ``ours_<task>_long`` or ``sb3_<task>`` directory name
(``ppo_vs_sb3.py --mode wallclock``). Runs without ``eval/return`` are skipped.

Time is the events' wall time relative to the run's first scalar event. ``ppo_vs_sb3.py``
writes its evaluations with ``walltime = start + training seconds``, so there it is training
time with evaluation time left out; ours' ``rollout/return`` (written by the runner) is on the
plain wall clock, which runs ahead of it by the evaluation time so far.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

NAME = re.compile(r"^(?P<who>ours|sb3)_(?P<task>.+?)(?P<long>_long)?$")
"""Run directory names ppo_vs_sb3.py writes."""
STYLE = {"ours": ("tab:blue", "ours"), "ours_long": ("tab:green", "ours (long run)"),
         "sb3": ("tab:orange", "SB3 (rl-zoo)")}
"""Contestant -> (colour, legend label)."""


@dataclass
class Series:
    """One scalar tag of a run: x in minutes since the run's first event, and env steps."""

    minutes: list[float] = field(default_factory=list)
    """[K] wall time relative to the run's first scalar event, in minutes."""
    steps: list[int] = field(default_factory=list)
    """[K] env steps."""
    values: list[float] = field(default_factory=list)
    """[K] the scalar."""


@dataclass
class Run:
    """A run directory's curves."""

    path: Path
    """The directory."""
    task: str
    """Task name (the subplot it goes in)."""
    who: str
    """Key of STYLE, or the directory name for runs of another kind."""
    curves: dict[str, Series]
    """Tag -> series, for ``eval/return`` and ``rollout/return``."""


def find_runs(paths: list[Path]) -> list[Path]:
    """Every directory under ``paths`` (or one of them) that directly holds event files."""
    dirs: set[Path] = set()
    for path in paths:
        if not path.exists():
            raise SystemExit(f"no such file or directory: {path}")
        dirs |= {f.parent for f in path.rglob("events.out.tfevents.*")}
    return sorted(dirs)


def task_and_who(path: Path) -> tuple[str, str] | None:
    """(task, contestant) of a run directory; None if neither its config nor its name tells."""
    match = NAME.match(path.name)
    config = path / "config.yaml"
    task = None
    if config.exists():
        from omegaconf import OmegaConf

        task = OmegaConf.load(config).get("env", {}).get("task")
    if match is None:
        return (str(task), path.name) if task else None
    who = "sb3" if match["who"] == "sb3" else "ours_long" if match["long"] else "ours"
    return str(task or match["task"]), who


def read_run(path: Path, tags: tuple[str, ...]) -> dict[str, Series]:
    """The ``tags`` of a run; x relative to the first scalar event of any tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0}, purge_orphaned_data=False)
    acc.Reload()
    present = acc.Tags()["scalars"]
    if not present:
        return {}
    first = min(min(e.wall_time for e in acc.Scalars(t)) for t in present)
    out = {}
    for tag in tags:
        if tag in present:
            events = sorted(acc.Scalars(tag), key=lambda e: (e.step, e.wall_time))
            out[tag] = Series([(e.wall_time - first) / 60 for e in events],
                              [e.step for e in events], [e.value for e in events])
    return out


def load(paths: list[Path], rollout: bool) -> list[Run]:
    tags = ("eval/return", "rollout/return") if rollout else ("eval/return",)
    runs = []
    for path in find_runs(paths):
        ident = task_and_who(path)
        if ident is None:
            print(f"skip {path}: no config.yaml and not an ours_/sb3_<task> directory")
            continue
        curves = read_run(path, tags)
        if "eval/return" not in curves:
            print(f"skip {path}: no eval/return scalars")
            continue
        runs.append(Run(path, ident[0], ident[1], curves))
    return runs


def plot(runs: list[Run], out: Path, x: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r.task for r in runs})
    cols = min(3, len(tasks))
    rows = -(-len(tasks) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4.0 * rows), squeeze=False)
    for ax, task in zip(axes.flat, tasks, strict=False):
        for run in sorted((r for r in runs if r.task == task), key=lambda r: r.who):
            colour, label = STYLE.get(run.who, (None, run.who))
            ev = run.curves["eval/return"]
            xs = ev.minutes if x == "minutes" else ev.steps
            line, = ax.plot(xs, ev.values, marker="o", markersize=3, color=colour, label=label)
            if "rollout/return" in run.curves:
                tr = run.curves["rollout/return"]
                ax.plot(tr.minutes if x == "minutes" else tr.steps, tr.values, linestyle="--",
                        linewidth=0.8, alpha=0.6, color=line.get_color(),
                        label=f"{label}, training episodes")
        ax.set_title(task)
        ax.set_xlabel("training wall-clock minutes" if x == "minutes" else "env steps")
        ax.set_ylabel("episode return (eval: deterministic)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(tasks):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", nargs="+", type=Path, default=[Path("benchmarks/results")],
                   help="run directories, or folders searched for them (default: benchmarks/results)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/curves.png"),
                   help="PNG to write (default: benchmarks/results/curves.png)")
    p.add_argument("--x", choices=("minutes", "steps"), default="minutes",
                   help="x axis: wall-clock minutes (default) or env steps")
    p.add_argument("--rollout", action="store_true",
                   help="also draw rollout/return (mean return of recent training episodes)")
    p.add_argument("--title", default="PPO: robotrl vs Stable-Baselines3")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = load(args.runs, args.rollout)
    if not runs:
        print("no runs with eval/return found", file=sys.stderr)
        return 1
    for r in runs:
        ev = r.curves["eval/return"]
        print(f"{r.task:<12} {r.who:<10} {len(ev.values):>3} evals over {ev.minutes[-1]:6.2f} min, "
              f"{ev.steps[-1]:>10,} steps: last {ev.values[-1]:8.1f}, best {max(ev.values):8.1f}"
              f"  ({r.path})")
    plot(runs, args.out, args.x, args.title)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
