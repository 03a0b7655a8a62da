"""Fast checks of the contact and pendulum tasks: shapes, contact terms, termination, auto-reset."""

from __future__ import annotations

import math

import mujoco
import pytest
import torch

import robotrl.envs as E


def _qpos_columns(env: E.BatchedEnv) -> slice:
    """Columns of ``get_state`` (mjSTATE_FULLPHYSICS: time, qpos, qvel, ...) that hold qpos."""
    model = env.task.model
    start = mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_TIME)
    return slice(start, start + model.nq)


@pytest.mark.parametrize(
    ("task", "obs_dim", "act_dim"),
    [
        ("ant", 105, 8),
        ("humanoid", 348, 17),
        ("inverted_pendulum", 4, 1),
        ("inverted_double_pendulum", 9, 1),
    ],
)
def test_obs_shapes(task: str, obs_dim: int, act_dim: int) -> None:
    env = E.make(task, num_envs=3, seed=0)
    assert env.spec.obs_dim == obs_dim and env.spec.action_dim == act_dim
    obs = env.reset(seed=1)["policy"]
    assert obs.shape == (3, obs_dim) and obs.dtype == torch.float32
    out = env.step(torch.zeros(3, act_dim))
    assert out.obs["policy"].shape == out.info["final_obs"]["policy"].shape == (3, obs_dim)
    assert set(out.info["reward_terms"]) == set(env.spec.reward_terms)
    terms = torch.stack(list(out.info["reward_terms"].values())).sum(0)
    torch.testing.assert_close(terms, out.reward)


def test_obs_options_change_dim() -> None:
    env = E.make(
        "humanoid",
        num_envs=1,
        include_cinert_in_observation=False,
        include_cfrc_ext_in_observation=False,
    )
    assert env.spec.obs_dim == 348 - 13 * 10 - 13 * 6
    assert env.reset()["policy"].shape == (1, env.spec.obs_dim)


def test_ant_contact_once_landed() -> None:
    """The Ant starts in the air (cfrc_ext zero after reset) and its feet then touch the floor."""
    env = E.make("ant", num_envs=4, seed=0)
    obs = env.reset(seed=0)["policy"]
    assert bool((obs[:, 27:] == 0).all())  # Gymnasium's reset computes no cfrc_ext
    contact = torch.zeros(4)
    for _ in range(30):
        out = env.step(torch.zeros(4, 8))
        contact = torch.minimum(contact, out.info["reward_terms"]["contact"])
    assert bool((contact < 0).all()), contact
    assert bool((out.obs["policy"][:, 27:].abs().amax(dim=1) > 0).all())
    # clipped to contact_force_range = (-1, 1)
    assert float(out.obs["policy"][:, 27:].abs().max()) <= 1.0


def test_humanoid_contact_cost_is_clipped() -> None:
    env = E.make(
        "humanoid",
        num_envs=2,
        seed=0,
        contact_cost_range=(-math.inf, 1e-6),
        terminate_when_unhealthy=False,
    )
    env.reset(seed=0)["policy"]
    lowest = torch.zeros(2, dtype=torch.float64)
    for _ in range(25):
        out = env.step(torch.zeros(2, 17))
        lowest = torch.minimum(lowest, out.info["reward_terms"]["contact"].double())
    torch.testing.assert_close(lowest, torch.full((2,), -1e-6, dtype=torch.float64))


def test_inverted_pendulum_terminates_and_resets() -> None:
    env = E.make("inverted_pendulum", num_envs=2, seed=0)
    env.reset(seed=0)["policy"]
    state = env.get_state()
    state[1, _qpos_columns(env)] = torch.tensor([0.0, 0.5], dtype=torch.float64)  # pole fallen
    env.set_state(state[1:], env_ids=torch.tensor([1]))
    out = env.step(torch.zeros(2, 1))
    assert out.terminated.tolist() == [False, True]
    assert out.truncated.tolist() == [False, False]
    assert out.reward.tolist() == [1.0, 0.0]
    final = out.info["final_obs"]["policy"]
    assert float(final[1, 1]) > 0.2  # the fallen pole, before the reset
    assert float(out.obs["policy"][1, 1].abs()) <= 0.01 + 1e-6  # a fresh start: |angle| <= reset noise
    assert bool((out.obs["policy"][1, 2:].abs() <= 0.01 + 1e-6).all())
    torch.testing.assert_close(final[0], out.obs["policy"][0])


def test_inverted_double_pendulum_terminates_when_tip_low() -> None:
    env = E.make("inverted_double_pendulum", num_envs=2, seed=0)
    env.reset(seed=0)["policy"]
    state = env.get_state()
    state[0, _qpos_columns(env)] = torch.tensor([0.0, 1.5, 0.0], dtype=torch.float64)
    env.set_state(state[:1], env_ids=torch.tensor([0]))
    out = env.step(torch.zeros(2, 1))
    assert out.terminated.tolist() == [True, False]
    assert float(out.info["reward_terms"]["healthy"][0]) == 0.0
    assert float(out.info["reward_terms"]["healthy"][1]) == 10.0
