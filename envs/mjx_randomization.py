"""Domain randomization on the MJX backend: a per-world model, vmapped, resampled on the device.

The sampled values live in torch on the env's device (``DomainRandomizer``: per-world draws
selected by masks, no host synchronization); ``MjxRandomizer.model_fields`` turns them into
per-world ``mjx.Model`` fields (``[N, ...]`` float32 JAX arrays, zero-copy through DLPack) that
the jitted step puts into the model of each world inside ``vmap`` (``with_fields``).

MuJoCo derives constants from the randomized ones (``mj_setConst``); MJX has no ``set_const``,
so the ones its step reads are recomputed here on the device, per world: ``body_invweight0`` and
``dof_invweight0`` (the constraint solver's regularization of contacts, limits and friction loss),
from the mass matrix at ``qpos0`` as MuJoCo does: for body b with COM Jacobian J (6 x nv),
``A = J M^-1 J^T`` gives the translational and rotational weights trace(A[:3,:3])/3 and
trace(A[3:,3:])/3; a hinge or slide dof gets ``M^-1[i,i]``, a ball or free joint the mean of its
dofs' diagonal (translational and rotational parts apart); a body moved by slide joints alone
(``body_simple == 2``, e.g. Reacher's target) gets ``[1/mass, 0]`` and its dofs ``1/mass``.
Matches ``mj_setConst`` to float32 precision (tests/envs/test_jax_backends.py).

Not recomputed: ``tendon_invweight0`` (read by MJX for limited tendons and tendon friction loss:
such models refuse inertial randomization), ``actuator_acc0`` (muscles), ``body_subtreemass``
(subtree-velocity sensors), ``dof_M0`` and ``stat.meanmass``; no built-in task reads them.
"""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np
import torch

from robotrl.config import RandomizationConfig
from robotrl.envs.jax_bridge import jax, jax_device, jnp, mjx, to_jax, with_fields
from robotrl.envs.randomizer import DomainRandomizer

# randomized parameters whose change moves the mass matrix or the COM Jacobians
_INERTIAL = ("body_mass", "armature", "com_offset")


def _dof_average(model: mujoco.MjModel) -> np.ndarray:
    """[nv, nv] matrix averaging the dofs of a free joint's translation, its rotation, and a ball
    joint's rotation (identity on hinge and slide dofs), as MuJoCo averages ``dof_invweight0``."""
    avg = np.eye(model.nv)
    free, ball = int(mujoco.mjtJoint.mjJNT_FREE), int(mujoco.mjtJoint.mjJNT_BALL)
    for j in range(model.njnt):
        adr, kind = int(model.jnt_dofadr[j]), int(model.jnt_type[j])
        for a, b in {free: ((0, 3), (3, 6)), ball: ((0, 3),)}.get(kind, ()):
            avg[adr + a:adr + b, adr + a:adr + b] = 1.0 / (b - a)
    return avg


def invweights(m: Any, template: Any, average: jax.Array, slide_body: jax.Array,
               dof_body: jax.Array) -> dict[str, jax.Array]:
    """``body_invweight0`` [nbody, 2] and ``dof_invweight0`` [nv] of one world's model ``m``
    (``template``: an ``mjx.Data`` of it; ``average``: ``_dof_average``; ``slide_body`` [nbody]
    bool: slide-joint-only bodies; ``dof_body`` [nv]: each dof's body), as ``mj_setConst``."""
    d = template.replace(qpos=m.qpos0)
    d = mjx.crb(m, mjx.com_pos(m, mjx.kinematics(m, d)))
    minv = jnp.linalg.inv(mjx.full_m(m, d))

    def body(i: jax.Array) -> jax.Array:
        jacp, jacr = mjx.jac(m, d, d.xipos[i], i)  # [nv, 3] each
        jac = jnp.concatenate([jacp, jacr], axis=1).T  # [6, nv]
        a = jac @ minv @ jac.T
        return jnp.stack([jnp.trace(a[:3, :3]), jnp.trace(a[3:, 3:])]) / 3

    body_w = jax.vmap(body)(jnp.arange(m.nbody)).at[0].set(0.0)  # the world body weighs nothing
    dof_w = average @ jnp.diagonal(minv)
    inv_mass = 1.0 / jnp.maximum(m.body_mass, mujoco.mjMINVAL)
    slide_w = jnp.stack([inv_mass, jnp.zeros_like(inv_mass)], axis=1)
    return {"body_invweight0": jnp.where(slide_body[:, None], slide_w, body_w),
            "dof_invweight0": jnp.where(slide_body[dof_body], inv_mass[dof_body], dof_w)}


class MjxRandomizer(DomainRandomizer):
    """Randomization of ``MjxEnv``: see the module docstring. ``mjx_model`` is the env's
    ``mjx.Model`` (the nominal one every world's fields replace)."""

    def __init__(self, cfg: RandomizationConfig, model: mujoco.MjModel, mjx_model: Any,
                 obs_dim: int, num_envs: int, seed: int, device: torch.device) -> None:
        self._fields: dict[str, jax.Array] | None = None
        dev = torch.device(device)
        jdev = jax_device(dev)
        template = mjx.make_data(mjx_model, device=jdev)
        static = [jax.device_put(x, jdev) for x in (
            np.asarray(_dof_average(model), dtype=np.float32), model.body_simple == 2,
            model.dof_bodyid.astype(np.int32))]
        self._derive = jax.jit(jax.vmap(
            lambda fields: invweights(with_fields(mjx_model, fields), template, *static)))
        # MJX reads tendon_invweight0 (not recomputed here) for these tendons
        self._tendon_constraints = bool(model.ntendon) and bool(
            (model.tendon_limited != 0).any() or (model.tendon_frictionloss > 0).any())
        super().__init__(cfg, model, obs_dim, num_envs, seed, dev)

    def set_config(self, cfg: RandomizationConfig) -> None:
        inertial = [name for name in _INERTIAL if name in cfg.model_ranges()]
        if inertial and self._tendon_constraints:
            raise NotImplementedError(
                f"randomization of {', '.join(inertial)} on the mjx/brax backends: this model has "
                "limited or frictional tendons, whose tendon_invweight0 MJX reads and robotrl does "
                "not recompute; use the native 'mujoco' backend")
        super().set_config(cfg)

    def _apply(self, mask: torch.Tensor) -> None:
        if self.dense or bool(mask.any()):  # on the CPU asking is free
            self._fields = None  # rebuilt at the next read

    def model_fields(self) -> dict[str, jax.Array]:
        """Per-world ``mjx.Model`` fields ``{name: [N, ...] float32}`` of every randomized
        parameter and the constants derived from them (``with_fields`` names)."""
        if self._fields is None:
            self._fields = self._build()
        return self._fields

    def _build(self) -> dict[str, jax.Array]:
        fields = {k: to_jax(v.to(torch.float32)) for k, v in self.model_field_values().items()}
        if any(name in self._values for name in _INERTIAL):
            fields.update(self._derive(fields))
        return fields

    def qvel_kick(self, nv: int) -> jax.Array | None:
        """This step's pushes as a ``qvel`` increment [N, nv] float32 (None: pushes off)."""
        kick = self.push()
        if kick is None:
            return None
        full = torch.zeros(self.n, nv, dtype=torch.float32, device=self.device)
        full[:, self._root_dofs] = kick.to(torch.float32)
        return to_jax(full)
