"""The native MuJoCo backend's public behaviour: make, validation, auto-reset, state snapshots."""

from __future__ import annotations

import mujoco
import pytest
import torch

import robotrl.envs as E
from robotrl.envs.mujoco import MujocoEnv


def _make(n: int, seed: int = 0, **overrides: object) -> MujocoEnv:
    env = E.make("halfcheetah", n, seed=seed, num_threads=1, **overrides)
    assert isinstance(env, MujocoEnv)
    return env


def _qvel_column(env: MujocoEnv) -> int:
    """First qvel column of the full-physics state (mj_getState order: time, qpos, qvel, ...)."""
    model = env.model
    return (mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_TIME)
            + mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_QPOS))


def test_make_unknown_task_and_backend_list_available() -> None:
    with pytest.raises(ValueError, match="unknown task 'halfcheeta'.*available tasks:.*halfcheetah"):
        E.make("halfcheeta", 1)
    with pytest.raises(ValueError, match="unknown backend 'mjx2'.*available backends: mujoco"):
        E.make("halfcheetah", 1, backend="mjx2")
    with pytest.raises(ValueError, match="num_envs must be >= 1"):
        _make(0)


def test_unknown_task_option_lists_allowed() -> None:
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['ctrl_cost'\].*ctrl_cost_weight"):
        _make(1, ctrl_cost=0.2)


def test_spec() -> None:
    env = _make(2)
    spec = env.spec
    assert (spec.obs_dim, spec.action_dim) == (17, 6)
    assert spec.action_low.tolist() == [-1.0] * 6 and spec.action_high.tolist() == [1.0] * 6
    assert spec.control_dt == pytest.approx(0.05)
    assert spec.max_episode_steps == 1000
    assert spec.reward_terms == ("forward", "ctrl")
    assert spec.task == "halfcheetah"


def test_bad_actions_raise_clear_errors() -> None:
    env = _make(2)
    with pytest.raises(ValueError, match=r"shape \(2, 5\), expected \(2, 6\)"):
        env.step(torch.zeros(2, 5))
    with pytest.raises(ValueError, match=r"shape \(6,\), expected \(2, 6\)"):
        env.step(torch.zeros(6))
    with pytest.raises(TypeError, match="floating-point tensor, got dtype torch.int64"):
        env.step(torch.zeros(2, 6, dtype=torch.long))
    with pytest.raises(TypeError, match="torch.Tensor"):
        env.step([[0.0] * 6] * 2)  # type: ignore[arg-type]
    bad = torch.zeros(2, 6)
    bad[1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"NaN or Inf in envs \[1\]"):
        env.step(bad)


def test_step_outputs() -> None:
    env = _make(3)
    obs = env.reset(seed=0)["policy"]
    assert obs.shape == (3, 17) and obs.dtype == torch.float32
    out = env.step(torch.full((3, 6), 0.3))
    assert out.obs["policy"].shape == (3, 17) and out.obs["policy"].dtype == torch.float32
    assert out.reward.shape == (3,) and out.reward.dtype == torch.float32
    assert out.terminated.dtype == torch.bool and out.truncated.dtype == torch.bool
    terms = out.info["reward_terms"]
    assert set(terms) == {"forward", "ctrl"}
    torch.testing.assert_close(terms["forward"] + terms["ctrl"], out.reward)
    torch.testing.assert_close(terms["ctrl"], torch.full((3,), -0.1 * 6 * 0.09))


def test_truncation_auto_reset_and_final_obs() -> None:
    env = _make(3, seed=4, max_episode_steps=5)
    twin = _make(3, seed=4, max_episode_steps=6)  # same starts, truncates one step later
    assert env.spec.max_episode_steps == 5
    gen = torch.Generator().manual_seed(0)
    for t in range(1, 11):
        action = torch.rand(3, 6, generator=gen) * 2 - 1
        out = env.step(action)
        assert not bool(out.terminated.any())
        assert out.truncated.tolist() == [t % 5 == 0] * 3, t
        if t <= 5:
            ref = twin.step(action)
            torch.testing.assert_close(out.info["final_obs"]["policy"], ref.obs["policy"], rtol=0, atol=0)
            torch.testing.assert_close(out.reward, ref.reward, rtol=0, atol=0)
        if t % 5:
            assert torch.equal(out.obs["policy"], out.info["final_obs"]["policy"])
        else:
            # the reset obs is a fresh sample: qpos[1:] within the 0.1 reset noise of qpos0
            assert not torch.equal(out.obs["policy"], out.info["final_obs"]["policy"])
            init = env.task.init_qpos[1:].float()
            assert bool(((out.obs["policy"][:, :8] - init).abs() <= 0.1 + 1e-6).all())


def test_get_set_state_round_trip() -> None:
    env = _make(3)
    env.reset(seed=2)["policy"]
    state = env.get_state()
    assert state.dtype == torch.float64 and state.shape[0] == 3
    action = torch.rand(3, 6, generator=torch.Generator().manual_seed(1)) * 2 - 1
    first = env.step(action)
    for _ in range(3):
        env.step(torch.zeros(3, 6))
    env.set_state(state)
    torch.testing.assert_close(env.get_state(), state, rtol=0, atol=0)
    again = env.step(action)
    torch.testing.assert_close(again.obs["policy"], first.obs["policy"], rtol=0, atol=0)
    torch.testing.assert_close(again.reward, first.reward, rtol=0, atol=0)


def test_same_state_same_actions_same_worlds() -> None:
    env = _make(3)
    env.reset(seed=3)["policy"]
    state = env.get_state()
    env.set_state(state[[1, 1]], env_ids=torch.tensor([0, 2]))  # worlds 0, 1, 2 now equal
    assert not torch.equal(state[0], state[1])
    gen = torch.Generator().manual_seed(5)
    for _ in range(10):
        out = env.step((torch.rand(1, 6, generator=gen) * 2 - 1).expand(3, 6).contiguous())
        assert torch.equal(out.obs["policy"][0], out.obs["policy"][1]) and torch.equal(out.obs["policy"][1], out.obs["policy"][2])
        assert torch.equal(out.reward[0], out.reward[2])


def test_set_state_bad_input_raises() -> None:
    env = _make(2)
    state = env.get_state()
    with pytest.raises(ValueError, match=r"state has shape .*expected \(2, "):
        env.set_state(state[:, :-1])
    with pytest.raises(ValueError, match=r"expected \(1, "):
        env.set_state(state, env_ids=torch.tensor([0]))
    with pytest.raises(ValueError, match=r"env_ids must be in \[0, 2\)"):
        env.set_state(state[:1], env_ids=torch.tensor([5]))
    with pytest.raises(ValueError, match="env_ids must be unique"):
        env.set_state(state, env_ids=torch.tensor([1, 1]))


def test_reset_seed_reproducible() -> None:
    env = _make(4)
    obs = env.reset(seed=11)["policy"]
    for _ in range(3):
        env.step(torch.zeros(4, 6))
    torch.testing.assert_close(env.reset(seed=11)["policy"], obs, rtol=0, atol=0)
    assert not torch.equal(env.reset(seed=12)["policy"], obs)
    assert len({tuple(row) for row in obs.tolist()}) == 4  # worlds draw different starts
    other = _make(4, seed=99)
    torch.testing.assert_close(other.reset(seed=11)["policy"], obs, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("dof", "qvel"),
    [
        # a hinge spinning at 1e6 rad/s: a valid state that blows up within the next step
        (3, 1e6),
        # beyond mjMAXVAL (1e10): MuJoCo already flags it in set_state's mj_forward
        (0, 1e12),
    ],
)
def test_unstable_world_is_reset_alone(dof: int, qvel: float) -> None:
    env = _make(3)
    calm = _make(3)
    env.reset(seed=1)["policy"]
    state = env.get_state()
    calm.set_state(state)
    blown = state.clone()
    blown[1, _qvel_column(env) + dof] = qvel
    env.set_state(blown[1:2], env_ids=torch.tensor([1]))
    action = torch.full((3, 6), 0.2)
    out = env.step(action)
    ref = calm.step(action)
    assert out.info["unstable"] == 1 and env.num_unstable == 1
    assert out.terminated.tolist() == [False, True, False]
    assert out.truncated.tolist() == [False, False, False]
    assert float(out.reward[1]) == 0.0
    assert bool(torch.isfinite(out.obs["policy"]).all() & torch.isfinite(out.info["final_obs"]["policy"]).all())
    # the other worlds did not notice
    for i in (0, 2):
        torch.testing.assert_close(out.obs["policy"][i], ref.obs["policy"][i], rtol=0, atol=0)
        torch.testing.assert_close(out.reward[i], ref.reward[i], rtol=0, atol=0)
    # world 1 restarted from the reset distribution (not MuJoCo's qpos0) and steps on normally
    init = env.task.init_qpos[1:].float()
    assert bool(((out.obs["policy"][1, :8] - init).abs() <= 0.1 + 1e-6).all())
    assert bool((out.obs["policy"][1, 8:] != 0).any())  # reset qvel noise, not all-zero defaults
    for _ in range(3):
        out = env.step(action)
        assert out.info["unstable"] == 0 and not bool(out.terminated.any())
    assert env.num_unstable == 1
