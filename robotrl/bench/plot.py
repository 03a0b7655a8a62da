"""Learning curves from run directories: each curve the mean over a group of runs (the seeds of
one configuration) with a 95% Student-t interval (``robotrl.stats.mean_interval``), against
environment steps (updates for offline runs) or wall-clock minutes, one panel per metric.

    curves = load_curves(["runs/sac3", "runs/td3"], ["return_mean"], x="steps")
    plot_curves(curves, ["return_mean"], "steps", "curves.png")

A path is a run directory (it holds ``config.yaml``) or a folder searched for them. Runs named
``s<seed>`` (``num_seeds`` and benchmark grids lay seeds out so) are grouped by their parent;
any other run is a group of one. Within a group the evaluations are aligned by their order (the
seeds of one configuration evaluate at the same steps), up to the shortest run.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from robotrl.stats import mean_interval

X_AXES = ("steps", "minutes")
"""What the curves can be drawn against."""
FORMATS = (".png", ".svg", ".pdf")
"""Figure files ``plot_curves`` writes (by the output's extension)."""
NOT_METRICS = frozenset({"step", "seconds", "episodes"})
"""Evaluation fields that are not scores."""
SEED_DIR = re.compile(r"^s\d+$")


@dataclass
class Curve:
    """One group's curve of every metric."""

    label: str
    runs: list[Path]
    x: list[float] = field(default_factory=list)
    """Steps (the first run's) or minutes (the mean over runs) of each aligned evaluation."""
    y: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)
    """Metric -> (mean, low, high) over the runs at each x."""


def find_runs(paths: list[str]) -> list[Path]:
    """The run directories ``paths`` name or hold, in order, each once; ValueError for a path
    that is missing or holds none."""
    runs: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise ValueError(f"{raw}: no such run directory or folder")
        found = ([path] if (path / "config.yaml").is_file() else
                 sorted(p.parent for p in path.rglob("config.yaml")))
        if not found:
            raise ValueError(f"{raw}: no run directory in it (none holds config.yaml)")
        runs += [r for r in found if r not in runs]
    return runs


def _evaluations(run: Path) -> list[dict[str, Any]]:
    from robotrl.experiment import RunDir

    return RunDir(run).evaluations()


def _what(run: Path) -> str:
    """A run's algorithm and task, from its ``config.yaml`` ("ppo halfcheetah")."""
    config = yaml.safe_load((run / "config.yaml").read_text()) or {}
    algo, env = config.get("algo") or {}, config.get("env") or {}
    return " ".join(str(v) for v in (algo.get("name"), env.get("task")) if v) or run.name


def load_curves(paths: list[str], metrics: list[str], x: str = "steps") -> list[Curve]:
    """One ``Curve`` per group of the runs under ``paths``; ValueError for an unknown ``x``, a
    metric no run evaluated (naming those they did), or runs without evaluations."""
    if x not in X_AXES:
        raise ValueError(f"x={x!r}; allowed: {', '.join(X_AXES)}")
    groups: dict[Path, list[Path]] = {}
    for run in find_runs(paths):
        key = run.parent if SEED_DIR.match(run.name) else run
        groups.setdefault(key, []).append(run)
    common = Path(os.path.commonpath([str(k) for k in groups])) if len(groups) > 1 else None
    curves, seen = [], set()
    for key, runs in groups.items():
        pairs = [(r, e) for r in runs if (e := _evaluations(r))]
        if not pairs:  # none of the group has evaluated yet
            continue
        runs, evals = [r for r, _ in pairs], [e for _, e in pairs]
        for e in evals:
            seen.update(k for k in e[0] if k not in NOT_METRICS)
        n = min(len(e) for e in evals)
        # labels: the groups' paths past what they share (a lone group: its algorithm and task)
        label = (str(key.relative_to(common)) if common is not None and key != common
                 else _what(runs[0]))
        curve = Curve(label=label, runs=runs)
        for i in range(n):
            rows = [e[i] for e in evals]
            curve.x.append(float(rows[0]["step"]) if x == "steps" else
                           sum(float(r.get("seconds", 0.0)) for r in rows) / len(rows) / 60)
        for metric in metrics:
            if all(metric in e[0] for e in evals):
                curve.y[metric] = [mean_interval([e[i][metric] for e in evals])
                                   for i in range(n)]
        curves.append(curve)
    if not curves:
        raise ValueError(f"no evaluations in {', '.join(paths)}: the runs have not evaluated yet")
    missing = [m for m in metrics if not any(m in c.y for c in curves)]
    if missing:
        raise ValueError(f"no run evaluated {missing}; available metrics: {sorted(seen)}")
    return curves


@dataclass
class Line:
    """One curve of one panel: a label and (mean, low, high) at each x."""

    label: str
    x: list[float]
    y: list[tuple[float, float, float]]


def draw_panels(panels: dict[str, list[Line]], xlabel: str, out: str | Path,
                ylabel: str = "", cols: int = 4,
                levels: dict[str, list[tuple[str, float]]] | None = None) -> Path:
    """A figure of one panel per key of ``panels`` (its title), each line its mean with a shaded
    interval, one colour per label across panels, written to ``out`` (.png, .svg or .pdf)
    through a temporary file and a rename: what ``robotrl plot`` and the benchmark reports
    draw. ``levels``: title -> (label, score) drawn as a dashed line across that panel in the
    label's colour (a benchmark's thresholds). One legend names every label of every panel.
    Needs matplotlib (the ``plot`` extra)."""
    out = Path(out)
    if out.suffix.lower() not in FORMATS:
        raise ValueError(f"out={out}: the figure's extension must be one of {', '.join(FORMATS)}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("plotting needs matplotlib: pip install 'robotrl[plot]'") from None
    levels = levels or {}
    labels = list(dict.fromkeys([line.label for lines in panels.values() for line in lines]
                                + [label for marks in levels.values() for label, _ in marks]))
    colors = {label: plt.get_cmap("tab10")(i % 10) for i, label in enumerate(labels)}
    cols = max(1, min(cols, len(panels)))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False,
                             layout="constrained")  # room for the shared axis labels
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (title, lines) in zip(axes.flat, panels.items(), strict=False):
        for line in lines:
            mean, low, high = (list(v) for v in zip(*line.y, strict=True))
            ax.plot(line.x, mean, label=line.label, color=colors[line.label],
                    marker="o" if len(line.x) < 15 else None, markersize=3)
            ax.fill_between(line.x, low, high, color=colors[line.label], alpha=0.2, linewidth=0)
        for label, score in levels.get(title, []):
            ax.axhline(score, color=colors[label], linestyle="--", linewidth=1, alpha=0.8)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    handles = {label: handle for ax in axes.flat for handle, label in
               zip(*ax.get_legend_handles_labels(), strict=True)}
    if any(levels.values()):
        handles["threshold"] = plt.Line2D([], [], color="grey", linestyle="--", linewidth=1)
    if handles:
        axes.flat[0].legend(list(handles.values()), list(handles), fontsize=8)
    fig.supxlabel(xlabel)
    if ylabel:
        fig.supylabel(ylabel)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=out.suffix, dir=out.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
        os.replace(tmp, out)
    finally:
        plt.close(fig)
        Path(tmp).unlink(missing_ok=True)
    return out


def plot_curves(curves: list[Curve], metrics: list[str], x: str, out: str | Path) -> Path:
    """One panel per metric, a line and a shaded 95% interval per curve (``draw_panels``)."""
    panels = {metric: [Line(f"{c.label} (n={len(c.runs)})", c.x, c.y[metric])
                       for c in curves if metric in c.y] for metric in metrics}
    xlabel = "env steps (updates offline)" if x == "steps" else "wall-clock minutes"
    return draw_panels(panels, xlabel, out, cols=len(metrics))
