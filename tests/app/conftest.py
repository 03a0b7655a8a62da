"""Fixtures of the application tests: a small dataset with reference returns."""

from pathlib import Path

import pytest
import torch

from robotrl.data import DatasetCard, save_hdf5
from robotrl.envs import make
from robotrl.runners.collect import collect


@pytest.fixture(scope="session")
def pendulum(tmp_path_factory) -> Path:
    """2,000 noisy PD-controller transitions of InvertedPendulum, with reference returns."""
    env = make("inverted_pendulum", 8, seed=0)
    gains = torch.tensor([0.5, 5.0, 0.5, 0.5])
    card = DatasetCard(task="InvertedPendulum-v5", kind="expert", policy="PD controller",
                       ref_min_score=5.0, ref_max_score=1000.0)
    data = collect(env, lambda o: (o["policy"] * gains).sum(-1, keepdim=True).clamp(-3, 3),
                   2000, card, seed=0, action_noise=0.3, progress=False)
    return save_hdf5(data, tmp_path_factory.mktemp("data") / "pend.hdf5")
