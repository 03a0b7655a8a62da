"""Config errors fail before training, naming the key and the allowed values."""

from __future__ import annotations

import subprocess
import sys

import pytest

from robotrl.config import (
    EnvConfig,
    TrainConfig,
    from_dict,
    resolve_randomization,
    to_dict,
)
from robotrl.experiment import ConfigError, check_overrides, validate


def test_unknown_top_level_key() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'num_env'.*allowed top-level keys.*num_envs"):
        check_overrides(["num_env=8"])


def test_unknown_group_option_lists_available() -> None:
    with pytest.raises(ConfigError, match=r"unknown env 'cheetah'; available: \[.*'halfcheetah'"):
        check_overrides(["env=cheetah"])
    with pytest.raises(ConfigError, match="unknown algo 'dqn'"):
        check_overrides(["algo=dqn"])


def test_unknown_nested_key() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'algo.learning_rat'.*learning_rate"):
        check_overrides(["algo.learning_rat=1e-3"])
    with pytest.raises(ConfigError, match="allowed keys in backend"):
        check_overrides(["backend.threads=2"])
    # policy fields are those of the chosen policy family (none for the algorithm's MLP)
    check_overrides(["algo=bc", "policy=vla", "policy.bins=32", "policy.keypoints=0"])
    with pytest.raises(ConfigError, match=r"unknown config key 'policy.bin'.*'bins'"):
        check_overrides(["policy=vla", "policy.bin=32"])
    with pytest.raises(ConfigError, match=r"allowed keys in policy: \[\]"):
        check_overrides(["policy.bins=32"])


def test_valid_overrides_pass() -> None:
    check_overrides(["algo=ppo", "env=hopper", "num_envs=8", "seed=3", "algo.learning_rate=1e-3",
                     "env.options.ctrl_cost_weight=0.2", "hydra.run.dir=/tmp/x", "seed=0,1,2"])


def test_from_dict_types() -> None:
    base = to_dict(from_dict(TrainConfig, {"algo": {"name": "ppo"}}))
    assert from_dict(TrainConfig, base).algo == from_dict(TrainConfig, base).algo
    bad = dict(base, num_envs="many")
    with pytest.raises(TypeError, match="num_envs: expected an integer"):
        from_dict(TrainConfig, bad)
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['colour'\] in env"):
        from_dict(TrainConfig, dict(base, env={"task": "hopper", "colour": 1}))
    with pytest.raises(TypeError, match="algo.learning_rate: expected a number"):
        from_dict(TrainConfig, dict(base, algo={"name": "ppo", "learning_rate": "fast"}))


def test_validate_values() -> None:
    cfg = from_dict(TrainConfig, {"algo": {"name": "ppo"}})
    validate(cfg)
    cfg.env = EnvConfig(task="halfcheeta")
    with pytest.raises(ValueError, match="unknown task 'halfcheeta'; available tasks"):
        validate(cfg)
    cfg.env = EnvConfig()
    cfg.num_envs = 0
    with pytest.raises(ValueError, match="num_envs must be >= 1"):
        validate(cfg)
    cfg.num_envs = 4
    cfg.randomization = resolve_randomization("locomotion")
    for backend in ("mujoco", "mjx", "brax"):  # the backends with per-world model fields
        cfg.backend.name = backend
        validate(cfg)
    cfg.backend.name = "gymnasium"
    with pytest.raises(ValueError, match="randomization needs backend=mujoco, mjx or brax"):
        validate(cfg)


def test_cli_reports_bad_key_before_training(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "robotrl.cli.main", "train", "algo.clip=0.3", f"run_dir={tmp_path}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "config error: unknown config key 'algo.clip'" in proc.stderr
    assert not (tmp_path / "config.yaml").exists()


@pytest.mark.parametrize("key", ["env.options", "env.train_options"])
def test_cli_reports_an_unknown_task_option_before_training(tmp_path, key) -> None:
    """Checked before the run directory is made (it was found only when the worlds were built:
    a traceback, exit 1)."""
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "robotrl.cli.main", "train", "env=reacher", f"{key}.bogus=1",
         f"run_dir={run}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "config error: unknown option(s) ['bogus'] for task 'reacher'" in proc.stderr
    assert "'max_episode_steps'" in proc.stderr and "Traceback" not in proc.stderr
    assert not run.exists()


def test_cli_reports_bad_type_before_training(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "robotrl.cli.main", "train", "num_envs=lots", f"run_dir={tmp_path}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "num_envs: expected an integer" in proc.stderr


@pytest.mark.parametrize("algo, new", [("ppo", "rollout_steps"), ("sac", "collect_steps"),
                                       ("iql", "updates_per_iteration"), ("grpo", "horizon")])
def test_num_steps_names_its_new_key(algo, new):
    """``algo.num_steps`` meant four things; the command line names what it became."""
    with pytest.raises(ConfigError, match=f"algo.num_steps was renamed: algo={algo} calls it "
                                          f"algo.{new}"):
        check_overrides([f"algo={algo}", "algo.num_steps=8"])
    check_overrides([f"algo={algo}", f"algo.{new}=8"])


def test_a_config_saved_before_the_rename_reads_with_the_new_key():
    saved = to_dict(TrainConfig(algo=from_dict(TrainConfig, {"algo": {"name": "trpo"}}).algo))
    saved["algo"]["num_steps"] = saved["algo"].pop("rollout_steps") + 3
    assert from_dict(TrainConfig, saved).algo.rollout_steps == 131
