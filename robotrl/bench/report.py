"""The offline benchmark's report: tables, statistics and figures from the runs' raw scores.

``summarize(runs, ...)`` computes every number the report shows from the list of run records
(``robotrl offline-bench`` writes them, with that summary, to ``results.json``), so anyone can
recompute the tables from the JSON alone: ``summarize(json.load(f)["runs"], ...)``.

- Per dataset: mean normalized score over seeds with a Student-t 95% CI, last (final
  evaluation) and best (best periodic evaluation), as CORL reports both.
- Over datasets (``robotrl.stats``, scores / 100 so the expert is 1): IQM, mean, median and
  optimality gap with stratified-bootstrap 95% CIs; probability of improvement for every pair;
  run-score distributions (performance profiles). Only algorithms with every (dataset, seed)
  run finished enter the aggregates (the bootstrap needs the full matrix).
- Off-policy evaluation: FQE estimate against the simulator's discounted value, run by run;
  Spearman rank correlation across runs and the median absolute and relative error.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from robotrl import stats

TAUS = np.linspace(0.0, 1.2, 61)
"""Normalized-score thresholds (/100) of the performance profiles."""


def _matrix(runs: list[dict[str, Any]], algo: str, datasets: list[str], seeds: int,
            key: str) -> np.ndarray | None:
    """``[seeds, datasets]`` scores / 100 of ``algo``, or None if a run is missing."""
    table = {(r["dataset"], r["seed"]): r[key] for r in runs
             if r["algo"] == algo and key in r}
    if any((d, s) not in table for d in datasets for s in range(seeds)):
        return None
    return np.array([[table[(d, s)] / 100.0 for d in datasets] for s in range(seeds)])


def summarize(runs: list[dict[str, Any]], algos: list[str], datasets: list[str], seeds: int,
              reps: int = 50_000) -> dict[str, Any]:
    """Every number of the report (see the module docstring); bootstrap seeds are fixed, so the
    same runs always give the same summary."""
    done = [r for r in runs if "final" in r]
    out: dict[str, Any] = {"per_dataset": {}, "aggregates": {}, "improvement": {},
                           "profiles": {}, "complete": [], "missing": []}
    for d in datasets:
        for a in algos:
            rs = [r for r in done if r["dataset"] == d and r["algo"] == a]
            if rs:
                out["per_dataset"][f"{d}|{a}"] = {
                    k: stats.mean_interval([r[k] for r in rs]) for k in ("final", "best")} | {
                    "seeds": len(rs)}
    out["missing"] = [f"{r['algo']} {r['dataset']} s{r['seed']}: {r['missing']}"
                      for r in runs if "missing" in r]
    for key in ("final", "best"):
        mats = {a: m for a in algos if (m := _matrix(done, a, datasets, seeds, key)) is not None}
        if key == "final":
            out["complete"] = list(mats)
        out["aggregates"][key] = {
            name: stats.interval_estimates(mats, f, reps=reps)
            for name, f in stats.AGGREGATES.items()} if mats else {}
        names = list(mats)
        pairs = [(x, y) for i, x in enumerate(names) for y in names[i + 1:]]
        out["improvement"][key] = {f"{x}>{y}": v for (x, y), v in
                                   stats.improvement_estimates(mats, pairs).items()}
        out["profiles"][key] = {a: [c.tolist() for c in v] for a, v in
                                stats.performance_profiles(mats, TAUS).items()}
    out["ope"] = ope_summary(done)
    out["seconds"] = {a: sum(r.get("train_seconds", 0.0) + r.get("ope", {}).get("seconds", 0.0)
                             for r in done if r["algo"] == a) for a in algos}
    return out


def ope_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """FQE against the simulator over the runs that have both."""
    with_ope = [r for r in runs if "ope" in r]
    if len(with_ope) < 2:
        return {"runs": len(with_ope)}
    from scipy.stats import spearmanr

    est, sim, final = (np.array([r["ope"]["estimate"] for r in with_ope]),
                       np.array([r["ope"]["simulated"] for r in with_ope]),
                       np.array([r["final"] for r in with_ope]))
    err = np.abs(est - sim)
    # choosing among policies trained on the same data is what OPE is for: rank within a dataset
    within = []
    for d in sorted({r["dataset"] for r in with_ope}):
        idx = [i for i, r in enumerate(with_ope) if r["dataset"] == d]
        if len(idx) >= 3 and np.ptp(est[idx]) > 0 and np.ptp(sim[idx]) > 0:
            within.append(float(spearmanr(est[idx], sim[idx]).statistic))
    return {"runs": len(with_ope),
            "spearman": float(spearmanr(est, sim).statistic),
            "spearman_within_dataset": float(np.mean(within)) if within else float("nan"),
            "datasets_ranked": len(within),
            "spearman_vs_final_score": float(spearmanr(est, final).statistic),
            "median_abs_error": float(np.median(err)),
            "median_rel_error": float(np.median(err / np.maximum(np.abs(sim), 1e-8)))}


# ------------------------------------------------------------------------------ markdown
def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.2f} h"


def _ci(v: tuple[float, float, float] | list[float], scale: float = 1.0) -> str:
    m, lo, hi = (x * scale for x in v)
    return f"{m:.1f} [{lo:.1f}, {hi:.1f}]"


def markdown(summary: dict[str, Any], settings: dict[str, Any], figures: list[str]) -> str:
    job = settings["job"]
    algos, datasets = settings["algos"], settings["datasets"]
    lines = [f"# Offline benchmark: {len(algos)} algorithms x {len(datasets)} datasets x "
             f"{settings['seeds']} seeds", "",
             f"{job.updates:,} gradient updates per run, evaluated every {job.eval_every:,} on "
             f"{job.episodes} simulator episodes. Normalized score: 100 = the dataset card's "
             "expert return, 0 = uniform random. Cells: mean over seeds [95% CI, Student t]; "
             "(n=k): only k seeds finished.",
             ""]
    for key, title in (("final", "Last (final evaluation)"), ("best", "Best (best evaluation)")):
        lines += [f"## {title}", "", "| dataset | " + " | ".join(algos) + " |",
                  "|---|" + "---:|" * len(algos)]
        for d in datasets:
            cells = [(_ci(c[key]) + (f" (n={c['seeds']})" if c["seeds"] < settings["seeds"]
                                     else "")
                      if (c := summary["per_dataset"].get(f"{d}|{a}")) else "—") for a in algos]
            lines.append(f"| {d} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Aggregates over datasets", "",
              "Stratified bootstrap 95% CIs (runs resampled within each dataset); "
              "optimality gap: lower is better. Algorithms with every run finished: "
              f"{', '.join(summary['complete']) or 'none'}.", ""]
    for key in ("final", "best"):
        aggs = summary["aggregates"].get(key) or {}
        if not aggs:
            continue
        names = list(stats.AGGREGATES)
        lines += [f"**{key}**", "", "| algorithm | " + " | ".join(names) + " |",
                  "|---|" + "---:|" * len(names)]
        for a in summary["complete"]:
            lines.append(f"| {a} | " + " | ".join(_ci(aggs[n][a], 100) for n in names) + " |")
        lines.append("")
    imp = summary["improvement"].get("final") or {}
    if imp:
        lines += ["## Probability of improvement (final scores)", "",
                  "P(X > Y): the chance a run of X beats a run of Y on a random dataset "
                  "(>0.5: X better), bootstrap 95% CI.", "", "| X > Y | P | CI |", "|---|---:|---|"]
        lines += [f"| {k.replace('>', ' > ')} | {v[0]:.2f} | [{v[1]:.2f}, {v[2]:.2f}] |"
                  for k, v in imp.items()]
        lines.append("")
    ope = summary["ope"]
    if ope.get("runs", 0) >= 2:
        lines += ["## Off-policy evaluation (fitted Q evaluation)", "",
                  f"FQE ({job.ope_updates:,} updates, gamma {job.gamma}) from the dataset alone "
                  f"against the simulator's discounted return of the same final policy, over "
                  f"{ope['runs']} runs: Spearman rank correlation **{ope['spearman']:.2f}** "
                  f"across all runs, **{ope['spearman_within_dataset']:.2f}** on average "
                  f"among the runs of one dataset ({ope['datasets_ranked']} datasets; what "
                  f"choosing a policy for one dataset needs), "
                  f"{ope['spearman_vs_final_score']:.2f} with the final normalized score; "
                  f"median absolute error {ope['median_abs_error']:.1f} "
                  f"({100 * ope['median_rel_error']:.0f}% of the simulated value).", ""]
    secs = summary["seconds"]
    total = sum(secs.values())
    lines += ["## Wall clock", "", f"Summed over runs (training + FQE): {_duration(total)}; "
              + ", ".join(f"{a} {s / 60:.0f} min" for a, s in secs.items()) + "."]
    if settings.get("sweep_seconds"):
        wall = settings["sweep_seconds"]
        lines[-1] += (f" This invocation's sweep took {_duration(wall)} with launcher "
                      f"{settings['launcher']}" + (f" ({settings['jobs']} processes)"
                                                   if settings["launcher"] == "joblib" else "")
                      + " (reused runs count in the sum, not here).")
    lines.append("")
    if summary["missing"]:
        lines += ["## Missing runs", "", *[f"- {m}" for m in summary["missing"]], ""]
    lines += [f"![{Path(f).stem}](figures/{Path(f).name})" for f in figures]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ figures
def figures(summary: dict[str, Any], runs: list[dict[str, Any]], settings: dict[str, Any],
            folder: Path) -> list[str]:
    """Aggregate intervals, performance profiles, learning curves and the OPE scatter as PNGs;
    none (with a note) when matplotlib (the ``dev`` or ``plot`` extra) is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no figures: matplotlib is missing (pip install 'robotrl[plot]')")
        return []
    from robotrl.checkpoint import atomic_open

    folder.mkdir(parents=True, exist_ok=True)
    colors = {a: plt.get_cmap("tab10")(i % 10) for i, a in enumerate(settings["algos"])}
    written = []

    def save(fig: Any, name: str) -> None:
        path = folder / name
        with atomic_open(path, "wb") as f:
            fig.savefig(f, format="png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(str(path))

    aggs = summary["aggregates"].get("final") or {}
    if aggs:
        fig, axes = plt.subplots(1, 4, figsize=(14, 0.5 * len(summary["complete"]) + 1.5),
                                 sharey=True)
        for ax, (name, est) in zip(axes, aggs.items(), strict=True):
            for i, a in enumerate(summary["complete"]):
                m, lo, hi = (100 * x for x in est[a])
                ax.barh(i, hi - lo, left=lo, height=0.6, color=colors[a], alpha=0.75)
                ax.plot([m, m], [i - 0.3, i + 0.3], color="k", lw=1.5)
            ax.set_title(name)
            ax.set_xlabel("normalized score")
            ax.grid(axis="x", alpha=0.3)
        axes[0].set_yticks(range(len(summary["complete"])), summary["complete"])
        fig.suptitle("Final scores over datasets: point estimate and stratified-bootstrap 95% CI",
                     y=1.04)
        save(fig, "aggregates.png")
        fig, ax = plt.subplots(figsize=(6, 4))
        for a, (curve, lo, hi) in summary["profiles"]["final"].items():
            ax.plot(100 * TAUS, curve, color=colors[a], label=a)
            ax.fill_between(100 * TAUS, lo, hi, color=colors[a], alpha=0.2)
        ax.set_xlabel("normalized score τ")
        ax.set_ylabel("fraction of runs with score > τ")
        ax.set_title("Performance profiles (final scores)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        save(fig, "profiles.png")
    datasets = settings["datasets"]
    cols = min(4, len(datasets))
    rows = -(-len(datasets) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False)
    for ax in axes.flat[len(datasets):]:
        ax.set_visible(False)
    for ax, d in zip(axes.flat, datasets, strict=False):
        for a in settings["algos"]:
            curves = [r["curve"] for r in runs if "curve" in r and r["dataset"] == d
                      and r["algo"] == a]
            if not curves:
                continue
            n = min(len(c["score"]) for c in curves)
            y = np.array([c["score"][:n] for c in curves])
            x = curves[0]["steps"][:n]
            ax.plot(x, y.mean(0), color=colors[a], label=a)
            ax.fill_between(x, y.min(0), y.max(0), color=colors[a], alpha=0.15)
        ax.set_title(d.split("/", 1)[-1], fontsize=9)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    fig.supxlabel("gradient updates")
    fig.supylabel("normalized score (mean, min-max over seeds)")
    save(fig, "curves.png")
    ope = [(r["ope"]["simulated"], r["ope"]["estimate"], r["algo"]) for r in runs if "ope" in r]
    if ope:
        fig, ax = plt.subplots(figsize=(5, 4.5))
        for a in settings["algos"]:
            pts = np.array([(s, e) for s, e, al in ope if al == a])
            if len(pts):
                ax.scatter(pts[:, 0], pts[:, 1], s=14, color=colors[a], label=a)
        lim = [min(min(p[:2]) for p in ope), max(max(p[:2]) for p in ope)]
        ax.plot(lim, lim, "k--", lw=1)
        ax.set_xlabel("simulated discounted return")
        ax.set_ylabel("FQE estimate from the dataset")
        ax.set_title(f"Off-policy evaluation (Spearman {summary['ope'].get('spearman', math.nan):.2f})")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        save(fig, "ope.png")
    return written


def write_report(runs: list[dict[str, Any]], settings: dict[str, Any], out: Path) -> dict[str, Any]:
    """``results.json`` (every run + the summary), ``report.md`` and ``figures/``; prints the
    report. Returns the summary."""
    import dataclasses

    from robotrl.checkpoint import atomic_open, write_json

    summary = summarize(runs, settings["algos"], settings["datasets"], settings["seeds"],
                        settings.get("reps", 50_000))
    out.mkdir(parents=True, exist_ok=True)
    meta = {k: v for k, v in settings.items() if k != "job"}
    meta["job"] = dataclasses.asdict(settings["job"])
    write_json(out / "results.json", {"settings": meta, "runs": runs, "summary": summary}, indent=1)
    figs = figures(summary, runs, settings, out / "figures")
    text = markdown(summary, settings, figs)
    with atomic_open(out / "report.md", "w") as f:
        f.write(text)
    print(text)
    print(f"wrote {out / 'report.md'}, {out / 'results.json'} and {len(figs)} figures")
    return summary
