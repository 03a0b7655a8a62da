"""The offline grids (benchmarks/grids/offline.yaml, offline_vs_d3rlpy.yaml) and the d3rlpy peer
(benchmarks/peers/d3rlpy.py): the peer's hyperparameters are ours, field for field; a grid with
a d3rlpy cell runs end to end and reports it (``pytest -m reference``, with
``$ROBOTRL_D3RLPY_PYTHON`` the d3rlpy 2.8.1 venv's interpreter)."""

import ast
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from robotrl.bench.grid import ROBOTRL, Cell, load_grid
from robotrl.bench.harness import cell_overrides, progress
from robotrl.cli.bench import bench_main
from robotrl.experiment.compose import compose
from robotrl.registry import algo_config_class

ROOT = Path(__file__).resolve().parents[2]
GRIDS = ROOT / "benchmarks" / "grids"
PEER = ROOT / "benchmarks" / "peers" / "d3rlpy.py"


def peer_tables() -> dict[str, Any]:
    """The peer's COMMON, DEFAULTS and D3RLPY_ONLY, read from its source (it imports d3rlpy,
    which lives in another venv)."""
    names = {"COMMON", "DEFAULTS", "D3RLPY_ONLY"}
    body = []
    for node in ast.parse(PEER.read_text()).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") in names:
            body.append(ast.copy_location(ast.Assign([node.target], node.value), node))
    namespace: dict[str, Any] = {}
    exec(compile(ast.fix_missing_locations(ast.Module(body, [])), str(PEER), "exec"), namespace)
    assert names <= set(namespace)
    return namespace


def plain(value: Any) -> Any:
    return [float(v) for v in value] if isinstance(value, (tuple, list)) else value


def test_offline_grid_is_the_old_suite():
    grid = load_grid(GRIDS / "offline.yaml")
    assert list(grid.algos) == ["bc", "td3bc", "rebrac", "iql", "cql", "awac", "td3bc_mcep"]
    assert grid.datasets == [f"robotrl/{t}/{k}-v0" for t in ("hopper", "halfcheetah", "walker2d")
                             for k in ("medium", "medium-replay", "expert", "medium-expert")]
    assert (grid.seeds, grid.budgets, grid.metric, grid.ope_updates) == (
        [0, 1, 2], [1_000_000], "normalized_score", 10_000)
    assert len(grid.cells()) == 7 * 12 * 3


def test_peer_runs_our_hyperparameters(pendulum):
    """The peer's defaults are our config classes' (but where d3rlpy has no option), and the
    vs-d3rlpy grid's peer options are exactly the config its robotrl cells compose."""
    tables = peer_tables()
    for algo, defaults in tables["DEFAULTS"].items():
        ours = algo_config_class(algo)()
        for key, value in defaults.items():
            assert plain(getattr(ours, key)) == pytest.approx(plain(value)), (algo, key)
    grid = load_grid(GRIDS / "offline_vs_d3rlpy.yaml")
    peer = grid.peers["d3rlpy"]
    # ReBRAC runs beside them without a peer (d3rlpy has none): issue 45's ReBRAC >= TD3+BC
    assert set(peer.algos) == set(grid.algos) - {"rebrac"} == set(tables["DEFAULTS"])
    for algo in peer.algos:
        cfg = compose(cell_overrides(grid, Cell(ROBOTRL, algo, str(pendulum), 0, 1000)))
        options = peer.options[algo]
        for key, value in options.items():
            assert plain(getattr(cfg.algo, key)) == pytest.approx(plain(value)), (algo, key)
        for key, theirs in tables["D3RLPY_ONLY"].get(algo, {}).items():
            assert plain(getattr(cfg.algo, key)) == plain(theirs), (algo, key)
        for key in tables["DEFAULTS"][algo]:  # fields the grid leaves out: ours' defaults
            if key not in options:
                assert plain(getattr(cfg.algo, key)) == pytest.approx(
                    plain(tables["DEFAULTS"][algo][key])), (algo, key)


def test_every_d3rlpy_variant_grid_matches_the_checked_one():
    """A grid that restates the d3rlpy peer (a grid refuses peer algorithms it does not run, so
    a variant cannot inherit the block) runs each algorithm with offline_vs_d3rlpy.yaml's
    options on both sides: the options checked field for field above."""
    base = load_grid(GRIDS / "offline_vs_d3rlpy.yaml")
    variants = list(map(load_grid, sorted(GRIDS.glob("offline_vs_d3rlpy_*.yaml"))))
    assert variants
    for grid in variants:
        peer, ref = grid.peers["d3rlpy"], base.peers["d3rlpy"]
        assert grid.overrides == base.overrides, grid.name
        for algo in peer.algos:
            assert peer.algos[algo] == ref.algos[algo], (grid.name, algo)
            assert peer.options[algo] == ref.options[algo], (grid.name, algo)
            assert grid.algos[algo] == base.algos[algo], (grid.name, algo)
        for key in ("episodes", "eval_every", "threads", "device"):
            assert peer.options[key] == ref.options[key], (grid.name, key)


@pytest.mark.reference
def test_bc_against_d3rlpy_end_to_end(pendulum, tmp_path):
    """The shipped grid cut to BC, one seed, 200 updates, 2 episodes: both cells run, the
    report has the d3rlpy column with numbers."""
    python = os.environ.get("ROBOTRL_D3RLPY_PYTHON", "")
    if not python or not Path(python).exists():
        pytest.skip("ROBOTRL_D3RLPY_PYTHON (the d3rlpy 2.8.1 venv's python) is not set or "
                    "missing; see benchmarks/grids/offline_vs_d3rlpy.yaml")
    grid = yaml.safe_load((GRIDS / "offline_vs_d3rlpy.yaml").read_text())
    peer = grid["peers"]["d3rlpy"]
    grid.update(name="tiny-vs-d3rlpy", out=str(tmp_path / "bench"), algos={"bc": []},
                datasets=[str(pendulum)], seeds=[0], budgets=[200],
                overrides=["algo.updates_per_iteration=100", "eval_interval=1", "checkpoint_interval=1",
                           "eval_episodes=2", "logger.tensorboard=false"],
                results=str(tmp_path / "results.json"), report=str(tmp_path / "report.md"))
    grid.pop("orderings")  # between algorithms this cut does not run (a grid naming them fails)
    peer.update(script=str(PEER), algos={"bc": "BC"})
    peer["options"] = {"episodes": 2, "eval_every": 100, "threads": 1,
                       "bc": peer["options"]["bc"]}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    bench_main(["run", str(path), "figures=false"])

    records = {r["runner"]: r for r in json.loads((tmp_path / "results.json").read_text())
               ["records"]}
    assert set(records) == {"robotrl", "d3rlpy"}
    theirs = records["d3rlpy"]
    assert theirs["steps"] == 200 and theirs["curve"]["steps"] == [100, 200]
    assert math.isfinite(theirs["final"]) and theirs["train_seconds"] > 0 and theirs["machine"]
    cell = load_grid(path).run_dir(Cell("d3rlpy", "bc", str(pendulum), 0, 200))
    result = json.loads((cell / "result.json").read_text())
    assert result["peer"]["hyperparameters"] == {**peer_tables()["DEFAULTS"]["bc"],
                                                 **grid["peers"]["d3rlpy"]["options"]["bc"]}
    report = (tmp_path / "report.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| dataset"))
    assert header.split("|")[2:4] == [" bc ", " bc@d3rlpy "]
    row = next(line for line in report.splitlines() if line.startswith(f"| {pendulum}"))
    # one seed a side: the score and n=1, no interval
    assert all(re.match(r" -?\d+\.\d \(n=1, \d+\.\d min\) ", c) for c in row.split("|")[2:4]), row
    assert "- bc > bc@d3rlpy:" in report


def _tensors(value: Any, where: str = "") -> dict[str, Any]:
    """Every tensor in a nest of dicts and lists, by its path."""
    import torch

    if isinstance(value, torch.Tensor):
        return {where: value}
    items = value.items() if isinstance(value, dict) else (
        enumerate(value) if isinstance(value, (list, tuple)) else ())
    return {k: v for key, item in items for k, v in _tensors(item, f"{where}/{key}").items()}


@pytest.mark.reference
@pytest.mark.parametrize(("algo", "theirs"), [("td3bc", "TD3PlusBC"), ("iql", "IQL")])
def test_an_interrupted_d3rlpy_cell_resumes_as_if_never_stopped(pendulum, tmp_path, algo, theirs):
    """Killed after its first evaluation saved its state (at an odd update: TD3+BC's actor
    updates every second one), a d3rlpy cell run again ends with the uninterrupted run's
    evaluations and weights, optimizers and IQL's learning-rate schedule included, bit for bit."""
    import subprocess
    import time

    import torch

    python = os.environ.get("ROBOTRL_D3RLPY_PYTHON", "")
    if not python or not Path(python).exists():
        pytest.skip("ROBOTRL_D3RLPY_PYTHON (the d3rlpy 2.8.1 venv's python) is not set or "
                    "missing; see benchmarks/grids/offline_vs_d3rlpy.yaml")
    options = yaml.safe_load((GRIDS / "offline_vs_d3rlpy.yaml").read_text())["peers"]["d3rlpy"][
        "options"][algo]

    def cell(name: str) -> Path:
        run = tmp_path / name
        run.mkdir()
        (run / "cell.json").write_text(json.dumps({
            "algo": theirs, "our_algo": algo, "target": str(pendulum), "offline": True,
            "seed": 0, "budget": 303, "run_dir": str(run), "options": {
                "episodes": 1, "eval_every": 101, "threads": 1, algo: options}}))
        return run

    whole, cut = cell("whole"), cell("cut")
    subprocess.run([python, str(PEER), str(whole / "cell.json")], check=True,
                   capture_output=True)
    proc = subprocess.Popen([python, str(PEER), str(cut / "cell.json")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not (cut / "peer_progress.json").exists() and proc.poll() is None:  # saved last
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    assert (cut / "peer_state.pt").exists() and not (cut / "result.json").exists()
    assert progress(cut, 303, "return_mean").startswith(  # bench list/report: how far it got
        "started: 101 of 303 steps at its saved state; return_mean ")
    out = subprocess.run([python, str(PEER), str(cut / "cell.json")], check=True,
                         capture_output=True, text=True).stdout
    assert "resuming at 101 of 303 updates" in out
    uninterrupted, resumed = (json.loads((run / "result.json").read_text())
                              for run in (whole, cut))
    assert ([e["return_mean"] for e in resumed["evaluations"]]
            == [e["return_mean"] for e in uninterrupted["evaluations"]])
    assert [r["step"] for r in resumed["resumed"]] == [101] and "resumed" not in uninterrupted
    assert not (cut / "peer_state.pt").exists() and progress(cut, 303, "return_mean") is None
    mine, ref = (_tensors(torch.load(run / "model.pt", weights_only=True)) for run in (cut, whole))
    assert mine.keys() == ref.keys() and all(torch.equal(mine[k], ref[k]) for k in ref)
