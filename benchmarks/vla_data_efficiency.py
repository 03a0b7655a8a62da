"""Issue 47's data-efficiency figure: GRPO's test-success curves from BC on few demonstrations
(each curve starts at step 0 with its BC policy) against BC alone from many, drawn from the
grids' committed results files, mean and 95% Student-t interval over seeds.

    robotrl bench run benchmarks/grids/vla_grpo_reach_16demos.yaml   # and 64demos, 128demos
    python benchmarks/vla_data_efficiency.py    # -> benchmarks/figures/vla/data_efficiency.png

The grids are BC from 16, 64, 128 and 256 demonstrations, then GRPO; BC alone from 512 (the
grounding study's records, same settings) is the flat line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from robotrl.bench.grid import load_grid
from robotrl.bench.harness import committed_records
from robotrl.bench.plot import Line, draw_panels
from robotrl.stats import mean_interval


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grids", nargs="+", default=[
        f"benchmarks/grids/vla_grpo_reach_{n}demos.yaml" for n in (16, 64, 128, 256)])
    p.add_argument("--out", default="benchmarks/figures/vla/data_efficiency.png")
    p.add_argument("--title", default="tabletop reach: test states")
    p.add_argument("--bc-reference", default="film_kpaux",
                   help="a tag of benchmarks/figures/vla/bc_grounding.json drawn as a flat line "
                        "(BC alone from its 512 demonstrations, same settings); '' : none")
    args = p.parse_args()
    lines = []
    for path in args.grids:
        grid = load_grid(path)
        done = [r for r in committed_records(grid) if "final" in r]
        if not done:
            raise SystemExit(f"{path}: no finished cell in {grid.results_path}")
        n = min(len(r["curve"]["steps"]) for r in done)
        steps = done[0]["curve"]["steps"][:n]
        demos = grid.name.rsplit("-", 1)[-1].replace("demos", " demos")
        lines.append(Line(f"{demos}: BC, then GRPO ({len(done)} seed{'s' * (len(done) > 1)})", [float(s) for s in steps],
                          [mean_interval([r["curve"]["score"][i] for r in done])
                           for i in range(n)]))
        before = mean_interval([r["init"]["before"][grid.metric] for r in done])
        after = mean_interval([r["final"] for r in done])
        print(f"{grid.name}: {grid.metric} {before[0]:.3f} [{before[1]:.3f}, {before[2]:.3f}] "
              f"-> {after[0]:.3f} [{after[1]:.3f}, {after[2]:.3f}] over {len(done)} seeds")
    if args.bc_reference:
        grounding = json.loads(Path("benchmarks/figures/vla/bc_grounding.json").read_text())
        scores = [r["test_success"] for r in grounding["records"]
                  if r["tag"] == args.bc_reference and not r.get("partial")]
        level = mean_interval(scores)
        xs = [min(line.x[0] for line in lines), max(line.x[-1] for line in lines)]
        lines.append(Line(f"512 demos: BC alone ({len(scores)} seeds)", xs, [level, level]))
        print(f"BC alone from 512 ({args.bc_reference}): {level[0]:.3f} [{level[1]:.3f}, "
              f"{level[2]:.3f}] over {len(scores)} seeds")
    out = draw_panels({args.title: lines}, "GRPO env steps (0: the BC policy)",
                      args.out, ylabel="success (mean, 95% interval over seeds)", cols=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
