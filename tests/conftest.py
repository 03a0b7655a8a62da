"""Test-wide settings and the small training configs the end-to-end tests share."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from robotrl.config import TrainConfig, from_dict

# One intra-op thread: the tests' tensors are small, and torch's worker threads only contend
# with the simulator's pool and with each other on CI's 2 cores (measured: a 64-block residual
# net export takes 8.7 s with the default threads, 0.5 s with one).
torch.set_num_threads(1)

SMALL_ALGOS: dict[str, dict[str, Any]] = {
    "ppo": {"num_steps": 8, "actor_hidden": [32, 32], "critic_hidden": [32, 32]},
    "trpo": {"num_steps": 8, "actor_hidden": [32, 32], "critic_hidden": [32, 32],
             "critic_minibatches": 4},
    # small nets, fast targets (tau .05) and high learning rates: InvertedPendulum in 4k steps
    # (the SAC defaults, like Stable-Baselines3's SAC, are still near 100 there after 5k steps)
    "sac": {"num_steps": 8, "actor_hidden": [64, 64], "critic_hidden": [64, 64],
            "batch_size": 128, "learning_starts": 500, "actor_lr": 3e-3, "critic_lr": 3e-3,
            "alpha_lr": 1e-3, "init_alpha": 0.05, "tau": 0.05},
    "crossq": {"num_steps": 8, "actor_hidden": [64, 64], "critic_hidden": [128, 128],
               "batch_size": 128, "learning_starts": 500, "init_alpha": 0.05},
    # FastTD3 on 4 worlds: more updates per transition than its many-world default
    "fasttd3": {"num_steps": 8, "actor_hidden": [64, 64], "critic_hidden": [64, 64],
                "batch_size": 256, "learning_starts": 500, "utd_ratio": 0.5, "v_min": -10.0,
                "v_max": 110.0, "actor_lr": 1e-3, "critic_lr": 1e-3},
}
"""Per-algorithm settings of the fast InvertedPendulum runs."""


def small_config(run_dir: Path, name: str = "ppo", algo: dict[str, Any] | None = None,
                 **over: Any) -> TrainConfig:
    """A fast InvertedPendulum run of algorithm ``name`` (4 worlds, 6 iterations of 32 steps,
    no TensorBoard or progress bar); ``algo`` replaces algorithm keys, ``over`` top-level keys."""
    algo_cfg = {"name": name, **SMALL_ALGOS[name], **(algo or {})}
    data = {
        "algo": algo_cfg,
        "env": {"task": "inverted_pendulum", "options": {}},
        "logger": {"tensorboard": False, "progress": False, "log_interval": 1},
        "num_envs": 4,
        "total_steps": 6 * 32,
        "run_dir": str(run_dir),
        "checkpoint_interval": 1000,
        "eval_episodes": 2,
        **over,
    }
    return from_dict(TrainConfig, data)


@pytest.fixture
def make_config() -> Callable[..., TrainConfig]:
    """``small_config`` as a fixture: ``make_config(run_dir, algo="sac", total_steps=...)``."""
    return small_config
