"""Fixtures shared by the VLA tests."""

from collections.abc import Callable
from typing import Any

import pytest
import torch


def _round(alg: Any, env: Any, obs: Any, outcomes: list[float]) -> Any:
    """One GRPO round from ``obs`` (every world to the episode limit), scored by the fixed
    ``outcomes`` (one per world: groups differ); the next observations."""
    with torch.inference_mode():
        for _ in range(env.spec.max_episode_steps):
            out = env.step(alg.act(obs))
            alg.process_env_step(out.reward, out.terminated, out.truncated, out.info["final_obs"])
            obs = out.obs
        alg.end_round(torch.tensor(outcomes))
    return obs


@pytest.fixture
def grpo_round() -> Callable[..., Any]:
    """``grpo_round(alg, env, obs, outcomes)``: one round of GRPO rollouts, not yet updated."""
    return _round
