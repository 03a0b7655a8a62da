"""Learning curves of velocity-tracking runs against the wall clock, from their TensorBoard
scalars: the linear and yaw-rate tracking rewards as fractions of their maxima, and the
episode length.

    python benchmarks/robot_curves.py RUN [RUN ...] --labels A B --out benchmarks/figures/robots.png

A tracking term is ``weight * dt * exp(-error^2 / sigma)`` per step (``envs/tasks/velocity.py``),
so dividing by ``weight * dt`` (read from the run's config) gives the mean of
``exp(-error^2 / sigma)`` over the training worlds: 1 is perfect tracking; a robot that stands
still scores about 0.4 (linear) and 0.45 (yaw) on the default command ranges. The x axis is
training time: the points' wall-clock times, pauses between a run and its resume left out.
"""

from __future__ import annotations

import argparse
import glob
from pathlib import Path

import yaml


def scalars(run: Path) -> dict[str, list[tuple[int, float, float]]]:
    """tag -> [(step, training seconds, value)]. A resumed run writes a second events file: its
    time continues from where the first file's ended (the pause between them is not training),
    and its points replace the first file's from its first step on."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float, float]]] = {}
    offset = 0.0
    for f in sorted(glob.glob(str(run / "events*"))):  # the names start with a timestamp
        acc = EventAccumulator(f, size_guidance={"scalars": 0})
        acc.Reload()
        tags = acc.Tags()["scalars"]
        points = {tag: acc.Scalars(tag) for tag in tags}
        times = [e.wall_time for tag in tags for e in points[tag]]
        if not times:
            continue
        start, end = min(times), max(times)
        for tag in tags:
            new = [(e.step, offset + e.wall_time - start, e.value) for e in points[tag]]
            first = min(s for s, _, _ in new)
            out[tag] = [p for p in out.get(tag, []) if p[0] < first] + new
        offset += end - start
    return {k: sorted(v) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--labels", nargs="*")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/figures/robots.png"))
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = args.labels or [r.name for r in args.runs]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for run, label in zip(args.runs, labels, strict=True):
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        options = (cfg.get("env") or {}).get("options") or {}
        dt = 0.02
        data = scalars(run)
        for ax, tag, weight in ((axes[0], "reward/tracking_lin_vel",
                                 options.get("tracking_lin_vel", 1.0)),
                                (axes[1], "reward/tracking_ang_vel",
                                 options.get("tracking_ang_vel", 0.5))):
            pts = data.get(tag, [])
            ax.plot([t / 60 for _, t, _ in pts], [v / (weight * dt) for _, _, v in pts],
                    label=label, lw=1)
        pts = data.get("rollout/length", [])
        axes[2].plot([t / 60 for _, t, _ in pts], [v for _, _, v in pts], label=label, lw=1)
    for ax, title in zip(axes, ("linear tracking, exp(-err²/σ)", "yaw tracking, exp(-err²/σ)",
                                "episode length (steps, 1000 max)"), strict=True):
        ax.set_xlabel("minutes (2-core CPU)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"figure written to {args.out}")


if __name__ == "__main__":
    main()
