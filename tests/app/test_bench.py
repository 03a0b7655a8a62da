"""robotrl bench: a grid's cells reused and resumed after an interruption, its report
recomputable from the committed results alone (and checked by ``--check``), bad grids named;
robotrl ope on a trained run."""

import dataclasses
import json
import re
import time
from pathlib import Path

import pytest
import yaml

from robotrl.bench.grid import ROBOTRL, Cell, load_grid
from robotrl.bench.harness import cell_overrides
from robotrl.checkpoint import load_checkpoint
from robotrl.cli.bench import bench_main
from robotrl.experiment import compose


def write_grid(tmp_path: Path, dataset: Path, **extra) -> Path:
    grid = {"name": "tiny-offline", "out": str(tmp_path / "bench"), "algos": ["bc", "td3bc"],
            "datasets": [str(dataset)], "seeds": [0, 1], "budgets": [200],
            "metric": "normalized_score", "ope_updates": 50,
            "overrides": ["algo.updates_per_iteration=100", "eval_interval=1", "checkpoint_interval=1",
                          "eval_episodes=2", "logger.tensorboard=false"],
            "results": str(tmp_path / "committed" / "results.json"),
            "report": str(tmp_path / "committed" / "report.md"), **extra}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


@pytest.mark.slow  # 8 short offline runs through two sweeps (~50 s alone)
def test_interrupted_grid_resumes_without_redoing_cells(pendulum, tmp_path, monkeypatch, capsys):
    path = write_grid(tmp_path, pendulum)
    grid = load_grid(path)
    from robotrl.runners.offline import OfflineRunner

    original = OfflineRunner._iteration
    calls = {"n": 0}

    def interrupt_td3bc_s1(self):  # noqa: ANN001, ANN202 - Ctrl-C in the middle of the last run
        if self.config["algo"]["name"] == "td3bc" and self.config["seed"] == 1:
            calls["n"] += 1
            if calls["n"] == 2:
                raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(OfflineRunner, "_iteration", interrupt_td3bc_s1)
    with pytest.raises(KeyboardInterrupt):
        bench_main(["run", str(path)])
    monkeypatch.undo()
    runs = {(a, s): grid.run_dir(Cell(ROBOTRL, a, str(pendulum), s, 200))
            for a in ("bc", "td3bc") for s in (0, 1)}
    for key in [("bc", 0), ("td3bc", 0), ("bc", 1)]:
        assert (runs[key] / "ope.json").exists(), key
    cut = runs[("td3bc", 1)]
    assert not (cut / "result.json").exists()
    assert load_checkpoint(cut / "checkpoints" / "last.pt")["global_step"] == 100
    # the report says how far the cut cell got, and so does the results file it commits
    bench_main(["report", str(path)])
    started = "started: 100 of 200 steps at its last checkpoint; normalized_score"
    assert started in (tmp_path / "committed" / "report.md").read_text()
    saved = json.loads((tmp_path / "committed" / "results.json").read_text())["records"]
    assert [r["missing"][:len(started)] for r in saved if "missing" in r] == [started]
    before = {k: (r / "checkpoints" / "last.pt").stat().st_mtime_ns for k, r in runs.items()}
    # the second invocation runs its cells in 2 processes through the joblib launcher
    bench_main(["run", str(path), "launcher=joblib", "jobs=2"])
    for key, run in runs.items():
        after = (run / "checkpoints" / "last.pt").stat().st_mtime_ns
        assert (after == before[key]) == (key != ("td3bc", 1)), key  # only the cut run trained
    result = json.loads((cut / "result.json").read_text())
    assert [e["step"] for e in result["evaluations"]] == [100, 200]  # resumed, not restarted
    assert (cut / "ope.json").exists() and (cut / "checkpoints" / "best.pt").exists()

    committed = tmp_path / "committed"
    saved = json.loads((committed / "results.json").read_text())
    assert len(saved["records"]) == 4 and all("ope" in r for r in saved["records"])
    report = (committed / "report.md").read_text()
    assert "bc" in report and "td3bc" in report and "(n=2" in report
    assert (committed / "figures" / "tiny-offline-200-curves.png").stat().st_size > 0

    # a fresh clone has the committed results but no run directories: the same report
    import shutil

    shutil.rmtree(tmp_path / "bench")
    bench_main(["report", str(path), "--check"])
    (committed / "report.md").write_text(report.replace("bc", "BC", 1))
    with pytest.raises(SystemExit) as exc:
        bench_main(["report", str(path), "--check"])
    assert exc.value.code == 1


def test_a_changed_config_is_not_passed_off_as_the_cell(pendulum, tmp_path, capsys):
    """A finished cell whose config the grid no longer composes (here the grid's overrides; in
    practice a tuned file or a default) is neither reused nor resumed, and the results file's
    record of it is not shown as the current cell."""
    from robotrl.bench.harness import changed, finished, run_cell

    one = {"algos": ["bc"], "seeds": [0], "budgets": [100], "ope_updates": 0}
    path = write_grid(tmp_path, pendulum, **one)
    bench_main(["run", str(path), "figures=false"])
    grid = load_grid(path)
    cell = grid.cells()[0]
    assert finished(grid, cell) is not None and changed(grid, cell) == []
    record = json.loads(grid.results_path.read_text())["records"][0]
    assert len(record["config"]) == 16

    tuned = write_grid(tmp_path, pendulum, **one, overrides=[
        *yaml.safe_load(path.read_text())["overrides"], "algo.actor_lr=0.002"])
    grid = load_grid(tuned)
    assert changed(grid, cell) == ["algo.actor_lr: 0.0003 -> 0.002"]
    assert finished(grid, cell) is None
    bench_main(["list", str(tuned)])
    listed = capsys.readouterr()
    assert " stale " in listed.out + listed.err
    # the fresh clone's view: no run directories, the committed record is of the old config
    import shutil

    shutil.move(grid.run_dir(cell), tmp_path / "elsewhere")
    bench_main(["report", str(tuned), "--check"])  # the committed pair still agrees: kept
    said = capsys.readouterr()
    assert "the committed record is of a config the grid no longer composes" in said.err
    bench_main(["report", str(tuned), "figures=false"])
    stale = "stale: the results file's record is of a config"
    assert f"s0: {stale}" in (tmp_path / "committed" / "report.md").read_text()
    # the results file says so too, so that the committed pair agrees and stays stale
    assert [r["missing"][:len(stale)] for r in json.loads(grid.results_path.read_text())[
        "records"]] == [stale]
    bench_main(["report", str(tuned), "--check"])
    bench_main(["report", str(tuned), "figures=false"])
    assert f"s0: {stale}" in (tmp_path / "committed" / "report.md").read_text()
    shutil.move(tmp_path / "elsewhere", grid.run_dir(cell))
    run_cell(grid, cell)  # set aside, trained again under the new config
    said = capsys.readouterr()
    assert "starting over" in said.out + said.err
    assert (grid.run_dir(cell).parent / "s0.stale" / "result.json").is_file()
    assert finished(grid, cell) is not None


FAKE_PEER = """
import json, sys
from pathlib import Path
cell = json.loads(Path(sys.argv[1]).read_text())
final = {"normalized_score": float(cell["options"]["score"]), "return_mean": 1.0}
Path(cell["run_dir"], "result.json").write_text(json.dumps({
    "step": cell["budget"], "total_steps": cell["budget"], "final": final,
    "train_seconds": 60.0 * cell["options"]["minutes"], "evaluations": [], "machine": "m"}))
"""


def test_a_peer_run_under_other_options_is_not_passed_off_as_the_cell(pendulum, tmp_path,
                                                                       capsys):
    """A peer's cell whose options the grid has changed since it ran (its ``cell.json``) is
    stale like a robotrl cell whose config changed: listed so, set aside and run again, and the
    results file's record of it (``config``: ``peer_digest``) is not shown as the cell. And
    ``bench list`` estimates a peer's cell from another grid's runs of the peer only where they
    ran with the same options."""
    from robotrl.bench.harness import changed, finished, run_cell

    script = tmp_path / "peer.py"
    script.write_text(FAKE_PEER)

    def grid_with(score: float, minutes: float, name: str = "grid.yaml") -> Path:
        path = write_grid(tmp_path, pendulum, algos=["bc"], seeds=[0], budgets=[100],
                          ope_updates=0, peers={"d3": {"script": str(script), "algos": {"bc": "BC"},
                                                       "options": {"score": score,
                                                                   "minutes": minutes}}})
        return path.rename(tmp_path / name)

    path = grid_with(7.0, 30)
    grid = load_grid(path)
    cell = next(c for c in grid.cells() if c.runner == "d3")
    assert run_cell(grid, cell)["final"]["normalized_score"] == 7.0
    assert changed(grid, cell) == [] and finished(grid, cell) is not None
    bench_main(["report", str(path), "figures=false"])
    record = next(r for r in json.loads(grid.results_path.read_text())["records"]
                  if r["runner"] == "d3")
    assert record["final"] == 7.0 and len(record["config"]) == 16

    other = load_grid(grid_with(8.0, 30, "other.yaml"))
    assert changed(other, cell) == ["options.score: 7.0 -> 8.0"]
    assert finished(other, cell) is None
    capsys.readouterr()
    bench_main(["list", str(tmp_path / "other.yaml")])
    said = capsys.readouterr()
    listed = " ".join((said.out + said.err).split())
    assert re.search(r"\d+ stale +d3 bc ", listed), listed
    import shutil  # the fresh clone's view: the committed record is of the old options

    shutil.move(grid.run_dir(cell), tmp_path / "elsewhere")
    bench_main(["report", str(tmp_path / "other.yaml"), "figures=false"])
    text = (tmp_path / "committed" / "report.md").read_text()
    assert "s0: stale: the results file's record is of a config" in text, text
    shutil.move(tmp_path / "elsewhere", grid.run_dir(cell))
    assert run_cell(other, cell)["final"]["normalized_score"] == 8.0  # set aside, run again
    assert (grid.run_dir(cell).parent / "s0.stale" / "result.json").is_file()

    # estimates: a committed grid's runs of the peer count only under the same options
    committed = tmp_path / "committed"
    committed.mkdir(exist_ok=True)
    fresh = write_grid(tmp_path, pendulum, algos=["bc"], seeds=[0], budgets=[100], ope_updates=0,
                       out=str(tmp_path / "fresh-runs"), results=str(committed / "fresh.json"),
                       peers={"d3": {"script": str(script), "algos": {"bc": "BC"},
                                     "options": {"score": 7.0, "minutes": 30}}})
    (committed / "earlier.json").write_text(json.dumps({"grid": "earlier", "records": [
        record, dict(record, config="0" * 16, train_seconds=120.0)]}))
    capsys.readouterr()
    bench_main(["list", str(fresh)])
    said = capsys.readouterr()
    listed = " ".join((said.out + said.err).split())
    assert "d3 bc" in listed and "(about 30 min to run as in earlier)" in listed, listed


def test_a_dataset_recorded_again_is_not_passed_off_as_the_cells(pendulum, tmp_path, capsys):
    """Each offline cell records the digest of the dataset it trained on; a dataset recorded
    again under the same id (other rows, or other reference returns) makes its finished cells
    stale, and a report over cells from two recordings says so."""
    import shutil

    from robotrl.bench.harness import data_changed, data_digest, finished
    from robotrl.data import load_dataset, save_hdf5

    data = tmp_path / "pend.hdf5"
    shutil.copy(pendulum, data)
    one = {"algos": ["bc"], "seeds": [0], "budgets": [100], "ope_updates": 0}
    path = write_grid(tmp_path, data, **one)
    bench_main(["run", str(path), "figures=false"])
    grid = load_grid(path)
    cell = grid.cells()[0]
    before = load_dataset(str(data)).digest()
    record = json.loads(grid.results_path.read_text())["records"][0]
    assert record["data"] == before and len(before) == 16
    assert f"- {data}: {before} (1 cells)" in grid.report_path.read_text()

    # the same rows with other reference returns: normalized scores would mean something else
    again = load_dataset(str(data))
    again.card = dataclasses.replace(again.card, ref_max_score=900.0)
    data.unlink()
    save_hdf5(again, data)
    data_digest.cache_clear()
    after = load_dataset(str(data)).digest()
    assert after != before
    assert data_changed(grid, cell) == [f"dataset {data}: digest {before} -> {after}"]
    assert finished(grid, cell) is None
    bench_main(["list", str(path)])
    assert " stale " in "".join(capsys.readouterr())
    committed = grid.results_path.read_text()
    bench_main(["report", str(path), "figures=false"])
    assert f"s0: stale: its dataset changed since it ran (dataset {data}: digest {before} -> " \
        f"{after})" in grid.report_path.read_text()
    # nor is the results file's record of the old recording (a clone with the new data only)
    shutil.move(grid.run_dir(cell), tmp_path / "elsewhere")
    grid.results_path.write_text(committed)
    capsys.readouterr()
    bench_main(["list", str(path)])  # stale, not a plain todo: the list says whose recording
    said = "".join(capsys.readouterr())
    assert " stale " in said and f"digest {before} in the results, {after} on disk" in said
    assert "1 cell is committed on another recording of its dataset" in said
    bench_main(["report", str(path), "figures=false"])
    assert "s0: stale: the results file's record is of another recording of the dataset" in (
        grid.report_path.read_text())
    shutil.move(tmp_path / "elsewhere", grid.run_dir(cell))
    bench_main(["run", str(path), "figures=false"])  # set aside, trained again on the new one
    assert "starting over" in "".join(capsys.readouterr())
    assert finished(grid, cell) is not None
    (record,) = json.loads(grid.results_path.read_text())["records"]
    assert record["data"] == after
    # committed records of two recordings (what a fresh clone, without the data, reports)
    from robotrl.bench.report import report

    text, _ = report(grid, [record, {**record, "seed": 1, "data": before}], with_figures=False)
    assert f"- {data}: {after} (1 cells), {before} (1 cells) — **more than one recording" in text
    unrecorded = {k: v for k, v in record.items() if k != "data"}  # from before digests
    text, _ = report(grid, [record, {**unrecorded, "seed": 1}], with_figures=False)
    assert f"- {data}: {after} (1 cells), not recorded (1 cells) — **the cells not recorded " \
        "may be of another recording**" in text


def test_batch_seeds_trains_a_cells_seeds_in_one_process(pendulum, tmp_path, capsys):
    """``batch_seeds: true``: each algorithm's seeds run as one num_seeds job into their own
    cell directories (equal to the cells run one by one)."""
    grid_path = write_grid(tmp_path, pendulum, batch_seeds=True, ope_updates=0, budgets=[100])
    bench_main(["run", str(grid_path), "figures=false"])
    said = capsys.readouterr()
    assert said.err.count("(batched)") + said.out.count("(batched)") == 4  # BC's and TD3+BC's
    grid = load_grid(grid_path)
    batched = {c.seed: grid.run_dir(c) for c in grid.cells() if c.algo == "td3bc"}
    assert all((r / "result.json").is_file() for r in batched.values())
    (tmp_path / "alone").mkdir()
    alone = write_grid(tmp_path / "alone", pendulum, ope_updates=0, budgets=[100],
                       algos=["td3bc"], seeds=[1])
    bench_main(["run", str(alone), "figures=false"])
    solo = load_grid(alone)
    one = json.loads((solo.run_dir(solo.cells()[0]) / "result.json").read_text())
    two = json.loads((batched[1] / "result.json").read_text())
    assert one["final"]["return_mean"] == pytest.approx(two["final"]["return_mean"], rel=1e-3)
    assert one["config"] == two["config"]  # the same config: a seed of a batch is that run
    with pytest.raises(SystemExit, match="batch_seeds needs consecutive seeds"):
        bench_main(["run", str(grid_path), "seeds=[0,2]"])
    # each cell, batched or alone, records the machine's load while it trained; the report
    # says it beside the machine
    for run in [*batched.values(), solo.run_dir(solo.cells()[0])]:
        load = json.loads((run / "load.json").read_text())
        assert load["samples"] >= 2 and load["min"] <= load["mean"] <= load["max"]
    saved = json.loads((tmp_path / "committed" / "results.json").read_text())["records"]
    assert all(isinstance(r["load"], float) for r in saved)
    assert " (load average " in (tmp_path / "committed" / "report.md").read_text()


def test_load_sampler_pools_a_resumed_cells_segments(tmp_path):
    from robotrl.bench.harness import LOAD_FILE, LoadSampler, pooled_load

    with LoadSampler([tmp_path], every=0.01) as first:
        time.sleep(0.05)
    assert len(first.samples) >= 3
    with LoadSampler([tmp_path], every=10.0) as second:  # a resumed cell: start and stop
        pass
    load = json.loads((tmp_path / LOAD_FILE).read_text())
    assert load["samples"] == len(first.samples) + len(second.samples)
    assert load == pooled_load(pooled_load(None, first.samples), second.samples)
    assert pooled_load({"mean": 1.0, "min": 1.0, "max": 1.0, "samples": 1}, [3.0, 5.0]) == {
        "mean": 3.0, "min": 1.0, "max": 5.0, "samples": 3}


def test_batch_seeds_groups_only_what_a_seed_batch_can_train(tmp_path):
    """A learner without a seed batch (TRPO) keeps one job per cell; one with (PPO) groups its
    seeds, unless a seed's run directory exists already (a started run resumes alone)."""
    from robotrl.bench.harness import seed_batch

    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({
        "name": "tiny-online", "out": str(tmp_path / "bench"), "algos": ["trpo", "ppo"],
        "tasks": ["inverted_pendulum"], "seeds": [0, 1], "budgets": [64], "batch_seeds": True,
        "metric": "return_mean", "results": str(tmp_path / "r.json"),
        "report": str(tmp_path / "r.md")}))
    grid = load_grid(path)
    trpo, ppo = (next(c for c in grid.cells() if c.algo == a and c.seed == 0)
                 for a in ("trpo", "ppo"))
    assert seed_batch(grid, trpo) == [trpo]
    assert [c.seed for c in seed_batch(grid, ppo)] == [0, 1]
    grid.run_dir(Cell(ROBOTRL, "ppo", "inverted_pendulum", 1, 64)).mkdir(parents=True)
    assert seed_batch(grid, ppo) == [ppo]


def test_ope_command(pendulum, tmp_path):
    from robotrl.cli.ope import ope_main
    from robotrl.config import TrainConfig, from_dict
    from robotrl.experiment import run_training

    run = tmp_path / "run"
    run_training(from_dict(TrainConfig, {
        "algo": {"name": "bc", "updates_per_iteration": 100}, "dataset": str(pendulum),
        "env": {"task": "inverted_pendulum", "options": {}}, "total_steps": 100,
        "eval_episodes": 2, "run_dir": str(run),
        "logger": {"tensorboard": False, "progress": False}}))
    ope_main([f"checkpoint={run / 'checkpoints' / 'last.pt'}", f"dataset={pendulum}",
              "updates=50", "episodes=2", f"out={tmp_path / 'ope.json'}"])
    result = json.loads((tmp_path / "ope.json").read_text())
    assert {"estimate", "estimate_std", "simulated", "starts", "gamma"} <= set(result)
    with pytest.raises(SystemExit, match="needs dataset="):
        ope_main([f"checkpoint={run / 'checkpoints' / 'last.pt'}"])


@pytest.mark.parametrize("bad, message", [
    ({"algos": ["bc", "ppo"]}, "unknown offline algorithm 'ppo'; available: .*'td3bc'"),
    ({"algos": {"bc": [], "ppo@fast": []}}, "unknown offline algorithm 'ppo@fast'"),
    ({"tasks": ["hopper"]}, "give tasks or datasets"),
    ({"seeds": "zero"}, "grid.seeds: expected a list"),
    ({"colour": 1}, "unknown config key.*colour"),
    ({"budgets": [0]}, "budgets must be >= 1"),
    ({"algo_budgets": {"iql": [100]}}, "algo_budgets names algorithm 'iql' the grid does not run"),
    ({"algo_budgets": {"bc": []}}, "algo_budgets.bc must be a non-empty list of budgets >= 1"),
    ({"peers": {"sb3": {"script": "x.py", "algos": {"sac": "SAC"}}}},
     "peer 'sb3' names algorithms \\['sac'\\]"),
    ({"peers": {"d3": {"script": "x.py", "algos": {"bc": "BC"}, "targets": ["walker2d"]}}},
     "peer 'd3' names targets \\['walker2d'\\], not among the grid's targets"),
    ({"orderings": [{"algo": "iql", "over": "bc"}]},
     "orderings\\[0\\].algo 'iql' is not one of the grid's algorithms \\['bc', 'td3bc'\\]"),
    ({"orderings": [{"algo": "td3bc", "over": "bc", "by": 10, "targets": ["walker2d"]}]},
     "orderings\\[0\\].targets names \\['walker2d'\\], not among the grid's targets"),
    ({"orderings": [{"algo": "td3bc", "over": "bc", "on": ["x"]}]},
     "unknown config key.*'on'.*allowed keys: \\['algo', 'over', 'by', 'targets', 'at'\\]"),
])
def test_bad_grid_is_named(bad, message, tmp_path, pendulum):
    path = write_grid(tmp_path, pendulum, **bad)
    with pytest.raises(SystemExit, match=message):
        bench_main(["run", str(path)])
    assert not (tmp_path / "bench").exists()  # nothing written


def test_a_grid_extends_another_stating_only_what_differs(tmp_path, pendulum):
    base = write_grid(tmp_path, pendulum)
    (tmp_path / "variant.yaml").write_text(yaml.safe_dump(
        {"extends": base.name, "name": "tiny-variant", "seeds": [3]}))
    parent, variant = load_grid(base), load_grid(tmp_path / "variant.yaml")
    assert (variant.name, variant.seeds) == ("tiny-variant", [3])
    assert (variant.algos, variant.overrides, variant.datasets) == (
        parent.algos, parent.overrides, parent.datasets)
    (tmp_path / "loop.yaml").write_text("extends: loop.yaml\n")
    with pytest.raises(ValueError, match="loop.yaml extends itself"):
        load_grid(tmp_path / "loop.yaml")
    (tmp_path / "orphan.yaml").write_text("extends: gone.yaml\n")
    with pytest.raises(ValueError, match="gone.yaml not found .extended by .*orphan.yaml"):
        load_grid(tmp_path / "orphan.yaml")


def test_an_algorithm_runs_under_labels_as_variants(tmp_path, pendulum):
    """``td3bc@bf16``: its own cells and directories, training ``algo=td3bc`` with its
    overrides."""
    grid = load_grid(write_grid(tmp_path, pendulum, algos={
        "td3bc": [], "td3bc@bf16": ["algo.precision=bf16"]}))
    cells = [c for c in grid.cells() if c.seed == 0]
    assert [c.algo for c in cells] == ["td3bc", "td3bc@bf16"]
    plain, bf16 = (compose(cell_overrides(grid, c)) for c in cells)
    assert type(plain.algo).__name__ == type(bf16.algo).__name__ == "TD3BCConfig"
    assert (plain.algo.precision, bf16.algo.precision) == ("float32", "bf16")
    assert grid.run_dir(cells[0]) != grid.run_dir(cells[1])


def test_an_algorithm_runs_at_its_own_budgets_and_the_report_has_a_section_each(
        tmp_path, pendulum):
    """``algo_budgets: {td3bc: [50]}``: td3bc's cells run 50 updates (its directories say so),
    bc's the grid's 200; the report has one section per budget, each with the algorithms that
    run it."""
    from robotrl.bench.report import markdown, summarize

    grid = load_grid(write_grid(tmp_path, pendulum, algo_budgets={"td3bc": [50]}))
    cells = grid.cells()
    assert [(c.algo, c.budget, c.seed) for c in cells] == [
        ("bc", 200, 0), ("td3bc", 50, 0), ("bc", 200, 1), ("td3bc", 50, 1)]
    assert [compose(cell_overrides(grid, c)).total_steps for c in cells[:2]] == [200, 50]
    assert grid.run_dir(cells[1]).parent.name == "50" and grid.all_budgets == [200, 50]
    records = [{"runner": ROBOTRL, "algo": c.algo, "target": c.target, "seed": c.seed,
                "budget": c.budget, "final": 10.0 * c.seed + (c.algo == "bc"), "steps": c.budget,
                "train_seconds": 60.0} for c in cells]
    summary = summarize(grid, records, reps=100)
    assert {b: sorted(k.split("|")[1] for k in sec["cells"])
            for b, sec in summary["budgets"].items()} == {"200": ["bc"], "50": ["td3bc"]}
    text = markdown(grid, summary, [], [])
    assert "## 200 gradient updates" in text and "## 50 gradient updates" in text


def test_the_report_gives_the_also_keys_of_every_cell(tmp_path, pendulum):
    """``also: [lin_vel_rmse]`` on a grid without an init stage: a table of each finished
    cell's values beside the metric's (IQM [95% CI] over seeds, a single run's value alone),
    a dash where a run did not record the key."""
    from robotrl.bench.report import markdown, summarize

    grid = load_grid(write_grid(tmp_path, pendulum, also=["lin_vel_rmse", "falls"]))
    records = [{"runner": ROBOTRL, "algo": c.algo, "target": c.target, "seed": c.seed,
                "budget": c.budget, "final": 1.0, "steps": c.budget, "train_seconds": 60.0,
                "also": {"lin_vel_rmse": 0.1 + 0.1 * c.seed, **({"falls": 0.0}
                                                              if c.algo == "bc" else {})}}
               for c in grid.cells() if c.algo == "bc" or c.seed == 0]
    text = markdown(grid, summarize(grid, records, reps=100), [], [])
    assert "| task | contestant | seeds | lin_vel_rmse | falls |" in text
    assert re.search(r"\| bc \| 2 \| 0\.\d{3} \[0\.100, 0\.200\] \| 0\.000 \[", text)
    assert re.search(r"\| td3bc \| 1 \| 0\.100 \| — \|", text)


def test_a_peer_runs_only_on_the_targets_it_names(tmp_path, pendulum):
    other = tmp_path / "other-v0"
    peer = {"script": "x.py", "algos": {"bc": "BC"}}
    every = load_grid(write_grid(tmp_path, pendulum, datasets=[str(pendulum), str(other)],
                                 peers={"d3": peer}))
    few = load_grid(write_grid(tmp_path, pendulum, datasets=[str(pendulum), str(other)],
                               peers={"d3": {**peer, "targets": [str(other)]}}))
    assert {c.target for c in every.cells() if c.runner == "d3"} == {str(pendulum), str(other)}
    assert {c.target for c in few.cells() if c.runner == "d3"} == {str(other)}
    assert [c for c in few.cells() if c.runner == ROBOTRL] == [
        c for c in every.cells() if c.runner == ROBOTRL]


def test_a_grid_that_is_not_yaml_is_named(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text("name: g\nalgos: {bc: [algo.hidden=[32,32]]}\n")
    with pytest.raises(SystemExit, match="grid file .*grid.yaml is not valid YAML"):
        bench_main(["run", str(path)])


def test_bad_options_are_named(tmp_path, pendulum, monkeypatch):
    path = write_grid(tmp_path, pendulum)
    with pytest.raises(SystemExit, match="unknown launcher 'ray'"):
        bench_main(["run", str(path), "launcher=ray"])
    with pytest.raises(SystemExit, match="only= indices must be in 0..3"):
        bench_main(["run", str(path), "only=9"])
    with pytest.raises(SystemExit, match="only= takes cell indices .* got '\\[1,x\\]'"):
        bench_main(["run", str(path), "only=[1,x]"])
    nowhere = write_grid(tmp_path, Path("nowhere/x-v0"))
    with pytest.raises(SystemExit, match="dataset error: .*nowhere/x-v0"):
        bench_main(["run", str(nowhere)])
    # only= checks the datasets of the cells it runs, not every dataset the grid names
    both = write_grid(tmp_path, pendulum, datasets=[str(pendulum), "nowhere/x-v0"])
    labels = [c.label for c in load_grid(both).cells()]
    here, there = (next(i for i, label in enumerate(labels) if name in label)
                   for name in (pendulum.name, "nowhere"))
    with pytest.raises(SystemExit, match="dataset error: .*nowhere/x-v0"):
        bench_main(["run", str(both), f"only={there}"])

    def launched(*args):  # noqa: ANN002, ANN202 - past the checks: stop before training
        raise KeyboardInterrupt

    monkeypatch.setattr("robotrl.bench.harness.launch", launched)
    with pytest.raises(KeyboardInterrupt):
        bench_main(["run", str(both), f"only={here}"])
    with pytest.raises(SystemExit, match="usage: robotrl bench"):
        bench_main(["walk", str(path)])


def test_an_offline_runs_default_directory_names_the_datasets_task(pendulum) -> None:
    """The default run_dir (runs/<task>/...) names the task the dataset's card gives, not the
    default task it was interpolated with before the card was read; an explicit one stays."""
    from robotrl.experiment import compose

    assert compose(["algo=bc", f"dataset={pendulum}"]).run_dir.startswith(
        "runs/inverted_pendulum/bc_s0_")
    assert compose(["algo=bc", f"dataset={pendulum}", "run_dir=runs/halfcheetah/x"]
                   ).run_dir == "runs/halfcheetah/x"


def write_init_grid(tmp_path: Path, dataset: Path, **stage) -> Path:
    """BC on ``dataset`` (the init stage), then GRPO on InvertedPendulum from it, 2 seeds."""
    grid = {"name": "bc-then-grpo", "out": str(tmp_path / "bench"), "tasks": ["inverted_pendulum"],
            "algos": {"grpo": ["algo.group_size=4", "algo.train_states=16",
                               "algo.test_states=8", "num_envs=8"]},
            "init": {"grpo": {"algo": "bc", "dataset": str(dataset), "budget": 100,
                              "overrides": ["algo.updates_per_iteration=50",
                                            "algo.hidden=[16,16]"], **stage}},
            "seeds": [0, 1], "budgets": [1600], "metric": "test_return_mean",
            "also": ["return_mean"],
            "overrides": ["eval_interval=1", "eval_episodes=2", "logger.tensorboard=false"],
            "results": str(tmp_path / "committed" / "results.json"),
            "report": str(tmp_path / "committed" / "report.md")}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


def test_init_stage_trains_first_and_the_report_pairs_before_and_after(pendulum, tmp_path,
                                                                        capsys):
    """``init``: each cell's BC stage trains at the cell's seed, the GRPO cell starts from its
    final checkpoint (its step-0 evaluation is the BC policy's), a second run reuses both, a
    changed stage retrains it and the cell after it; the report pairs before and after."""
    from robotrl.bench.harness import collect
    from robotrl.experiment import RunDir

    path = write_init_grid(tmp_path, pendulum)
    bench_main(["run", str(path), "figures=false"])
    grid = load_grid(path)
    cells = grid.cells()
    assert [(c.algo, c.seed) for c in cells] == [("grpo", 0), ("grpo", 1)]
    for cell in cells:
        stage = grid.init_dir(cell)
        assert stage.name == f"s{cell.seed}-init"
        bc = RunDir(stage).config
        assert (type(bc.algo).__name__, bc.seed, bc.total_steps) == ("BCConfig", cell.seed, 100)
        grpo = RunDir(grid.run_dir(cell)).config
        assert grpo.init == str(stage / "checkpoints" / "last.pt")
    records = collect(grid)
    for r in records:
        result = json.loads((grid.run_dir(cells[r["seed"]]) / "result.json").read_text())
        first = result["evaluations"][0]
        assert first["step"] == 0
        assert r["init"]["before"] == {"test_return_mean": first["test_return_mean"],
                                       "return_mean": first["return_mean"]}
        assert r["also"] == {"return_mean": result["final"]["return_mean"]}
        assert r["init"]["train_seconds"] > 0 and r["init"]["updates"] == 100
    report = (tmp_path / "committed" / "report.md").read_text()
    assert "grpo on inverted_pendulum from bc (100 updates" in report
    gains = [r["final"] - r["init"]["before"]["test_return_mean"] for r in records]
    mean = sum(gains) / 2
    assert "test_return_mean: before" in report and f"paired gain {mean:.3f} [" in report
    assert "return_mean: before" in report

    # a second run reuses the stages and the cells
    stamps = {p: p.stat().st_mtime_ns for c in cells
              for p in (grid.init_dir(c) / "result.json", grid.run_dir(c) / "result.json")}
    bench_main(["run", str(path), "figures=false"])
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())

    # a changed stage trains again, and the cell that started from the old one starts over
    path = write_init_grid(tmp_path, pendulum, budget=150)
    grid = load_grid(path)
    bench_main(["run", str(path), "only=0", "figures=false"])
    said = capsys.readouterr()
    said = said.out + said.err
    assert "its init stage's config changed (total_steps: 100 -> 150" in said
    assert "the config changed since it ran (init: its stage trained again)" in said
    assert RunDir(grid.init_dir(cells[0])).config.total_steps == 150
    assert (grid.run_dir(cells[0]).with_name("s0.stale") / "result.json").is_file()
    assert json.loads((grid.run_dir(cells[0]) / "result.json").read_text())["step"] >= 1600


def test_init_stage_records_its_dataset_when_missing(tmp_path):
    """``collect``: the stage's dataset is recorded once, before the cells run."""
    data = tmp_path / "random.hdf5"
    path = write_init_grid(tmp_path, data, collect=["task=inverted_pendulum", "kind=random",
                                                    "steps=400", "num_envs=8"])
    bench_main(["run", str(path), "only=0", "figures=false"])
    from robotrl.data import load_dataset

    assert len(load_dataset(str(data))) == 400
    grid = load_grid(path)
    assert (grid.init_dir(grid.cells()[0]) / "result.json").is_file()
    assert (grid.run_dir(grid.cells()[0]) / "result.json").is_file()
    stamp = data.stat().st_mtime_ns
    bench_main(["run", str(path), "figures=false"])  # the other cell: the dataset is reused
    assert data.stat().st_mtime_ns == stamp
    # a collection that fails is named, with the command's own error, and nothing runs
    (tmp_path / "bad").mkdir()
    bad = write_init_grid(tmp_path / "bad", tmp_path / "none.hdf5", collect=["task=nowhere"])
    with pytest.raises(SystemExit, match="recording init dataset .*none.hdf5 failed: .*unknown "
                                         "task 'nowhere'"):
        bench_main(["run", str(bad)])
    assert not (tmp_path / "bad" / "bench").exists()


@pytest.mark.parametrize("stage, message", [
    ({"init": {"ppo": {"algo": "bc", "dataset": "x.hdf5", "budget": 10}}},
     "init names algorithm 'ppo' the grid does not run"),
    ({"init": {"grpo": {"algo": "ppo", "dataset": "x.hdf5", "budget": 10}}},
     "init.grpo.algo must be an offline algorithm, got 'ppo'"),
    ({"init": {"grpo": {"algo": "bc", "dataset": "x.hdf5", "budget": 0}}},
     "init.grpo.budget must be >= 1"),
    ({"init": {"grpo": {"algo": "bc", "budget": 10}}}, "dataset"),
])
def test_bad_init_stage_is_named(stage, message, tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"name": "g", "out": str(tmp_path / "b"), "tasks": ["reacher"],
                                    "algos": ["grpo"], **stage}))
    with pytest.raises(SystemExit, match=message):
        bench_main(["run", str(path)])


def test_a_started_cell_says_how_far_it_got(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from robotrl.bench.harness import progress
    from robotrl.checkpoint import save_checkpoint

    run = tmp_path / "run"
    assert progress(run, 50_000, "normalized_score") is None  # never started
    run.mkdir()
    (run / "config.yaml").write_text("{}\n")
    assert progress(run, 50_000, "normalized_score") == "started: no checkpoint or evaluation yet"
    # its checkpoints left on another machine: the latest evaluation it logged
    with SummaryWriter(str(run)) as writer:
        for step, score in ((5_000, 4.5), (10_000, 6.25)):
            writer.add_scalar("eval/normalized_score", score, step)
    assert progress(run, 50_000, "normalized_score") == (
        "started: evaluated up to 10,000 of 50,000 steps (normalized_score 6.2 there); no "
        "checkpoint here to resume from")
    # the checkpoint a resume starts from comes first
    save_checkpoint(run / "checkpoints" / "last.pt", {"global_step": 15_000, "evaluations": [
        {"step": 10_000, "normalized_score": 6.25}, {"step": 15_000, "return_mean": 80.0}]})
    assert progress(run, 50_000, "normalized_score") == (
        "started: 15,000 of 50,000 steps at its last checkpoint; normalized_score 6.2 at its "
        "evaluation at 10,000 (`robotrl bench run` resumes it)")
    # a checkpoint that cannot be read: the report goes on, naming it
    (run / "checkpoints" / "last.pt").write_bytes(b"not a checkpoint")
    assert progress(run, 50_000, "normalized_score").startswith(
        "started: its last checkpoint cannot be read (")


def test_list_says_what_is_left_and_only_missing_runs_just_that(pendulum, tmp_path, capsys,
                                                                  monkeypatch):
    """``bench list`` tells a cell finished on another machine (its record committed) from one
    to run, estimates what is left from the finished runs' wall clock (a started run's share of
    it), and ``only=missing`` runs the cells the committed table lacks."""
    import re
    import shutil

    from robotrl.runners.offline import OfflineRunner

    path = write_grid(tmp_path, pendulum, algos=["bc"], seeds=[0, 1, 2], ope_updates=0)
    grid = load_grid(path)
    bench_main(["list", str(path)])  # nothing finished yet: nothing to estimate from
    said = capsys.readouterr()
    assert ("3 cells: 3 todo. Left to run (only=missing): 3 cells; no estimate: none has a "
            "finished run of its algorithm to go by.") in " ".join((said.out + said.err).split())
    bench_main(["run", str(path), "only=0", "figures=false"])
    shutil.move(grid.run_dir(grid.cells()[0]), tmp_path / "elsewhere")  # "another machine"
    original = OfflineRunner._iteration

    def cut_after_one(self):  # noqa: ANN001, ANN202 - Ctrl-C after the first 100 updates
        if self.global_step >= 100:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(OfflineRunner, "_iteration", cut_after_one)
    with pytest.raises(KeyboardInterrupt):
        bench_main(["run", str(path), "only=1"])
    monkeypatch.undo()
    capsys.readouterr()
    bench_main(["list", str(path)])
    said = capsys.readouterr()
    out = " ".join((said.out + said.err).split())
    assert re.search(r"0 committed robotrl bc \S+ 200 s0 -> \S+ \(\d+ min, on [^)]+\)", out), out
    assert re.search(r"1 started robotrl bc \S+ 200 s1 -> \S+ \(50% left, about \d+ min to run\)",
                     out), out
    assert re.search(r"2 todo robotrl bc \S+ 200 s2 -> \S+ \(about \d+ min to run\)", out), out
    assert re.search(r"3 cells: 1 committed, 1 started, 1 todo. Left to run \(only=missing\): 2 "
                     r"cells, about [\d.]+ run-hours", out), out
    ran = []
    monkeypatch.setattr("robotrl.bench.harness.launch", lambda *args: ran.append(args[5]) or 0.0)
    bench_main(["run", str(path), "only=missing", "figures=false"])
    assert ran == [[1, 2]]
    # the report commits how far the cut run got; on a machine without that run, it no longer
    # says `bench run` resumes it (there it starts over)
    bench_main(["report", str(path), "figures=false"])
    assert "at 100 (`robotrl bench run` resumes it)" in grid.report_path.read_text()
    shutil.move(grid.run_dir(grid.cells()[1]), tmp_path / "elsewhere-1")
    for _ in range(2):  # and says so once, however often the report is written
        bench_main(["report", str(path), "figures=false"])
        text = " ".join(grid.report_path.read_text().split())
        assert re.search(r"s1: started: 100 of 200 steps at its last checkpoint; normalized_score "
                         r"100.0 at its evaluation at 100 on another machine \(its checkpoint is "
                         r"not here: `robotrl bench run` starts it over\)", text), text


def test_list_estimates_an_unrun_task_from_another_committed_grid(pendulum, tmp_path, capsys):
    """A cell this grid has not run on its task yet is estimated from the same (runner, algo,
    task, budget) in another results file beside the grid's (``as in`` that grid), before the
    grid's runs of the algorithm on other tasks; files that are not results files are passed
    over."""
    import json

    path = write_grid(tmp_path, pendulum, seeds=[0, 1], ope_updates=0)
    grid = load_grid(path)
    bc = next(c for c in grid.cells() if c.algo == "bc")
    same = {"runner": bc.runner, "algo": "bc", "target": bc.target, "budget": bc.budget}
    records = [dict(same, seed=0, final=1.0, train_seconds=540.0),
               dict(same, seed=1, final=1.0, train_seconds=660.0),
               dict(same, seed=2, train_seconds=6000.0),  # unfinished: not counted
               dict(same, budget=bc.budget * 10, seed=0, final=1.0, train_seconds=9000.0)]
    folder = grid.results_path.parent
    folder.mkdir(parents=True)
    (folder / "earlier.json").write_text(json.dumps({"grid": "earlier", "records": records}))
    (folder / "notes.json").write_text(json.dumps([1, 2, 3]))
    (folder / "broken.json").write_text("{")
    bench_main(["list", str(path)])
    said = capsys.readouterr()
    out = " ".join((said.out + said.err).split())
    assert out.count("(about 10 min to run as in earlier)") == 2, out  # mean of 9 and 11 min
    assert "td3bc" in out and out.count("min to run") == 2, out  # nothing to go by for td3bc


def test_list_estimates_a_cell_only_from_runs_of_its_config(pendulum, tmp_path, capsys):
    """Another grid's runs of the same (algo, task, budget) estimate a cell only where they ran
    the config this grid composes for their seed (a run evaluated over 150 episodes, or of a
    tuned file since changed, costs otherwise); the grid's own results file counts too, for
    seeds it does not list today."""
    import dataclasses
    import json

    from robotrl.bench.harness import composed
    from robotrl.experiment import config_digest

    path = write_grid(tmp_path, pendulum, seeds=[0], ope_updates=0)
    grid = load_grid(path)
    bc = next(c for c in grid.cells() if c.algo == "bc")
    same = {"runner": bc.runner, "algo": "bc", "target": bc.target, "budget": bc.budget}
    digest = config_digest(composed(grid, dataclasses.replace(bc, seed=5)))
    assert digest != config_digest(composed(grid, bc))  # the seed is in the digest
    folder = grid.results_path.parent
    folder.mkdir(parents=True)
    other = [dict(same, seed=5, final=1.0, train_seconds=5400.0, config="0" * 16),
             dict(same, seed=5, final=1.0, train_seconds=600.0, config=digest)]
    (folder / "earlier.json").write_text(json.dumps({"grid": "earlier", "records": other}))

    def listed() -> str:
        bench_main(["list", str(path)])
        said = capsys.readouterr()
        return " ".join((said.out + said.err).split())

    out = listed()
    assert "(about 10 min to run as in earlier)" in out, out  # not (90 + 10) / 2
    grid.results_path.write_text(json.dumps({"grid": grid.name, "records": [
        dict(same, seed=4, final=1.0, train_seconds=1200.0,
             config=config_digest(composed(grid, dataclasses.replace(bc, seed=4))))]}))
    out = listed()
    assert "(about 20 min to run as in its committed runs)" in out, out


def test_the_results_file_is_merged_and_written_one_process_at_a_time(pendulum, tmp_path):
    """Two `bench run only=N` of one grid finishing together each read the results file, merge
    their runs in and replace it: the read-merge-write waits for the grid's results lock."""
    import threading

    from robotrl.checkpoint import waiting_lock

    path = write_grid(tmp_path, pendulum)
    results = tmp_path / "committed" / "results.json"
    done = threading.Event()
    with waiting_lock(tmp_path / "bench" / ".results.lock"):
        writer = threading.Thread(target=lambda: (bench_main(["report", str(path)]), done.set()))
        writer.start()
        assert not done.wait(1.0) and not results.exists()  # waits while another holds it
    writer.join(60)
    assert done.is_set() and json.loads(results.read_text())["grid"] == "tiny-offline"
