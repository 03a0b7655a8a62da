"""Every committed benchmark report is what ``robotrl bench report`` computes from the committed
results file: the tables on the page cannot drift from the numbers behind them."""

from pathlib import Path

import pytest

from robotrl.bench.grid import load_grid
from robotrl.cli.bench import bench_main

ROOT = Path(__file__).resolve().parents[2]
GRIDS = sorted((ROOT / "benchmarks" / "grids").glob("*.yaml"))


def test_every_grid_loads():
    assert GRIDS, "no benchmark grids found"
    for path in GRIDS:
        grid = load_grid(path)
        assert grid.cells(), path


COMMITTED = [g for g in GRIDS if load_grid(g).results_path.is_absolute()
             or (ROOT / load_grid(g).results_path).is_file()]
"""Grids with a results file (and so a report) to check."""


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_committed_report_matches_committed_results(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # grids name their files relative to the repository
    bench_main(["report", str(path.relative_to(ROOT)), "--check"])


def test_report_title_counts_in_the_singular_for_one():
    for path in COMMITTED:
        grid = load_grid(path)
        title = (ROOT / grid.report_path).read_text().splitlines()[0]
        for n, word in ((len(grid.algos), "algorithm"), (len(grid.seeds), "seed")):
            assert f" {n} {word}{'' if n == 1 else 's'} " in f"{title} ", (path.name, title)
