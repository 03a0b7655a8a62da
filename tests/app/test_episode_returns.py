"""``benchmarks/episode_returns.py``: a checkpoint's per-episode returns, on the run's own
evaluation worlds, and the episodes in which a watched observation left a range."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from robotrl.experiment import Experiment

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "episode_returns.py"


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=300)


def test_per_episode_returns_average_to_the_runs_score(tmp_path, make_config):
    Experiment(make_config(tmp_path / "run", "ppo", total_steps=192, seed=7)).run()
    ckpt = tmp_path / "run" / "checkpoints" / "last.pt"
    out = tmp_path / "episodes.json"
    proc = run_script(str(ckpt), "--episodes", "3", "--watch", "0", "--limit", "-1",
                      "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert len(record["return"]) == len(record["length"]) == 3
    # the run's own evaluation worlds: the mean is what `robotrl eval` (no seed) scores
    evaluated = subprocess.run([sys.executable, "-m", "robotrl.cli.main", "eval",
                                f"checkpoint={ckpt}", "episodes=3", f"out={tmp_path / 'eval.json'}"],
                               capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr
    assert sum(record["return"]) / 3 == \
        pytest.approx(json.loads((tmp_path / "eval.json").read_text())["return_mean"])
    # every magnitude exceeds -1: each episode counts, from its first step
    assert record["first_step"] == [0, 0, 0]
    assert "3 of 3" in proc.stdout
    early = sum(length < record["max_episode_steps"] for length in record["length"])
    assert f"ended before {record['max_episode_steps']} steps: {early} of 3" in proc.stdout

    beyond = run_script(str(ckpt), "--episodes", "2", "--watch", "999", "--limit", "1")
    assert beyond.returncode != 0 and "--watch 999 is outside" in beyond.stderr
    assert "Traceback" not in beyond.stderr
    alone = run_script(str(ckpt), "--watch", "1")
    assert alone.returncode == 2 and "go together" in alone.stderr
