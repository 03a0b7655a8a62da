"""The Gymnasium backend: ids and users' own vector envs behind the BatchedEnv protocol."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import robotrl.envs as E
from robotrl.envs.base import ObsSpec
from robotrl.envs.gym import GymnasiumEnv


def test_pendulum_spec_shapes_and_dtypes() -> None:
    env = GymnasiumEnv("Pendulum-v1", 3, seed=0)
    spec = env.spec
    assert (spec.obs_dim, spec.action_dim) == (3, 1)
    assert spec.action_low.tolist() == [-2.0] and spec.action_high.tolist() == [2.0]
    assert spec.action_low.dtype == torch.float32
    assert spec.control_dt == pytest.approx(0.05)
    assert spec.max_episode_steps == 200
    assert spec.reward_terms == ()
    assert spec.observations == {"policy": ObsSpec((3,))}
    obs = env.reset(seed=1)["policy"]
    assert obs.shape == (3, 3) and obs.dtype == torch.float32
    out = env.step(torch.zeros(3, 1))
    assert out.obs["policy"].shape == (3, 3) and out.obs["policy"].dtype == torch.float32
    assert out.reward.shape == (3,) and out.reward.dtype == torch.float32
    assert out.terminated.dtype == torch.bool and out.truncated.dtype == torch.bool
    assert out.info["final_obs"]["policy"].shape == (3, 3)
    assert out.info["final_obs"]["policy"].dtype == torch.float32
    assert out.info["reward_terms"] == {}
    env.close()


def test_pendulum_matches_plain_gymnasium_through_truncation() -> None:
    """Same seeds, same actions: every obs/reward/flag equals per-env Gymnasium, and at the
    200-step time limit ``final_obs`` is the last obs while ``obs`` is the next reset."""
    n, seed = 2, 3
    env = GymnasiumEnv("Pendulum-v1", n, seed=seed)
    plain = [gym.make("Pendulum-v1") for _ in range(n)]
    obs = env.reset(seed=seed)["policy"]
    ref = np.stack([p.reset(seed=seed + i)[0] for i, p in enumerate(plain)])
    np.testing.assert_allclose(obs.numpy(), ref, atol=1e-6)
    rng = np.random.default_rng(0)
    for t in range(1, 206):
        action = rng.uniform(-2, 2, size=(n, 1)).astype(np.float32)
        out = env.step(torch.from_numpy(action))
        steps = [p.step(action[i]) for i, p in enumerate(plain)]
        ref_obs = np.stack([s[0] for s in steps])
        np.testing.assert_allclose(out.info["final_obs"]["policy"].numpy(), ref_obs, atol=1e-5)
        np.testing.assert_allclose(out.reward.numpy(), [s[1] for s in steps], rtol=1e-5)
        assert out.terminated.tolist() == [s[2] for s in steps] == [False] * n
        assert out.truncated.tolist() == [s[3] for s in steps] == [t == 200] * n, t
        if t == 200:
            assert not torch.allclose(out.obs["policy"], out.info["final_obs"]["policy"])
            ref_obs = np.stack([p.reset()[0] for p in plain])
        np.testing.assert_allclose(out.obs["policy"].numpy(), ref_obs, atol=1e-5, err_msg=f"step {t}")
    env.close()


def test_halfcheetah_reward_terms_and_final_obs() -> None:
    env = GymnasiumEnv("HalfCheetah-v5", 2, seed=0, max_episode_steps=3)
    spec = env.spec
    assert (spec.obs_dim, spec.action_dim) == (17, 6)
    assert spec.reward_terms == ("forward", "ctrl")
    assert spec.max_episode_steps == 3
    assert spec.control_dt == pytest.approx(0.05)
    action = torch.full((2, 6), 0.5)
    for t in range(1, 5):
        out = env.step(action)
        assert out.truncated.tolist() == [t == 3] * 2
        terms = out.info["reward_terms"]
        assert set(terms) == {"forward", "ctrl"}
        assert all(v.shape == (2,) and v.dtype == torch.float32 for v in terms.values())
        # on the truncation step the terms come from Gymnasium's final_info
        torch.testing.assert_close(terms["ctrl"], torch.full((2,), -0.1 * 6 * 0.25))
        torch.testing.assert_close(terms["forward"] + terms["ctrl"], out.reward)
        same = torch.equal(out.obs["policy"], out.info["final_obs"]["policy"])
        assert same == (t != 3)
    env.close()


def test_make_gymnasium_backend_and_overrides() -> None:
    native = E.make("halfcheetah", 2)
    env = E.make("halfcheetah", 2, backend="gymnasium", ctrl_cost_weight=0.0)
    assert isinstance(env, GymnasiumEnv)
    assert env.spec.obs_dim == native.spec.obs_dim
    assert env.spec.action_dim == native.spec.action_dim
    assert env.spec.reward_terms == native.spec.reward_terms
    assert env.spec.control_dt == pytest.approx(native.spec.control_dt)
    assert env.spec.max_episode_steps == native.spec.max_episode_steps
    out = env.step(torch.ones(2, 6))
    assert out.info["reward_terms"]["ctrl"].abs().max() == 0  # the override reached the env
    env.close()


@pytest.mark.parametrize(
    ("env_id", "expected"),
    [("halfcheetah-v5", "HalfCheetah-v5"), ("Pendulum-v9", "Pendulum-v1"),
     ("HalfChetah-v5", "HalfCheetah-v5")],
)
def test_unknown_id_lists_close_ids(env_id: str, expected: str) -> None:
    with pytest.raises(ValueError, match=f"unknown Gymnasium id.*close registered ids:.*{expected}"):
        GymnasiumEnv(env_id, 1)


def test_bad_arguments_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['ctrl_cost'\].*ctrl_cost_weight"):
        GymnasiumEnv("HalfCheetah-v5", 1, ctrl_cost=0.1)
    with pytest.raises(ValueError, match="action space Discrete.*supports Box action"):
        GymnasiumEnv("CartPole-v1", 1)
    with pytest.raises(ValueError, match="vectorization 'threads'.*sync, async"):
        GymnasiumEnv("Pendulum-v1", 1, vectorization="threads")
    with pytest.raises(ValueError, match="num_envs must be >= 1"):
        GymnasiumEnv("Pendulum-v1", 0)
    env = GymnasiumEnv("Pendulum-v1", 2)
    with pytest.raises(ValueError, match=r"expected \(2, 1\)"):
        env.step(torch.zeros(2, 2))
    with pytest.raises(TypeError, match="floating-point"):
        env.step(torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(NotImplementedError, match="backend='mujoco'"):
        env.get_state()
    with pytest.raises(NotImplementedError, match="backend='mujoco'"):
        env.set_state(torch.zeros(2, 1))
    env.close()


def test_async_vectorization() -> None:
    sync = GymnasiumEnv("Pendulum-v1", 2, seed=4)
    env = GymnasiumEnv("Pendulum-v1", 2, seed=4, vectorization="async")
    try:
        torch.testing.assert_close(env.reset(seed=4)["policy"], sync.reset(seed=4)["policy"])
        action = torch.tensor([[1.0], [-1.0]])
        torch.testing.assert_close(env.step(action).obs, sync.step(action).obs)
    finally:
        env.close()
        sync.close()


class Walker1D(gym.Env):
    """A user's env: x += a per step, terminated at x >= 3, truncated after 5 steps.

    Observation is a 2x2 Box (to check flattening): [[x, steps], [-x, 1]].
    """

    dt = 0.1

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2, 2), np.float64)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.x, self.steps = 0.0, 0

    def _obs(self) -> np.ndarray:
        return np.array([[self.x, self.steps], [-self.x, 1.0]])

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.x, self.steps = 0.0, 0
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple:
        self.x += float(action[0])
        self.steps += 1
        info: dict[str, Any] = {"reward_move": float(action[0]), "reward_alive": 1.0}
        return self._obs(), float(action[0]) + 1.0, self.x >= 3, self.steps >= 5, info


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.DISABLED])
def test_user_vector_env(mode: AutoresetMode) -> None:
    vec = SyncVectorEnv([Walker1D, Walker1D], autoreset_mode=mode)
    env = GymnasiumEnv(vec, 2, seed=0)
    assert env.spec.obs_dim == 4 and env.spec.action_dim == 1
    assert env.spec.reward_terms == ("move", "alive")
    assert env.spec.control_dt == pytest.approx(0.1)
    assert env.spec.max_episode_steps == 0  # no time limit registered
    action = torch.tensor([[1.0], [0.5]])
    for t in range(1, 7):
        out = env.step(action)
        # world 0 reaches x = 3 at step 3 (terminated); world 1 hits 5 steps at x = 2.5
        assert out.terminated.tolist() == [t in (3, 6), False], t
        assert out.truncated.tolist() == [False, t == 5], t
        torch.testing.assert_close(out.info["reward_terms"]["move"], torch.tensor([1.0, 0.5]))
        torch.testing.assert_close(out.info["reward_terms"]["alive"], torch.ones(2))
        torch.testing.assert_close(out.reward, torch.tensor([2.0, 1.5]))
        if t == 3:
            torch.testing.assert_close(out.info["final_obs"]["policy"][0], torch.tensor([3.0, 3, -3, 1]))
            torch.testing.assert_close(out.obs["policy"][0], torch.tensor([0.0, 0, 0, 1]))
        if t == 5:
            torch.testing.assert_close(out.info["final_obs"]["policy"][1], torch.tensor([2.5, 5, -2.5, 1]))
            torch.testing.assert_close(out.obs["policy"][1], torch.tensor([0.0, 0, 0, 1]))
            torch.testing.assert_close(out.obs["policy"][0], torch.tensor([2.0, 2, -2, 1]))
    env.close()


def test_user_vector_env_checks() -> None:
    with pytest.raises(ValueError, match="NEXT_STEP.*SAME_STEP or DISABLED"):
        GymnasiumEnv(SyncVectorEnv([Walker1D]), 1)
    vec = SyncVectorEnv([Walker1D, Walker1D], autoreset_mode=AutoresetMode.SAME_STEP)
    with pytest.raises(ValueError, match="num_envs=3 but the supplied vector env has 2"):
        GymnasiumEnv(vec, 3)
    with pytest.raises(ValueError, match="only when GymnasiumEnv makes the env from an id"):
        GymnasiumEnv(vec, 2, max_episode_steps=3)
    with pytest.raises(TypeError, match="Gymnasium id .* or a gymnasium.vector.VectorEnv"):
        GymnasiumEnv(42, 1)  # type: ignore[arg-type]
    vec.close()


def test_env_without_dt_has_nan_control_dt() -> None:
    class NoDt(Walker1D):
        dt = None  # type: ignore[assignment]

    env = GymnasiumEnv(SyncVectorEnv([NoDt], autoreset_mode=AutoresetMode.SAME_STEP), 1)
    assert math.isnan(env.spec.control_dt)
    env.close()
