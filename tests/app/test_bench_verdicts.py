"""The report grades itself: each of our cells against the peer's interval (below, within,
above) and the grid's orderings (``td3bc >= bc + 10``) met or missed, for robotrl and for each
peer that runs both algorithms. Records are made up here, so every verdict is known."""

import pytest
import yaml

from robotrl.bench.grid import load_grid
from robotrl.bench.report import figure_paths, report

BUDGET = 1000


def record(runner: str, algo: str, target: str, seed: int, final: float) -> dict:
    return {"runner": runner, "algo": algo, "target": target, "seed": seed, "budget": BUDGET,
            "steps": BUDGET, "final": final, "train_seconds": 60.0, "machine": "test"}


def cells(runner: str, algo: str, target: str, scores: list[float]) -> list[dict]:
    return [record(runner, algo, target, seed, s) for seed, s in enumerate(scores)]


def test_cells_against_the_peer_and_orderings_are_graded(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({
        "name": "graded", "out": str(tmp_path / "bench"), "algos": ["ppo", "trpo"],
        "tasks": ["hopper", "walker2d", "ant"], "seeds": [0, 1, 2], "budgets": [BUDGET],
        "orderings": [{"algo": "trpo", "over": "ppo", "by": 100, "targets": ["hopper"]},
                      {"algo": "ppo", "over": "trpo"}],
        "peers": {"sb3": {"script": "peer.py", "algos": {"ppo": "PPO", "trpo": "TRPO"}}}}))
    grid = load_grid(path)
    records = [
        *cells("robotrl", "ppo", "hopper", [110] * 3), *cells("sb3", "ppo", "hopper", [200, 210, 220]),
        *cells("robotrl", "trpo", "hopper", [210] * 3), *cells("sb3", "trpo", "hopper", [300] * 3),
        *cells("robotrl", "ppo", "walker2d", [150] * 3),
        *cells("sb3", "ppo", "walker2d", [100, 150, 200]),
        *cells("robotrl", "trpo", "walker2d", [500] * 3), *cells("sb3", "trpo", "walker2d", [500] * 3),
        *cells("robotrl", "ppo", "ant", [999] * 3), *cells("sb3", "ppo", "ant", [100, 110, 120]),
        *cells("robotrl", "trpo", "ant", [5] * 3), *cells("sb3", "trpo", "ant", [7]),  # one seed
    ]
    text, summary = report(grid, records, with_figures=False, reps=500)
    section = summary["budgets"][str(BUDGET)]
    assert section["against_peer"] == {
        "hopper|ppo|sb3": "below", "hopper|trpo|sb3": "below",
        "walker2d|ppo|sb3": "within", "walker2d|trpo|sb3": "within",  # equal to a 0-wide CI
        "ant|ppo|sb3": "above"}  # ant's TRPO: the peer has one seed, no interval, no verdict
    graded = {(f["ordering"], f["target"], f["runner"]): f["met"] for f in section["orderings"]}
    assert graded == {
        (0, "hopper", "robotrl"): True,  # 210 >= 110 + 100: met at the margin exactly
        (0, "hopper", "sb3"): False,     # 300 < 210 + 100
        (1, "hopper", "robotrl"): False, (1, "hopper", "sb3"): False,
        (1, "walker2d", "robotrl"): False, (1, "walker2d", "sb3"): False,  # 150 < 500
        (1, "ant", "robotrl"): True, (1, "ant", "sb3"): True}  # every target: targets=[]
    ant = next(f for f in section["orderings"] if f["target"] == "ant" and f["runner"] == "sb3")
    assert ant["seeds"] == (3, 1)

    hopper = next(line for line in text.splitlines() if line.startswith("| hopper |"))
    assert hopper.count("*below sb3's CI*") == 2
    assert "*above sb3's CI*" in next(line for line in text.splitlines()
                                      if line.startswith("| ant |"))
    assert ("within or above the peer's 95% interval in 3 of the 5 cells where the peer has 2 "
            "or more seeds") in text
    assert "below in ppo on hopper (sb3); trpo on hopper (sb3)" in text
    assert "| trpo ≥ ppo + 100 | hopper | 210.0 vs 110.0: **met** | 300.0 vs 210.0: **missed** |" in text
    assert "| ppo ≥ trpo | ant | 999.0 vs 5.0: **met** | 110.0 vs 7.0 (n=3, 1): **met** |" in text
    assert "robotrl meets 2 of the 4 orderings with both cells finished." in text


def test_a_grid_without_peers_or_orderings_prints_neither(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"name": "plain", "out": str(tmp_path / "b"), "algos": ["ppo"],
                                    "tasks": ["hopper"], "seeds": [0, 1], "budgets": [BUDGET]}))
    text, summary = report(load_grid(path), cells("robotrl", "ppo", "hopper", [1.0, 2.0]),
                           with_figures=False, reps=200)
    assert summary["budgets"][str(BUDGET)]["orderings"] == []
    assert "Against the peer" not in text and "Orderings" not in text and "CI*" not in text


def test_an_ordering_at_equal_wall_clock_reads_each_side_at_the_faster_ones_minutes(tmp_path):
    """FastTD3 against SAC (issue 45's claim: the best return for the time spent): behind at
    the final evaluations, ahead at the minute FastTD3's runs end; without minutes in the
    curves there is nothing to grade; a bad ``at`` is named with the allowed values."""
    import pytest

    def timed(algo: str, seconds: float, minutes: list[float], scores: list[float]) -> list:
        return [{**record("robotrl", algo, "hopper", seed, scores[-1] + seed),
                 "train_seconds": seconds, "curve": {"steps": list(range(len(scores))),
                                                     "score": [s + seed for s in scores],
                                                     "minutes": minutes}}
                for seed in range(3)]

    path = tmp_path / "grid.yaml"
    grid = {"name": "clock", "out": str(tmp_path / "b"), "algos": ["sac", "fasttd3"],
            "tasks": ["hopper"], "seeds": [0, 1, 2], "budgets": [BUDGET],
            "orderings": [{"algo": "fasttd3", "over": "sac", "at": "wall_clock"},
                          {"algo": "fasttd3", "over": "sac"}]}
    path.write_text(yaml.safe_dump(grid))
    records = [*timed("sac", 3600.0, [10.0, 30.0, 60.0], [100.0, 500.0, 900.0]),
               *timed("fasttd3", 540.0, [5.0, 10.0], [300.0, 600.0])]  # last evaluated at 10
    text, summary = report(load_grid(path), records, with_figures=False, reps=200)
    clock, final = summary["budgets"][str(BUDGET)]["orderings"]
    assert clock["minutes"] == 10.0 and clock["scores"] == (601.0, 101.0) and clock["met"]
    assert final["scores"] == (601.0, 901.0) and not final["met"]
    assert ("| fasttd3 ≥ sac at equal wall clock | hopper | 601.0 vs 101.0 at 10.0 min: "
            "**met** |") in text
    assert clock["machines"] == ["test"] and "†" not in text
    assert "![clock-1000-minutes](figures/clock-1000-minutes.png)" in text  # and against steps
    # minutes from two CPUs compare the CPUs too: the row and a line under the table say so
    mixed = [{**r, "machine": "other CPU"} if r["algo"] == "sac" else r for r in records]
    text_mixed, _ = report(load_grid(path), mixed, with_figures=False, reps=200)
    assert "601.0 vs 101.0 at 10.0 min †: **met**" in text_mixed
    assert ("† the runs compared at equal wall clock ran on different machines (other CPU; "
            "test)") in text_mixed
    assert [x for _, x, _ in figure_paths(load_grid(path), records, tmp_path)] == ["steps",
                                                                                "minutes"]
    for r in records:
        del r["curve"]["minutes"]  # records from before curves carried their minutes
    text, summary = report(load_grid(path), records, with_figures=False, reps=200)
    assert [f["ordering"] for f in summary["budgets"][str(BUDGET)]["orderings"]] == [1]
    assert "minutes.png" not in text
    grid["orderings"][0]["at"] = "steps"
    path.write_text(yaml.safe_dump(grid))
    with pytest.raises(ValueError, match=r"orderings\[0\].at must be one of \['final', "
                                         r"'wall_clock'\], got 'steps'"):
        load_grid(path)


def test_a_budget_no_cell_has_reached_has_no_figure(tmp_path):
    """Per-algorithm budgets (``algo_budgets``) leave a budget empty until its first cell lands:
    the report neither draws nor links an empty figure for it."""
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({
        "name": "partial", "out": str(tmp_path / "b"), "algos": ["ppo", "fasttd3"],
        "tasks": ["hopper"], "seeds": [0], "budgets": [BUDGET],
        "algo_budgets": {"fasttd3": [500]}}))
    grid = load_grid(path)
    records = [{**r, "curve": {"steps": [500, 1000], "score": [1.0, 2.0]}}
               for r in cells("robotrl", "ppo", "hopper", [2.0])]
    assert [b for b, _, _ in figure_paths(grid, records, tmp_path)] == [BUDGET]
    text, _ = report(grid, records, with_figures=False, reps=200)
    assert "partial-1000-curves.png" in text and "partial-500-curves.png" not in text


def test_the_figure_marks_each_threshold_and_names_every_contestant(tmp_path, monkeypatch):
    """The report's curves show each algorithm's threshold on a task as a dashed line in its
    colour, and one legend names every contestant of every panel (a peer run beside only one
    task included) and the threshold."""
    import pytest

    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from robotrl.bench.report import figures

    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({
        "name": "marked", "out": str(tmp_path / "b"), "algos": ["ppo", "trpo"],
        "tasks": ["hopper", "ant"], "seeds": [0, 1], "budgets": [BUDGET],
        "thresholds": {"ppo": {"hopper": 2410, "ant": 1327}, "trpo": {"hopper": 3618}},
        "peers": {"sb3": {"script": "peer.py", "algos": {"trpo": "TRPO"}, "targets": ["ant"]}}}))
    grid = load_grid(path)
    curve = {"steps": [500, 1000], "score": [1.0, 2.0]}
    records = [{**r, "curve": curve} for runner, algo, target in [
        ("robotrl", "ppo", "hopper"), ("robotrl", "trpo", "hopper"), ("robotrl", "ppo", "ant"),
        ("robotrl", "trpo", "ant"), ("sb3", "trpo", "ant")]
        for r in cells(runner, algo, target, [1.0, 2.0])]
    drawn = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: drawn.append(fig) or real(
        fig, *a, **k))
    assert figures(grid, records, tmp_path) == [str(tmp_path / "marked-1000-curves.png")]
    hopper, ant = drawn[0].axes[:2]
    colour = {line.get_label(): line.get_color() for line in hopper.lines
              if not line.get_label().startswith("_")}

    def dashed(ax) -> list:
        return sorted((line.get_ydata()[0], line.get_color()) for line in ax.lines
                      if line.get_linestyle() == "--")

    assert dashed(hopper) == [(2410, colour["ppo"]), (3618, colour["trpo"])]
    assert dashed(ant) == [(1327, colour["ppo"])]
    legend = [t.get_text() for t in hopper.get_legend().get_texts()]
    assert legend == ["ppo", "trpo", "trpo@sb3", "threshold"]


def test_the_results_overview_marks_each_cell_and_files_grids_by_family(tmp_path):
    """The site's overview (robotrl.bench.overview): a threshold decides a cell's mark where
    the grid has one, else the peer's interval; a family's grids sit under its heading, the
    archive's without a table; a wrong family is refused naming the allowed ones."""
    from robotrl.bench.overview import overview
    from robotrl.bench.report import summarize

    def grid(name: str, family: str, **more) -> object:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"name": name, "family": family, "out": str(tmp_path),
                                        "algos": ["ppo"], "tasks": ["hopper", "ant"],
                                        "seeds": [0, 1, 2], "budgets": [BUDGET], **more}))
        return load_grid(path)

    zoo = grid("zoo", "on-policy", thresholds={"ppo": {"hopper": 100, "ant": 1000}})
    peers = grid("peers", "on-policy",
                 peers={"sb3": {"script": "peer.py", "algos": {"ppo": "PPO"}}})
    old = grid("old", "archive")
    ours = [*cells("robotrl", "ppo", "hopper", [150] * 3), *cells("robotrl", "ppo", "ant", [900] * 3)]
    theirs = [*cells("sb3", "ppo", "hopper", [100, 150, 200]), *cells("sb3", "ppo", "ant", [990] * 3)]
    page = overview([(old, summarize(old, ours, reps=500), "old.md", []),
                     (zoo, summarize(zoo, ours, reps=500), "zoo.md", ["figures/zoo.png"]),
                     (peers, summarize(peers, ours + theirs, reps=500), "peers.md", [])])
    lines = page.splitlines()
    assert "| hopper | 150 ✓ |" in lines and "| ant | 900 ✗ |" in lines  # threshold 100, 1000
    zoo_line = next(i for i, line in enumerate(lines) if line.startswith("**[zoo](zoo.md)**"))
    assert lines[zoo_line].endswith("3 seeds, metric `return_mean`; 1 of 2 ✓")
    peer_line = next(i for i, line in enumerate(lines) if line.startswith("**[peers](peers.md)"))
    assert lines[peer_line].endswith("1 of 2 ✓")  # hopper within sb3's CI, ant below it
    assert lines.index("## On-policy at rl-zoo's budget") < zoo_line
    archive = lines.index("## Archive: superseded and exploratory grids")
    assert lines[archive + 2].startswith("**[old](old.md)**") and "|" not in "".join(lines[archive:])
    assert page.count("![") == 1 and "![zoo](figures/zoo.png)" in lines
    with pytest.raises(ValueError, match=r"unknown family 'misc'; allowed: \['on-policy'"):
        grid("bad", "misc")
