"""Where MJX (mujoco-mjx 3.x) computes differently from MuJoCo C, and the fix robotrl applies.

Plane-capsule contact frame. MuJoCo C (``mjc_PlaneCapsule``, then ``mju_makeFrame``) takes the
capsule axis projected onto the plane as the contact's first tangent; MJX's ``plane_capsule``
falls back to the world y axis whenever that projection is shorter than 0.5, i.e. for every
capsule within 30 degrees of the plane normal. A pyramidal friction cone (MuJoCo's default) is
not invariant to the rotation of its tangent frame, so those contacts get other friction forces.
HalfCheetah's and Hopper's capsules move in the x-z plane (the two frames differ by 90 degrees,
which leaves a square pyramid unchanged); Gymnasium's Ant lands on steep shins: measured on CPU
from the same state, its qvel departed from the native backend's by 0.1-1.2 within 4 control
steps, and by 2e-5 (step 2) to 1e-3 (step 10) with C's frame. With the Euler integrator and
float64 the fixed MJX matches C to 1e-13 per substep; under RK4 the rest was the RK4 scheme
itself (below).

``use_c_plane_capsule_frame`` swaps the collider in MJX's dispatch table, process-wide: Brax's
``mjx`` and ``generalized`` pipelines (which build friction from the contact frame) get it too,
so their capsule-on-floor contacts move from MJX's reference numbers to C's. If MJX's internals
moved it warns and leaves MJX as it is.

RK4 on rotations. MJX's ``rungekutta4`` is the textbook scheme (every stage and the final update
integrate positions with the weighted sum of stage velocities). MuJoCo C 4.0's ``mj_RungeKutta``
is a Runge-Kutta-Munthe-Kaas scheme on free and ball joints: the angular velocity of each later
stage is mapped through the inverse differential of the exponential map,
``k = w + (theta x w) / 2 + theta x (theta x w) / 12`` with ``theta = h a k_prev`` the stage's
rotation increment, and those ``k`` (not the raw ``w``) move the stage positions and the final
quaternion. Found by bisection (``benchmarks/mjx_fidelity.py --bisect``): with the Euler
integrator, float64 MJX matches C to 1e-14; under RK4, MJX matched a textbook RK4 written over C's
own ``mj_forward`` to 1e-15 while C departed from it by up to 2e-4 in qvel per Ant substep (4e-7
in the quaternion of a lone spinning box, no contact); the scheme above matches C to 4e-12 over
300 Ant substeps with contacts. Joints without rotations (HalfCheetah, Hopper, Walker2d) are
integrated the same by both. ``use_c_rungekutta4`` checks which scheme the installed MuJoCo C
runs (one step of a spinning box) and gives MJX the same one.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import mujoco
import numpy as np

if TYPE_CHECKING:  # JAX is imported where MJX is patched: the C-side checks run without it
    import jax


def _plane_capsule(plane: Any, cap: Any, plane_sphere: Any) -> tuple[jax.Array, ...]:
    """Two contacts (the capsule's end spheres) of a plane and a capsule, in C's frame;
    ``plane_sphere``: MJX's distance and point of a plane and a sphere."""
    import jax.numpy as jnp

    n, axis = plane.mat[:, 2], cap.mat[:, 2]
    tangent = axis - n * jnp.dot(n, axis)
    norm = jnp.linalg.norm(tangent)
    # only a capsule exactly along the normal has no projection: C normalizes to the x axis then
    x_axis = jnp.array([1.0, 0.0, 0.0], tangent.dtype)
    tangent = jnp.where(norm < 1e-6, x_axis, tangent / jnp.maximum(norm, 1e-6))
    frame = jnp.array([[n, tangent, jnp.cross(n, tangent)]])
    segment = axis * cap.size[1]
    dists, points = [], []
    for offset in (segment, -segment):
        dist, pos = plane_sphere(n, plane.pos, cap.pos + offset, cap.size[0])
        dists.append(dist[None])
        points.append(pos[None])
    return jnp.concatenate(dists), jnp.concatenate(points), jnp.concatenate([frame, frame])


def use_c_plane_capsule_frame() -> bool:
    """Make MJX's plane-capsule contacts use C's frame; False (with a warning) if it could not."""
    try:
        from mujoco.mjx._src import collision_driver, collision_primitive
        from mujoco.mjx._src.types import GeomType

        key = (GeomType.PLANE, GeomType.CAPSULE)
        table = collision_driver._COLLISION_FUNC
        if key not in table:
            raise KeyError(key)
        plane_sphere = collision_primitive._plane_sphere

        def plane_capsule(plane: Any, cap: Any) -> tuple[jax.Array, ...]:
            return _plane_capsule(plane, cap, plane_sphere)

        table[key] = collision_primitive.collider(ncon=2)(plane_capsule)
    except Exception as err:  # MJX's private layout moved: keep MJX's own collider
        warnings.warn(f"robotrl could not fix MJX's plane-capsule contact frame ({err!r}): "
                      "capsule feet on a floor (Ant) will not match the native backend",
                      RuntimeWarning, stacklevel=2)
        return False
    return True


# ---------------------------------------------------------------------- RK4 on rotations
_RK4_A, _RK4_B = (0.5, 0.5, 1.0), (1 / 6, 1 / 3, 1 / 3, 1 / 6)  # RK4's tableau (A is diagonal)


def _dexpinv(theta: Any, w: Any) -> Any:
    """C's stage velocity of a rotation: ``w`` through the inverse differential of the exponential
    map at ``theta`` (rows of 3), to second order as C computes it."""
    if isinstance(w, np.ndarray):
        cross = np.cross
    else:
        import jax.numpy as jnp

        cross = jnp.cross
    return w + 0.5 * cross(theta, w) + cross(theta, cross(theta, w)) / 12.0


def rotation_dofs(jnt_type: Any, jnt_dofadr: Any) -> np.ndarray:
    """[R, 3] dof indices of the angular velocity of every free and ball joint."""
    starts = [int(adr) + (3 if int(typ) == mujoco.mjtJoint.mjJNT_FREE else 0)
              for typ, adr in zip(np.asarray(jnt_type), np.asarray(jnt_dofadr), strict=True)
              if int(typ) in (mujoco.mjtJoint.mjJNT_FREE, mujoco.mjtJoint.mjJNT_BALL)]
    return np.asarray(starts, dtype=np.int64).reshape(-1, 1) + np.arange(3)


def _stage_velocity(rot: np.ndarray, k_prev: Any, w: Any, step: Any) -> Any:
    """The velocity a stage contributes: ``w``, with each rotation mapped through ``_dexpinv`` at
    the stage's increment ``step * k_prev``."""
    if not len(rot):
        return w
    corrected = _dexpinv(step * k_prev[rot], w[rot])
    if isinstance(w, np.ndarray):
        out = w.copy()
        out[rot] = corrected
        return out
    return w.at[rot].set(corrected)


def rk4_step_numpy(m: mujoco.MjModel, d: mujoco.MjData, c_scheme: bool) -> tuple[np.ndarray, ...]:
    """(qpos, qvel) after one RK4 step from ``d`` (``mj_forward`` done), written over MuJoCo C's
    own ``mj_forward``: the textbook scheme (``c_scheme=False``) or C 4.0's (True). ``d`` is left
    as it was. What ``benchmarks/mjx_fidelity.py`` and the scheme check compare C against; models
    without activations (``na == 0``)."""
    if m.na:
        raise ValueError("rk4_step_numpy covers models without activations (na == 0)")
    h, rot = m.opt.timestep, rotation_dofs(m.jnt_type, m.jnt_dofadr) if c_scheme else np.empty(0)
    e = mujoco.MjData(m)
    q0, v0 = d.qpos.copy(), d.qvel.copy()
    ks, accs = [v0], [d.qacc.copy()]
    for a in _RK4_A:
        e.qpos[:] = q0
        mujoco.mj_integratePos(m, e.qpos, a * ks[-1], h)
        e.qvel[:] = v0 + h * a * accs[-1]
        e.ctrl[:], e.qacc_warmstart[:] = d.ctrl, d.qacc_warmstart
        e.time = d.time + a * h
        mujoco.mj_forward(m, e)
        ks.append(_stage_velocity(rot, ks[-1], e.qvel.copy(), h * a))
        accs.append(e.qacc.copy())
    qpos = q0.copy()
    mujoco.mj_integratePos(m, qpos, sum(b * k for b, k in zip(_RK4_B, ks, strict=True)), h)
    return qpos, v0 + h * sum(b * f for b, f in zip(_RK4_B, accs, strict=True))


_SPINNING_BOX = """<mujoco><option integrator="RK4" timestep="0.01" gravity="0 0 0"/><worldbody>
<body><freejoint/><geom type="box" size="0.3 0.2 0.1" mass="1"/></body></worldbody></mujoco>"""


def c_rk4_scheme() -> str:
    """Which RK4 the installed MuJoCo C runs on rotations, from one step of a spinning box (no
    contact; its gyroscopic torque makes the stage velocities differ): "textbook", "rkmk" (C
    4.0's ``_dexpinv``) or "unknown"."""
    m = mujoco.MjModel.from_xml_string(_SPINNING_BOX)
    d = mujoco.MjData(m)
    d.qvel[:] = (0.1, 0.2, 0.3, 1.0, 2.0, 3.0)
    mujoco.mj_forward(m, d)
    guesses = {name: rk4_step_numpy(m, d, c_scheme)[0] for name, c_scheme in
               (("textbook", False), ("rkmk", True))}
    mujoco.mj_step(m, d)
    for name, qpos in guesses.items():
        if np.abs(qpos - d.qpos).max() < 1e-10:  # the schemes differ by 4e-7 here
            return name
    return "unknown"


def _rungekutta4_rkmk(m: Any, d: Any) -> Any:
    """MJX's ``rungekutta4`` with C 4.0's stage velocities on rotations (``_stage_velocity``)."""
    from mujoco.mjx._src import forward, scan

    d0, h = d, m.opt.timestep
    rot = rotation_dofs(m.jnt_type, m.jnt_dofadr)

    def integrate(qpos: jax.Array, qvel: jax.Array) -> jax.Array:
        return scan.flat(m, lambda *a: forward._integrate_pos(*a, dt=h), "jqv", "q",
                         m.jnt_type, qpos, qvel)

    k, b0 = d.qvel, _RK4_B[0]
    qvel, qacc, act_dot = b0 * k, b0 * d.qacc, b0 * d.act_dot
    for a, b in zip(_RK4_A, _RK4_B[1:], strict=True):
        stage = d.replace(qpos=integrate(d0.qpos, a * k), qvel=d0.qvel + a * h * d.qacc,
                          act=d0.act + a * h * d.act_dot, time=d0.time + a * h)
        d = forward.forward(m, stage)
        k = _stage_velocity(rot, k, stage.qvel, a * h)
        qvel, qacc, act_dot = qvel + b * k, qacc + b * d.qacc, act_dot + b * d.act_dot
    d = d.replace(qpos=d0.qpos, qvel=d0.qvel, act=d0.act, time=d0.time)
    return forward._advance(m, d, act_dot, qacc, qvel)


MJX_RUNGEKUTTA4: Any = None
"""MJX's own (textbook) ``rungekutta4`` once ``use_c_rungekutta4`` replaced it (for bisection)."""


def use_c_rungekutta4() -> str:
    """Give MJX the RK4 scheme MuJoCo C runs (``c_rk4_scheme``); returns the scheme, and warns
    when it could not (C's is unknown, or MJX's internals moved)."""
    scheme = c_rk4_scheme()
    if scheme == "textbook":
        return scheme
    try:
        if scheme != "rkmk":
            raise RuntimeError("MuJoCo C's RK4 is neither the textbook scheme nor C 4.0's")
        from mujoco.mjx._src import forward

        for name in ("rungekutta4", "forward", "_advance", "_integrate_pos"):
            getattr(forward, name)
        global MJX_RUNGEKUTTA4
        if forward.rungekutta4 is not _rungekutta4_rkmk:
            MJX_RUNGEKUTTA4 = forward.rungekutta4
        forward.rungekutta4 = _rungekutta4_rkmk  # mjx.step looks it up at each call
    except Exception as err:
        warnings.warn(f"robotrl could not match MJX's RK4 to MuJoCo C's ({err!r}): RK4 models "
                      "with free or ball joints (Ant, Humanoid) will not match the native backend",
                      RuntimeWarning, stacklevel=2)
        return "unknown"
    return scheme
