"""Offline learning table: every algorithm on every dataset through ``robotrl train``, final and
best normalized scores, the issue's targets checked; writes a markdown table and a figure.

    python benchmarks/offline_learning.py --datasets robotrl/hopper/medium-v0 \\
        robotrl/hopper/expert-v0 --algos bc td3bc iql rebrac --updates 20000 --seeds 0
    python benchmarks/offline_learning.py ... --report          # table and figure only

Datasets are Minari ids under ``MINARI_DATASETS_PATH`` (or directories, or .hdf5 files), made
with ``robotrl dataset collect``. Every (algorithm, dataset, seed) is an ordinary run directory
under ``--out`` (inspect, resume, eval or export any of them); a finished run (its
``result.json``) is reused. ``final`` is the normalized score of the evaluation at the end
(last.pt), ``best`` the best periodic one (best.pt; CORL reports both because they differ a
lot). Targets (issue 12): TD3+BC, IQL and ReBRAC beat BC by >= 10 normalized points on every
medium and medium-replay dataset; every algorithm reaches >= 90 on expert datasets.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import train_subprocess
from plot_curves import read_run

from robotrl.checkpoint import atomic_open

BEAT_BC = ("td3bc", "iql", "rebrac")
"""Algorithms that must beat BC by ``MARGIN`` on medium and medium-replay data."""
MARGIN = 10.0
EXPERT_TARGET = 90.0


def kind_of(dataset: str) -> str:
    """``robotrl/hopper/medium-replay-v0`` -> ``medium-replay``."""
    name = Path(dataset).name.split("-v")[0]
    return name.removesuffix(".hdf5")


def run_one(algo: str, dataset: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Train one (algorithm, dataset, seed) with ``robotrl train`` or reuse its result."""
    run = args.out / dataset.replace("/", "_") / algo / f"s{seed}"
    done = run / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    wall, failed = train_subprocess(
        [f"algo={algo}", f"dataset={dataset}", f"seed={seed}", f"total_steps={args.updates}",
         f"eval_interval={args.eval_interval}", f"eval_episodes={args.episodes}",
         f"torch_threads={args.threads}", "logger.progress=false", *args.extra],
        run, f"{algo} {dataset} s{seed}")
    if failed is not None:
        return {"algo": algo, "dataset": dataset, "seed": seed, "failed": failed}
    ev = read_run(run, ("eval/normalized_score",))["eval/normalized_score"]
    result = {"algo": algo, "dataset": dataset, "seed": seed, "final": ev.values[-1],
              "best": max(ev.values), "updates": ev.steps[-1], "wall_s": wall,
              "curve": [ev.steps, ev.values]}
    with atomic_open(done, "w") as f:
        json.dump(result, f)
    print(f"{algo:10s} {dataset:32s} s{seed}: final {result['final']:6.1f}  best "
          f"{result['best']:6.1f}  {wall / 60:.1f} min", flush=True)
    return result


def mean(xs: list[float]) -> float:
    return statistics.mean(xs) if xs else float("nan")


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Markdown table (stdout and ``--md``) and the curves (``--png``)."""
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        if "failed" not in r:
            cells.setdefault((r["dataset"], r["algo"]), []).append(r)
    lines = [f"Normalized scores (100 = the expert checkpoint's return, 0 = uniform random), "
             f"{args.updates:,} updates, seeds {args.seeds}, {args.episodes} evaluation episodes; "
             "final (last.pt) / best (best.pt).", "",
             "| dataset | " + " | ".join(args.algos) + " | targets |",
             "|---|" + "---:|" * len(args.algos) + "---|"]
    for dataset in args.datasets:
        row, notes = [], []
        final = {a: mean([r["final"] for r in cells.get((dataset, a), [])]) for a in args.algos}
        for algo in args.algos:
            rs = cells.get((dataset, algo), [])
            row.append(f"{final[algo]:.1f} / {mean([r['best'] for r in rs]):.1f}" if rs
                       else "not run")
        kind = kind_of(dataset)
        if kind in ("medium", "medium-replay") and "bc" in final:
            for algo in BEAT_BC:
                if algo in final and not math.isnan(final[algo]):
                    ok = final[algo] >= final["bc"] + MARGIN
                    notes.append(f"{algo} {'✅' if ok else '❌'} {final[algo] - final['bc']:+.1f} vs BC")
        if kind == "expert":
            for algo in [a for a in args.algos if not math.isnan(final[a])]:
                ok = final[algo] >= EXPERT_TARGET
                notes.append(f"{algo} {'✅' if ok else '❌'}")
        lines.append(f"| {dataset} | " + " | ".join(row) + f" | {'; '.join(notes)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    with atomic_open(args.md, "w") as f:
        f.write(text)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no figure: matplotlib is in the dev extra")
        return
    n = len(args.datasets)
    cols = min(3, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    for ax, dataset in zip(axes.flat, args.datasets, strict=False):
        for algo in args.algos:
            for i, r in enumerate(cells.get((dataset, algo), [])):
                steps, values = r["curve"]
                ax.plot([s / 1e3 for s in steps], values, marker=".", alpha=0.8,
                        color=f"C{args.algos.index(algo)}", label=algo if i == 0 else None)
        ax.set_title(dataset, fontsize=9)
        ax.set_xlabel("gradient updates (k)")
        ax.set_ylabel("normalized score")
        ax.axhline(100, color="grey", lw=0.6, ls=":")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"robotrl train algo=X dataset=D, {args.updates:,} updates (one line per seed)")
    fig.tight_layout()
    with atomic_open(args.png, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    print(f"wrote {args.md} and {args.png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="+", required=True)
    parser.add_argument("--algos", nargs="+", default=["bc", "td3bc", "iql", "rebrac"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--updates", type=int, default=20_000)
    parser.add_argument("--eval-interval", type=int, default=5, help="iterations of 1000 updates")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2, help="runs at once")
    parser.add_argument("--out", type=Path, default=Path("runs/offline_learning"))
    parser.add_argument("--md", type=Path, default=Path("benchmarks/offline_learning.md"))
    parser.add_argument("--png", type=Path, default=Path("benchmarks/figures/offline_learning.png"))
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides for every run")
    parser.add_argument("--report", action="store_true", help="only tabulate finished runs")
    args = parser.parse_args()
    jobs = [(a, d, s) for d in args.datasets for a in args.algos for s in args.seeds]
    if args.report:
        results = [json.loads(p.read_text()) for a, d, s in jobs
                   if (p := args.out / d.replace("/", "_") / a / f"s{s}" / "result.json").exists()]
    else:
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda job: run_one(*job, args), jobs))
    report(results, args)


if __name__ == "__main__":
    main()
