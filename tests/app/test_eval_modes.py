"""``benchmarks/eval_modes.py``: a SAC checkpoint's mean and sampled actions on the same worlds."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from robotrl.experiment import Experiment

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "eval_modes.py"


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("algo", ["sac", "ppo"])
def test_mean_and_sampled_actions_on_the_same_worlds(tmp_path, make_config, algo):
    Experiment(make_config(tmp_path / "run", algo, total_steps=600 if algo == "sac" else 192,
                           checkpoint_interval=1)).run()
    ckpt = tmp_path / "run" / "checkpoints" / "last.pt"
    out = tmp_path / "modes.json"
    proc = run_script(str(ckpt), "--episodes", "3", "--out", str(out))
    if algo == "ppo":  # its actor is not a sampler the script knows: one line, no traceback
        assert proc.returncode != 0 and "SAC and CrossQ" in proc.stderr
        assert "Traceback" not in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["mean"]["episodes"] == result["sampled"]["episodes"] == 3
    # the mean action is the one `robotrl eval` scores, on the same seeded worlds
    evaluated = subprocess.run([sys.executable, "-m", "robotrl.cli.main", "eval", f"checkpoint={ckpt}",
                                "episodes=3", f"out={tmp_path / 'eval.json'}"],
                               capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads((tmp_path / "eval.json").read_text())["return_mean"] == \
        pytest.approx(result["mean"]["return_mean"])
    assert result["sampled"]["return_mean"] != result["mean"]["return_mean"]
