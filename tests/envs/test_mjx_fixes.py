"""What MuJoCo C computes that the MJX backend's fixes (``envs/mjx_fixes.py``) reproduce.

These run without JAX: they check the reference the MJX patch is built to match, so a MuJoCo
release that changes its RK4 scheme fails here (and ``use_c_rungekutta4`` warns) rather than
silently moving the mjx backend away from the native one.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from robotrl.envs import registry
from robotrl.envs.mjx_fixes import _dexpinv, c_rk4_scheme, rk4_step_numpy, rotation_dofs


def test_dexpinv_by_hand() -> None:
    # theta x w = (0, 1, 0), theta x (theta x w) = (-1, 0, 0): k = w + (0, 1/2, 0) - (1/12, 0, 0)
    k = _dexpinv(np.array([[0.0, 0.0, 1.0]]), np.array([[1.0, 0.0, 0.0]]))
    np.testing.assert_allclose(k, [[11 / 12, 0.5, 0.0]], rtol=0, atol=1e-15)
    w = np.array([[0.3, -0.2, 0.5]])  # no rotation increment: the velocity itself
    np.testing.assert_array_equal(_dexpinv(np.zeros((1, 3)), w), w)


def test_rotation_dofs() -> None:
    ant = registry.make_task("ant").model  # free root (dofs 0-5: linear, then angular), hinges
    np.testing.assert_array_equal(rotation_dofs(ant.jnt_type, ant.jnt_dofadr), [[3, 4, 5]])
    cheetah = registry.make_task("halfcheetah").model  # slide and hinge joints only
    assert rotation_dofs(cheetah.jnt_type, cheetah.jnt_dofadr).shape == (0, 3)
    ball = mujoco.MjModel.from_xml_string(
        "<mujoco><worldbody><body><joint type='hinge'/><geom size='.1'/><body>"
        "<joint type='ball'/><geom size='.1'/></body></body></worldbody></mujoco>")
    np.testing.assert_array_equal(rotation_dofs(ball.jnt_type, ball.jnt_dofadr), [[1, 2, 3]])


def test_c_rk4_scheme_is_known() -> None:
    scheme = c_rk4_scheme()
    assert scheme in ("textbook", "rkmk")
    if tuple(int(x) for x in mujoco.__version__.split(".")[:2]) >= (4, 0):
        assert scheme == "rkmk"


@pytest.mark.parametrize("task", ["ant", "hopper"])
def test_numpy_rk4_reproduces_mujoco_c(task: str) -> None:
    """The reference scheme gives C's ``mj_step`` over a random rollout with ground contacts; on
    Ant (a free root) the other scheme does not, on Hopper (no rotations) both do."""
    m = registry.make_task(task).model
    rkmk = c_rk4_scheme() == "rkmk"
    rng = np.random.default_rng(0)
    d = mujoco.MjData(m)
    d.qpos[:] = m.qpos0 + rng.uniform(-0.1, 0.1, m.nq)
    mujoco.mj_forward(m, d)
    ours = other = 0.0
    contacts = 0
    for _ in range(150):
        d.ctrl[:] = rng.uniform(m.actuator_ctrlrange[:, 0], m.actuator_ctrlrange[:, 1])
        mujoco.mj_forward(m, d)
        contacts += d.ncon > 0
        expected = rk4_step_numpy(m, d, c_scheme=rkmk)
        alternative = rk4_step_numpy(m, d, c_scheme=not rkmk)
        mujoco.mj_step(m, d)
        for a, b in zip(expected, (d.qpos, d.qvel), strict=True):
            ours = max(ours, float(np.abs(a - b).max()))
        for a, b in zip(alternative, (d.qpos, d.qvel), strict=True):
            other = max(other, float(np.abs(a - b).max()))
    assert contacts > 10  # the comparison covers contact
    assert ours < 1e-9, ours  # measured: 4e-12 (ant)
    if task == "ant":
        assert other > 1e-6, other  # measured: 2e-4
    else:
        assert other < 1e-9, other
