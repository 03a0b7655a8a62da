"""Fast checks of the Hopper, Walker2d, Swimmer and Reacher tasks beyond Gymnasium parity."""

from __future__ import annotations

import math

import mujoco
import pytest
import torch

import robotrl.envs as E
from robotrl.envs.mujoco import MujocoEnv
from robotrl.envs.registry import make_task
from robotrl.envs.tasks.reacher import Reacher

N = 1000

# task -> (obs_dim, qpos noise scale, qvel noise scale); all four draw uniform noise
NOISE = {
    "hopper": (11, 5e-3, 5e-3),
    "walker2d": (17, 5e-3, 5e-3),
    "swimmer": (8, 0.1, 0.1),
}


def _make(task: str, n: int, **overrides: object) -> MujocoEnv:
    env = E.make(task, num_envs=n, seed=0, num_threads=1, **overrides)
    assert isinstance(env, MujocoEnv)
    return env


def _qpos_column(env: MujocoEnv, i: int) -> int:
    """Column of qpos[i] in the full-physics state (mj_getState order: time, qpos, ...)."""
    return mujoco.mj_stateSize(env.model, mujoco.mjtState.mjSTATE_TIME) + i


def _check_uniform(x: torch.Tensor, scale: float) -> None:
    """x: [N, k] samples of U(-scale, scale): bounded, centred, std scale / sqrt(3)."""
    assert float(x.abs().max()) <= scale
    assert float(x.abs().max()) > 0.95 * scale
    assert abs(float(x.mean())) < 0.05 * scale
    assert float(x.std()) == pytest.approx(scale / math.sqrt(3), rel=0.05)


@pytest.mark.parametrize("task", list(NOISE))
def test_reset_noise(task: str) -> None:
    obs_dim, qpos_scale, qvel_scale = NOISE[task]
    env = _make(task, N)
    obs = env.reset(seed=1)["policy"]
    assert obs.shape == (N, obs_dim) and env.spec.obs_dim == obs_dim
    _check_uniform(env.sim.qpos - env.task.init_qpos, qpos_scale)
    _check_uniform(env.sim.qvel, qvel_scale)


def test_reacher_reset() -> None:
    env = _make("reacher", N)
    obs = env.reset(seed=1)["policy"]
    assert obs.shape == (N, 10)
    qpos, qvel = env.sim.qpos, env.sim.qvel
    _check_uniform(qpos[:, :2] - env.task.init_qpos[:2], 0.1)
    _check_uniform(qvel[:, :2], 5e-3)
    assert bool((qvel[:, 2:] == 0).all())
    goal = qpos[:, 2:]
    assert bool((goal.norm(dim=1) < 0.2).all())
    # obs: target position, then fingertip - target from the bodies' positions
    assert torch.allclose(obs[:, 4:6], goal.float())
    tip = env.sim.xpos[:, env.task.fingertip_id, :2]
    assert torch.allclose(obs[:, 8:10], (tip - goal).float(), atol=1e-6)


def test_reacher_goal_sampler_is_uniform_on_disc() -> None:
    task = make_task("reacher")
    assert isinstance(task, Reacher)
    goal = task.sample_goal(20000, torch.Generator().manual_seed(0))
    r = goal.norm(dim=1)
    assert bool((r < 0.2).all())
    # uniform on the disc: P(r < 0.1) = 1/4
    assert float((r < 0.1).double().mean()) == pytest.approx(0.25, abs=0.02)


def test_reacher_truncates_at_50() -> None:
    env = _make("reacher", 4)
    env.reset(seed=0)["policy"]
    action = torch.zeros(4, 2)
    for _ in range(49):
        out = env.step(action)
        assert not bool(out.truncated.any()) and not bool(out.terminated.any())
    out = env.step(action)
    assert bool(out.truncated.all()) and not bool(out.terminated.any())
    # auto-reset: new goals, final_obs keeps the old ones
    assert not torch.equal(out.obs["policy"][:, 4:6], out.info["final_obs"]["policy"][:, 4:6])
    out = env.step(action)
    assert not bool(out.truncated.any())


@pytest.mark.parametrize(("task", "low_z"), [("hopper", 0.5), ("walker2d", 0.6)])
def test_unhealthy_terminates_and_resets(task: str, low_z: float) -> None:
    env = _make(task, 2)
    env.reset(seed=0)["policy"]
    state = env.get_state()
    state[0, _qpos_column(env, 1)] = low_z  # rootz of world 0 below the healthy range
    env.set_state(state[:1], env_ids=torch.tensor([0]))
    out = env.step(torch.zeros(2, env.spec.action_dim))
    assert env.num_unstable == 0
    assert out.terminated.tolist() == [True, False]
    assert out.truncated.tolist() == [False, False]
    assert out.info["reward_terms"]["healthy"].tolist() == [0.0, 1.0]
    # final_obs: the fallen state (obs[0] is z); obs: a fresh start near z = 1.25
    assert float(out.info["final_obs"]["policy"][0, 0]) < env.task.cfg.healthy_z_range[0]
    assert float(out.obs["policy"][0, 0]) == pytest.approx(1.25, abs=0.01)
    assert torch.equal(out.obs["policy"][1], out.info["final_obs"]["policy"][1])


def test_unhealthy_without_termination() -> None:
    env = _make("hopper", 1, terminate_when_unhealthy=False)
    env.reset(seed=0)["policy"]
    state = env.get_state()
    state[0, _qpos_column(env, 1)] = 0.5  # rootz below the healthy range
    env.set_state(state)
    out = env.step(torch.zeros(1, env.spec.action_dim))
    assert not bool(out.terminated[0])
    assert out.info["reward_terms"]["healthy"].tolist() == [0.0]


def test_halfcheetah_loads_without_the_settotalmass_warning_and_equals_gymnasiums_model(
        capfd: pytest.CaptureFixture[str]) -> None:
    """half_cheetah.xml sets ``settotalmass``, deprecated in MuJoCo 4 (a warning on every load,
    through the progress bar); the task drops it and rescales: every numeric field of the
    compiled model equals Gymnasium's own HalfCheetah-v5 model."""
    import gymnasium as gym
    import numpy as np

    from robotrl.envs.registry import task_class

    model = task_class("halfcheetah").load_model()
    printed = capfd.readouterr()
    assert "settotalmass" not in printed.out + printed.err
    ref = gym.make("HalfCheetah-v5").unwrapped.model
    compared = 0
    for name in dir(ref):
        value = getattr(ref, name)
        if name.startswith("_") or not isinstance(value, np.ndarray):
            continue
        np.testing.assert_array_equal(getattr(model, name), value, err_msg=name)
        compared += 1
    assert compared > 100 and float(model.body_mass.sum()) == pytest.approx(14.0)


STATE_TASKS = ("halfcheetah", "hopper", "walker2d", "swimmer", "ant", "humanoid", "ant_umaze",
               "humanoid_goal")


@pytest.mark.parametrize("task", STATE_TASKS)
def test_observation_starts_with_the_state_it_declares(task: str) -> None:
    """``state_obs_dim`` (what the backend-agreement checks compare tightly) is the observed
    positions then velocities, and the rest of the observation is something else."""
    env = _make(task, 3)
    obs = env.reset(seed=2)["policy"].double()
    skip, dim = env.task.unobserved_qpos, env.task.state_obs_dim
    assert skip is not None and dim == env.model.nq - skip + env.model.nv
    state = torch.cat([env.sim.qpos[:, skip:], env.sim.qvel], dim=1)
    torch.testing.assert_close(obs[:, :dim], state.to(obs), rtol=1e-6, atol=1e-6)
    assert obs.shape[1] >= dim


def test_tasks_without_a_leading_state_say_so() -> None:
    assert make_task("reacher").state_obs_dim is None
