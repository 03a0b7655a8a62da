"""The DeepMind Control Suite's tasks against dm_control's own environments, step for step.

From the same physics state (dm_control's full integration state copied into our world) and
the same actions, our observation and reward equal dm_control's in float64 within 1e-6 over a
whole episode; our initial states equal dm_control's given its ``RandomState``; and a changed
reward shape (a margin, a sigmoid) fails that comparison on every task.
"""

from __future__ import annotations

import importlib
import os

import mujoco
import numpy as np
import pytest
import torch

from robotrl.envs.tasks.base import before_opengl

os.environ.setdefault("MUJOCO_GL", "disable")  # dm_control's renderer is not needed here
before_opengl()  # conftest's MUJOCO_GL=egl: dm_control opens its display on import
suite = pytest.importorskip("dm_control.suite", reason="pip install 'robotrl[dmc]'")

from robotrl.envs.mujoco import MujocoEnv  # noqa: E402
from robotrl.envs.registry import list_tasks, make_task, task_class  # noqa: E402
from robotrl.envs.tasks import dmc  # noqa: E402

TASKS = [name for name in list_tasks() if name.startswith("dmc/")]
TOL = 1e-6


def dm_env(name: str, seed: int):
    domain, task = name.removeprefix("dmc/").split("-", 1)
    return suite.load(domain, task, task_kwargs={"random": seed})


def flat(observation) -> np.ndarray:
    return np.concatenate([np.asarray(v, dtype=np.float64).ravel()
                           for v in observation.values()])


def integration_state(physics) -> np.ndarray:
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    model, data = physics.model.ptr, physics.data.ptr
    state = np.empty(mujoco.mj_stateSize(model, spec))
    mujoco.mj_getState(model, data, state, spec)
    return state


def episode_gap(name: str, seed: int = 0, steps: int = 1000, mutate=None) -> float:
    """Largest |ours - dm_control's| over the observations and rewards of ``steps`` steps of
    uniform random actions from dm_control's initial state of ``seed``; ``mutate(task)``
    changes our task first."""
    ref = dm_env(name, seed)
    first = ref.reset()
    task = make_task(name, max_episode_steps=steps + 1)  # no auto-reset inside the comparison
    if mutate is not None:
        mutate(task)
    env = MujocoEnv(task, 1, num_threads=1)
    state = integration_state(ref.physics)  # its userdata (last) is empty: ours is set below
    env.batch.state[0, :state.size] = state
    userdata = task.userdata_of(ref.physics.model.ptr, ref.physics.data.ptr)
    env.batch.bind("userdata")[0] = userdata
    env.batch.bind("act")[0] = ref.physics.data.act
    flags = env.batch.expand("opt.disableflags")  # dm_control's reset: mj_forward unactuated
    flags[0] |= int(mujoco.mjtDisableBit.mjDSBL_ACTUATION)
    env.batch.forward([0])
    flags[0] &= ~int(mujoco.mjtDisableBit.mjDSBL_ACTUATION)
    gap = float(np.abs(task.observe(env.sim)[0].numpy() - flat(first.observation)).max())
    rng = np.random.default_rng(seed)
    spec = ref.action_spec()
    for _ in range(steps):
        action = rng.uniform(spec.minimum, spec.maximum)
        step = ref.step(action)
        out = env.step(torch.as_tensor(action)[None])  # float64, as dm_control gets it
        ours = task.observe(env.sim)[0].numpy()
        reward = float(task.reward(env.sim)[0])
        gap = max(gap, float(np.abs(ours - flat(step.observation)).max()),
                  abs(reward - step.reward), abs(float(out.reward[0]) - step.reward) / 1e2)
    assert step.last() == (steps >= 1000)
    return gap


@pytest.mark.parametrize("name", TASKS)
def test_a_whole_episode_equals_dm_control_step_for_step(name: str) -> None:
    cls = task_class(name)
    ref = dm_env(name, 0)
    assert cls.frame_skip == ref._n_sub_steps
    assert make_task(name).cfg.max_episode_steps == ref._step_limit == 1000
    assert episode_gap(name) < TOL


@pytest.mark.parametrize("name", TASKS)
def test_initial_states_equal_dm_control_given_its_draws(name: str) -> None:
    task = make_task(name)
    for seed in (0, 1):
        ref = dm_env(name, seed)
        qpos, qvel, userdata, act = task.initial_state(np.random.RandomState(seed), 3)
        for episode in range(3):  # later episodes continue the same RandomState
            first = ref.reset()
            physics = ref.physics
            np.testing.assert_allclose(qpos[episode].numpy(), physics.data.qpos, atol=1e-12)
            np.testing.assert_allclose(qvel[episode].numpy(), physics.data.qvel, atol=1e-12)
            np.testing.assert_allclose(act[episode].numpy(), physics.data.act, atol=1e-12)
            np.testing.assert_allclose(
                userdata[episode].numpy(),
                task.userdata_of(physics.model.ptr, physics.data.ptr), atol=1e-12)
        env = MujocoEnv(task, 2, num_threads=1, seed=seed)
        assert env.observe()["policy"].shape == (2, len(flat(first.observation)))


@pytest.mark.parametrize("name", TASKS)
def test_the_model_is_dm_controls(name: str) -> None:
    env = dm_env(name, 0)
    env.reset()  # what a task sets in the model at each reset (finger's hinge damping)
    ours, ref = make_task(name).model, env.physics.model.ptr
    for field in ("body_mass", "body_inertia", "geom_size", "geom_friction", "jnt_range",
                  "actuator_gear", "actuator_ctrlrange", "dof_damping", "opt.timestep"):
        a, b = ours, ref
        for part in field.split("."):
            a, b = getattr(a, part), getattr(b, part)
        np.testing.assert_allclose(a, b, rtol=1e-12, err_msg=f"{name}: {field}")


def _mutated(kind: str):
    """``tolerance`` with its margin scaled by 1.05 or its sigmoid swapped."""
    original = dmc.tolerance

    def tolerance(x, bounds=(0.0, 0.0), margin=0.0, sigmoid="gaussian", value_at_margin=0.1):
        if kind == "margin":
            margin *= 1.05
        elif margin > 0:
            other = "reciprocal" if sigmoid != "reciprocal" else "gaussian"
            sigmoid, value_at_margin = other, min(max(value_at_margin, 0.1), 0.9)
        return original(x, bounds, margin, sigmoid, value_at_margin)
    return tolerance


THRESHOLDS = {
    "dmc/reacher-easy": ("finger_size", 1), "dmc/reacher-hard": ("finger_size", 1),
    "dmc/finger-spin": ("spin_velocity", 2), "dmc/ball_in_cup-catch": ("inner", 0),
    "dmc/pendulum-swingup": ("cosine_bound", 14),
}
"""Rewards that are 1 inside a bound and 0 outside (no tolerance margin to change): the task
attribute holding the bound, and a seed whose episode of random actions earns a reward (seed
0's earns none on reacher, finger and pendulum; pendulum's seed 14 starts within 8 degrees of
upright)."""


@pytest.mark.parametrize("kind", ["margin", "sigmoid"])
@pytest.mark.parametrize("name", [name for name in TASKS if name not in THRESHOLDS])
def test_a_changed_reward_shape_fails_the_comparison(name: str, kind: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module(task_class(name).__module__)
    monkeypatch.setattr(module, "tolerance", _mutated(kind))
    assert episode_gap(name, steps=200) > TOL


@pytest.mark.parametrize("name", [name for name in TASKS if name in THRESHOLDS])
def test_a_moved_reward_bound_fails_the_comparison(name: str) -> None:
    attribute, seed = THRESHOLDS[name]
    assert episode_gap(name, seed) < TOL  # the seed's episode, unchanged, passes

    def mutate(task) -> None:
        setattr(task, attribute, getattr(task, attribute) * 0.95)
    assert episode_gap(name, seed, mutate=mutate) > TOL


def test_tolerance_shapes_match_dm_control() -> None:
    from dm_control.utils import rewards

    x = np.linspace(-3, 3, 601)
    for sigmoid in dmc.SIGMOIDS:
        for value in (0.0, 0.1, 0.5):
            if value == 0 and sigmoid not in ("cosine", "linear", "quadratic"):
                continue
            for bounds, margin in (((0.0, 0.0), 1.0), ((-1.0, 0.5), 0.7), ((0.2, 0.2), 0.0)):
                ref = rewards.tolerance(x, bounds, margin, sigmoid, value)
                ours = dmc.tolerance(torch.from_numpy(x), bounds, margin, sigmoid, value)
                np.testing.assert_allclose(ours.numpy(), ref, atol=1e-12)
    with pytest.raises(ValueError, match="allowed"):
        dmc.tolerance(torch.zeros(1), (0, 0), 1.0, "sigmoidal")


def test_the_gymnasium_backend_runs_dm_controls_own_environment() -> None:
    """``backend=gymnasium`` is dm_control's environment through Shimmy, its observation in
    ours' layout: seeded alike, its first observations are ours' initial states'."""
    pytest.importorskip("shimmy", reason="pip install 'robotrl[dmc]'")
    import robotrl.envs

    name = "dmc/walker-walk"
    theirs = robotrl.envs.make(name, 1, backend="gymnasium", seed=5)
    first = theirs.reset(seed=5)["policy"][0]
    task = make_task(name)
    qpos, qvel, _, _ = task.initial_state(np.random.RandomState(5), 1)
    env = MujocoEnv(task, 1, num_threads=1)
    env.set_state(torch.cat([torch.zeros(1, 1), qpos, qvel], dim=1))
    np.testing.assert_allclose(first.numpy(), env.observe()["policy"][0].numpy(), atol=1e-6)
    out = theirs.step(torch.zeros(1, task.model.nu))
    assert out.reward.shape == (1,) and not bool(out.terminated[0])


@pytest.mark.parametrize("unactuated", [True, False])
def test_a_reset_world_observes_as_dm_controls_reset(unactuated: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend's own reset (not the comparison's copied state): dog's actuators hold drawn
    activations, which dm_control's reset leaves out of the first observation's accelerations
    (its mj_forward runs without actuation). Run with actuation (the flag off), the first
    observation differs: the test can fail."""
    name = "dmc/dog-run"
    monkeypatch.setattr(task_class(name), "reset_unactuated", unactuated)
    env = MujocoEnv(make_task(name), 2, num_threads=1)
    ours = env.reset(seed=3)["policy"].double().numpy()
    ref = dm_env(name, 0)
    ref.reset()
    physics = ref.physics
    for world in range(2):
        with physics.reset_context():  # ends in dm_control's mj_forward without actuation
            physics.data.qpos[:] = env.sim.qpos[world].numpy()
            physics.data.qvel[:] = env.sim.qvel[world].numpy()
            physics.data.act[:] = env.sim.act[world].numpy()
        theirs = flat(ref.task.get_observation(physics))
        gap = np.abs(ours[world] - theirs).max() / max(1.0, np.abs(theirs).max())
        assert (gap < 1e-5) == unactuated, (world, gap)
