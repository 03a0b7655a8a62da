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
float64 the fixed MJX matches C to 1e-13 per substep; the rest under RK4 is MuJoCo C's own RK4
step departing from the textbook scheme MJX implements (~1e-4 in qvel per contact substep).

``use_c_plane_capsule_frame`` swaps the collider in MJX's dispatch table, process-wide: Brax's
``mjx`` and ``generalized`` pipelines (which build friction from the contact frame) get it too,
so their capsule-on-floor contacts move from MJX's reference numbers to C's. If MJX's internals
moved it warns and leaves MJX as it is.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp


def _plane_capsule(plane: Any, cap: Any, plane_sphere: Any) -> tuple[jax.Array, ...]:
    """Two contacts (the capsule's end spheres) of a plane and a capsule, in C's frame;
    ``plane_sphere``: MJX's distance and point of a plane and a sphere."""
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
