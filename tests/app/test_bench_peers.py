"""robotrl bench's Stable-Baselines3 peer (benchmarks/peers/sb3.py) on one tiny cell: run by the
harness in its own process, it writes the result.json robotrl's runs write (the same keys,
evaluations on robotrl's schedule, written atomically), which collect and the report read like
a robotrl cell's."""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("stable_baselines3")

from robotrl.bench.grid import ROBOTRL, Cell, load_grid  # noqa: E402
from robotrl.bench.harness import collect, progress, run_cell  # noqa: E402
from robotrl.bench.report import report  # noqa: E402
from robotrl.experiment.run import machine  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "peers" / "sb3.py"
BUDGET = 300


def test_sb3_peer_cell_reads_like_a_robotrl_cell(tmp_path):
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text(yaml.safe_dump({
        "name": "tiny-peers", "out": str(tmp_path / "bench"), "algos": ["sac"],
        "tasks": ["inverted_pendulum"], "seeds": [0], "budgets": [BUDGET],
        "overrides": ["eval_episodes=2", "algo.learning_starts=100", "algo.batch_size=32",
                      "logger.tensorboard=false"],
        "peers": {"sb3": {"script": str(SCRIPT), "algos": {"sac": "SAC"}, "options": {
            "episodes": 2, "eval_every": 100,
            "hyperparams": {"SAC": {"learning_starts": 100, "batch_size": 32,
                                    "policy_kwargs": {"net_arch": [32, 32]}}}}}}}))
    grid = load_grid(grid_file)
    peer, ours = (Cell(r, "sac", "inverted_pendulum", 0, BUDGET) for r in ("sb3", ROBOTRL))
    assert grid.cells() == [ours, peer]

    done = run_cell(grid, peer)
    run = grid.run_dir(peer)
    failed = run / "failed.json"
    assert done is not None, failed.read_text() if failed.exists() else "no failed.json"
    result = json.loads((run / "result.json").read_text())
    assert result == done
    assert set(result) == {"step", "total_steps", "final", "train_seconds", "evaluations",
                           "machine"}
    assert result["step"] == result["total_steps"] == BUDGET  # one env: exactly the budget
    assert result["machine"] == machine()
    evals = result["evaluations"]
    assert [e["step"] for e in evals] == [100, 200, 300]  # every eval_every steps, the last at the end
    progress = [line for line in (run / "peer.log").read_text().splitlines()
                if f" of {BUDGET} steps, " in line]  # one line per evaluation, while it runs
    assert [line.split(" of ")[0] for line in progress] == ["100", "200", "300"]
    assert progress[-1].endswith(f"return_mean {evals[-1]['return_mean']:.1f}")
    assert all(e["episodes"] == 2 for e in evals)
    seconds = [e["seconds"] for e in evals]
    assert seconds == sorted(seconds) and 0 <= seconds[-1] <= result["train_seconds"]
    final = result["final"]
    assert {"return_mean", "return_std", "length_mean", "episodes", "best"} <= set(final)
    assert final["return_mean"] == evals[-1]["return_mean"]
    assert final["best"] == max(e["return_mean"] for e in evals)
    assert not list(run.glob(".*.tmp"))  # written through a temporary file, replaced
    hp = json.loads((run / "hyperparams.json").read_text())
    assert hp["hyperparams"]["learning_starts"] == 100 and "options.hyperparams.SAC" in hp["source"]

    # our own cell of the grid: the same keys at both levels
    mine = run_cell(grid, ours)
    assert mine is not None and set(mine) == set(result) | {"config"}  # ours: its config digest
    assert set(mine["final"]) == set(final)

    records = {r["runner"]: r for r in collect(grid)}
    record = records["sb3"]
    assert record["steps"] == BUDGET and record["final"] == final["return_mean"]
    assert record["best"] == final["best"] and record["curve"]["steps"] == [100, 200, 300]
    text, summary = report(grid, list(records.values()), with_figures=False, reps=200)
    assert summary["budgets"][str(BUDGET)]["cells"]["inverted_pendulum|sac@sb3"]["seeds"] == 1
    assert "| task | sac | sac@sb3 |" in text and "sac > sac@sb3" in text
    row = next(line for line in text.splitlines() if line.startswith("| inverted_pendulum "))
    assert row.count("(n=1, ") == 2 and "[" not in row  # one run each: no interval shown


LOAD_PEER = """
import importlib.util, json, sys, types
spec = importlib.util.spec_from_file_location("sb3_peer", sys.argv[1])
peer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer)
"""
"""The preamble of the scripts below: the peer script (argv[1]) loaded as ``peer``."""

MAPPING = LOAD_PEER + """
hp, source, notes = peer.hyperparameters(peer.PeerCell(sys.argv[2]), 1)
print(json.dumps({"n_envs": hp["n_envs"], "n_steps": hp["n_steps"], "source": source}))
"""


@pytest.mark.parametrize(("options", "expected"), [
    ({}, (4, 8)),                # ours' shape: 4 worlds x 8 steps
    ({"n_envs": 2}, (2, 16)),    # asked for: the same batch, a longer rollout per sub-env
])
def test_sb3_peer_collects_our_rollout_shape(tmp_path, options, expected):
    """Mapped onto SB3, our PPO config keeps its rollout's shape unless a grid asks otherwise:
    GAE stops at the rollout's end, so 128 x 16 and 8 x 256 are different learners."""
    cell = tmp_path / "cell.json"
    cell.write_text(json.dumps({
        "algo": "PPO", "our_algo": "ppo", "target": "inverted_pendulum", "offline": False,
        "seed": 0, "budget": 1000, "run_dir": str(tmp_path / "run"),
        "options": {"overrides": {"ppo": ["num_envs=4", "algo.rollout_steps=8"]}, **options}}))
    out = subprocess.run([sys.executable, "-c", MAPPING, str(SCRIPT), str(cell)], check=True,
                         capture_output=True, text=True).stdout
    mapped = json.loads(out.strip().splitlines()[-1])
    assert (mapped["n_envs"], mapped["n_steps"]) == expected
    assert "robotrl's composed config" in mapped["source"]


TRUST_REGION = LOAD_PEER + """
hp, source, notes = peer.hyperparameters(peer.PeerCell(sys.argv[2]), 6)
model = types.SimpleNamespace(target_kl=None)
radii = []
for done in (4096, 500_000, 1_000_000):  # the steps collected when each update is made
    model.num_timesteps = done
    peer.anneal_target_kl(model, hp, 1_000_000)
    radii.append(model.target_kl)
print(json.dumps({"target_kl": hp["target_kl"], "cg_damping": hp["cg_damping"], "radii": radii}))
"""


@pytest.mark.parametrize(("overrides", "schedule"), [
    ([], "linear"),                            # configs/tuned/trpo_walker2d.yaml anneals
    pytest.param(["algo.kl_schedule=fixed"], "fixed", marks=pytest.mark.slow),
])
def test_sb3_trpo_peer_anneals_its_trust_region_as_ours_does(tmp_path, overrides, schedule):
    """Our TRPO config with an annealed trust region (walker2d's tuned file) maps onto
    sb3-contrib's TRPO with ``target_kl`` annealed the same way before every update: the radius
    each of ours' updates uses (``KL_SCHEDULES`` at the fraction of the budget collected),
    over sb3-contrib's per-dimension KL (its Fisher matrix, so its damping, too); a fixed
    radius stays fixed."""
    cell = tmp_path / "cell.json"
    cell.write_text(json.dumps({
        "algo": "TRPO", "our_algo": "trpo", "target": "walker2d", "offline": False,
        "seed": 0, "budget": 1_000_000, "run_dir": str(tmp_path / "run"),
        "options": {"overrides": {"trpo": overrides}}}))
    out = subprocess.run([sys.executable, "-c", TRUST_REGION, str(SCRIPT), str(cell)],
                         check=True, capture_output=True, text=True).stdout
    mapped = json.loads(out.strip().splitlines()[-1])
    base = 0.09 / 6  # the tuned file's max_kl on the summed KL, over 6 action dimensions
    assert mapped["target_kl"] == pytest.approx(base)
    assert mapped["cg_damping"] == pytest.approx(0.1 / 6)  # ours' 0.1 on the summed KL
    if schedule == "linear":
        assert mapped["radii"] == pytest.approx([base * (1 - 4096 / 1e6), base / 2, 0.0])
    else:  # sb3-contrib's own fixed target_kl, never touched
        assert mapped["radii"] == [None, None, None]


def _peer_cell(run: Path, algo: str, seed: int = 0) -> Path:
    run.mkdir(parents=True)
    (run / "cell.json").write_text(json.dumps({
        "algo": algo, "our_algo": algo.lower(), "target": "hopper", "offline": False,
        "seed": seed, "budget": 600, "run_dir": str(run), "options": {
            "episodes": 2, "eval_every": 200, "hyperparams": {algo: {
                "learning_starts": 100, "batch_size": 32, "policy_kwargs": {"net_arch": [32, 32]}}}}}))
    return run / "cell.json"


@pytest.mark.parametrize("algo", ["SAC", pytest.param("CrossQ", marks=pytest.mark.slow)])
def test_an_interrupted_off_policy_peer_cell_resumes_as_if_never_stopped(tmp_path, algo):
    """Killed after its first evaluation saved its state, an off-policy SB3 cell run again ends
    with the uninterrupted run's evaluations, bit for bit: networks, optimizers, replay buffer,
    counters, random generators, the update after the save, and the world mid-episode."""
    pytest.importorskip("sb3_contrib")
    whole = _peer_cell(tmp_path / "whole", algo)
    subprocess.run([sys.executable, str(SCRIPT), str(whole)], check=True, capture_output=True)
    cut = _peer_cell(tmp_path / "cut", algo)
    state = cut.parent / "peer_state.pt"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(cut)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    while not (cut.parent / "peer_progress.json").exists() and proc.poll() is None:  # saved last
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    assert state.exists() and not (cut.parent / "result.json").exists()
    log = subprocess.run([sys.executable, str(SCRIPT), str(cut)], check=True, capture_output=True,
                         text=True).stdout
    assert "resuming at " in log
    uninterrupted, resumed = (json.loads((c.parent / "result.json").read_text())
                              for c in (whole, cut))
    assert [e["step"] for e in resumed["evaluations"]] == [200, 400, 600]
    assert ([e["return_mean"] for e in resumed["evaluations"]]
            == [e["return_mean"] for e in uninterrupted["evaluations"]])
    assert [r["step"] for r in resumed["resumed"]] == [200] and "resumed" not in uninterrupted
    assert resumed["machine"] == machine() and not state.exists()  # spent once the cell is done
    assert progress(cut.parent, 600, "return_mean") is None


def test_a_peer_state_of_another_cell_is_not_resumed(tmp_path):
    """A saved state resumes only the cell it was saved for; another cell starts over."""
    sys.path.insert(0, str(SCRIPT.parents[1]))
    try:
        from common import PeerCell
    finally:
        sys.path.pop(0)
    mine = PeerCell(_peer_cell(tmp_path / "run", "SAC"))
    mine.start()
    mine.evaluations.append({"step": 200, "seconds": 1.0, "return_mean": 5.0})
    mine.next_eval = 400
    mine.save_state(200, {"weights": np.arange(3.0)})
    again = PeerCell(tmp_path / "run" / "cell.json")
    step, state = again.load_state()
    assert step == 200 and again.next_eval == 400 and again.evaluations == mine.evaluations
    assert state["weights"].tolist() == [0.0, 1.0, 2.0]
    assert progress(tmp_path / "run", 600, "return_mean") == (
        "started: 200 of 600 steps at its saved state; return_mean 5.0 at its evaluation at 200"
        " (`robotrl bench run` resumes it)")
    other = tmp_path / "other"
    other.mkdir()
    (other / "cell.json").write_text((tmp_path / "run" / "cell.json").read_text().replace(
        '"seed": 0', '"seed": 1').replace(str(tmp_path / "run"), str(other)))
    (other / PeerCell.STATE).write_bytes((tmp_path / "run" / PeerCell.STATE).read_bytes())
    assert PeerCell(other / "cell.json").load_state() is None
