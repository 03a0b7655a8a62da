"""Issue 47's data-efficiency figure: GRPO's test-success curves from BC on few demonstrations
against from 8x as many (each curve starts at step 0 with its BC policy), drawn from the two
grids' committed results files, mean and 95% Student-t interval over seeds.

    robotrl bench run benchmarks/grids/vla_grpo_reach_16demos.yaml
    robotrl bench run benchmarks/grids/vla_grpo_reach_128demos.yaml
    python benchmarks/vla_data_efficiency.py    # -> benchmarks/figures/vla/data_efficiency.png
"""

from __future__ import annotations

import argparse

from robotrl.bench.grid import load_grid
from robotrl.bench.harness import committed_records
from robotrl.bench.plot import Line, draw_panels
from robotrl.stats import mean_interval


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grids", nargs="+", default=["benchmarks/grids/vla_grpo_reach_16demos.yaml",
                                                  "benchmarks/grids/vla_grpo_reach_128demos.yaml"])
    p.add_argument("--out", default="benchmarks/figures/vla/data_efficiency.png")
    p.add_argument("--title", default="tabletop reach: test states")
    args = p.parse_args()
    lines = []
    for path in args.grids:
        grid = load_grid(path)
        done = [r for r in committed_records(grid) if "final" in r]
        if not done:
            raise SystemExit(f"{path}: no finished cell in {grid.results_path}")
        stage = next(iter(grid.init.values()))
        n = min(len(r["curve"]["steps"]) for r in done)
        steps = done[0]["curve"]["steps"][:n]
        label = f"{grid.name}: BC ({stage.budget:,} updates), then GRPO"
        lines.append(Line(f"{label}, {len(done)} seeds", [float(s) for s in steps],
                          [mean_interval([r["curve"]["score"][i] for r in done])
                           for i in range(n)]))
        before = mean_interval([r["init"]["before"][grid.metric] for r in done])
        after = mean_interval([r["final"] for r in done])
        print(f"{grid.name}: {grid.metric} {before[0]:.3f} [{before[1]:.3f}, {before[2]:.3f}] "
              f"-> {after[0]:.3f} [{after[1]:.3f}, {after[2]:.3f}] over {len(done)} seeds")
    out = draw_panels({args.title: lines}, "GRPO env steps (0: the BC policy)",
                      args.out, ylabel="success (mean, 95% interval over seeds)", cols=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
