"""``benchmarks/eval_modes.py``: a SAC checkpoint's mean and sampled actions on the same worlds."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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


def test_load_trained_seeds_worlds_as_the_run_and_refuses_unknown_options(tmp_path, make_config):
    from robotrl.experiment import load_trained
    from robotrl.seeding import derive_seed

    Experiment(make_config(tmp_path / "run", "ppo", seed=7)).run()
    ckpt = str(tmp_path / "run" / "checkpoints" / "last.pt")
    run = load_trained(ckpt, 2)  # no seed: the run's own
    assert run.seeds == {"root": 7, "eval-env": derive_seed(7, "eval-env"),
                         "eval-reset": derive_seed(7, "eval-reset")}
    assert run.env.num_envs == 2 and run.cfg.seed == 7
    first = run.reset()["policy"]
    again = load_trained(ckpt, 2)  # the same worlds from the same streams
    assert torch.equal(again.reset()["policy"], first)
    assert load_trained(ckpt, 2, seed=3).seeds["root"] == 3
    with pytest.raises(ValueError, match="bogus"):
        load_trained(ckpt, 2, options={"bogus": 1})
