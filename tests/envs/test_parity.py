"""Every built-in task against Gymnasium's *-v5: same start state, same 300 random actions."""

from __future__ import annotations

import gymnasium as gym
import mujoco
import numpy as np
import pytest
import torch

import robotrl.envs as E
from robotrl.envs.registry import task_class

STEPS = 300


def _gym_state(env: gym.Env) -> np.ndarray:
    model, data = env.unwrapped.model, env.unwrapped.data
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    state = np.zeros(mujoco.mj_stateSize(model, spec))
    mujoco.mj_getState(model, data, state, spec)
    return state


# robotrl's own tasks (tabletop, reacher_goal: gym_id "robotrl/...") have no Gymnasium twin
@pytest.mark.parametrize("task", [t for t in E.list_tasks()
                                  if not task_class(t).gym_id.startswith("robotrl/")])
def test_matches_gymnasium(task: str) -> None:
    gym_env = gym.make(task_class(task).gym_id)
    gym_obs, _ = gym_env.reset(seed=7)
    env = E.make(task, num_envs=2, seed=0)
    # world 1 keeps its own random start: parity must hold per world, not by accident of a batch
    env.set_state(torch.as_tensor(_gym_state(gym_env))[None], env_ids=torch.tensor([0]))
    np.testing.assert_allclose(env.task.observe(env.sim)[0].numpy(), gym_obs, rtol=1e-9, atol=1e-9)
    rng = np.random.default_rng(0)
    low, high = gym_env.action_space.low, gym_env.action_space.high
    for t in range(STEPS):
        action = rng.uniform(low, high).astype(np.float64)
        gym_obs, gym_rew, gym_term, gym_trunc, gym_info = gym_env.step(action)
        batch_action = torch.zeros(2, action.shape[0], dtype=torch.float64)
        batch_action[0] = torch.from_numpy(action)
        out = env.step(batch_action)
        msg = f"{task} step {t}"
        np.testing.assert_allclose(out.info["final_obs"]["policy"][0].numpy(), gym_obs, rtol=1e-5, atol=1e-5, err_msg=msg)
        np.testing.assert_allclose(out.reward[0].item(), gym_rew, rtol=1e-5, atol=1e-5, err_msg=msg)
        assert bool(out.terminated[0]) == gym_term, msg
        assert bool(out.truncated[0]) == gym_trunc, msg
        if gym_term or gym_trunc:
            break
