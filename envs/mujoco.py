"""Native MuJoCo backend: every world stepped by ``mujoco.batch.Batch`` on a C++ thread pool.

The hot path has no per-world Python objects: actions are copied into the batch's ``ctrl``
state rows, ``Batch.step`` advances all worlds ``frame_skip`` substeps across all cores, and the
task computes observations, reward terms and terminations as batched torch ops over zero-copy
views of the batch's arrays (``torch.from_numpy`` of ``Batch.bind``).

One exception, for exactness: Gymnasium computes ``cfrc_ext`` with ``mj_rnePostConstraint``
after ``mj_step``, i.e. from the last Runge-Kutta stage's contacts. MuJoCo's batch engine has no
hook to run that function on its worker's MjData, so tasks that read ``cfrc_ext`` (Ant,
Humanoid) use a persistent batch and compute it per world from ``Batch.get_data`` (~20 us per
world on Humanoid, about 6% of its physics cost).
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import mujoco
import numpy as np
import torch
from mujoco.batch import Batch, SimulationError

from robotrl.config import RandomizationConfig, resolve_randomization
from robotrl.envs.base import (
    BatchedEnv,
    EnvSpec,
    Obs,
    ObsSpec,
    StepOut,
    check_action,
    end_unstable,
    where_done,
)
from robotrl.envs.randomizer import BatchRandomizer, RandomizedEnv, randomization_seed
from robotrl.envs.tasks.base import MujocoTask, before_opengl

OBSERVATIONS: tuple[str, ...] = ("policy", "privileged")
"""Observation groups this backend returns for every task (a task may add its own:
``MujocoTask.observation_groups``, e.g. ``tokens`` and the camera's ``image``)."""

_STAGE_NONE = int(mujoco.mjtStage.mjSTAGE_NONE)
_NO_ACTUATION = int(mujoco.mjtDisableBit.mjDSBL_ACTUATION)
# warnings after which MuJoCo has auto-reset the world: the physics went unstable
_UNSTABLE = slice(int(mujoco.mjtWarning.mjWARN_BADQPOS), int(mujoco.mjtWarning.mjWARN_BADQACC) + 1)
assert _UNSTABLE.stop - _UNSTABLE.start == 3  # BADQPOS, BADQVEL, BADQACC are adjacent


def _full_physics_columns(batch: Batch) -> np.ndarray:
    """Columns of ``batch.state`` that make up ``mjSTATE_FULLPHYSICS`` and ``USERDATA`` (a
    task's episode variables, e.g. the instruction; empty for most tasks), in ``mj_getState``
    order."""
    full = int(mujoco.mjtState.mjSTATE_FULLPHYSICS) | int(mujoco.mjtState.mjSTATE_USERDATA)
    cols: list[np.ndarray] = []
    for bit in range(full.bit_length()):
        if full & (1 << bit):
            offset, size = batch._b.state_component(1 << bit)
            cols.append(np.arange(offset, offset + size))
    out = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    assert len(out) == mujoco.mj_stateSize(batch.model, full)
    return out


class BatchSim:
    """``Sim`` over a ``Batch``: attribute access gives live float64 tensors [N, ...]."""

    def __init__(self, batch: Batch, model: mujoco.MjModel) -> None:
        self._batch = batch
        self.model = model
        self.num_envs = batch.nsim
        self._views: dict[str, torch.Tensor] = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Serve ``name`` from ``tensor`` instead of binding the batch field."""
        self._views[name] = tensor

    def __getattr__(self, name: str) -> torch.Tensor:
        if name.startswith("_"):
            raise AttributeError(name)
        views = self._views
        if name not in views:
            with warnings.catch_warnings():
                # outputs are read-only numpy arrays; the tasks only read them
                warnings.simplefilter("ignore", UserWarning)
                views[name] = torch.from_numpy(self._batch.bind(name))
        return views[name]


class MujocoEnv(RandomizedEnv, BatchedEnv):
    """``num_envs`` worlds of one task, stepped natively on ``num_threads`` threads (0: all).

    ``randomization`` (a preset name, a mapping or a ``RandomizationConfig``; see
    ``robotrl.config.RandomizationConfig``) randomizes each world's physics per episode; without it the
    env runs the nominal model with no extra work.

    ``observations`` names the groups to return besides ``policy``: ``privileged`` is
    [N, len(root_dofs) + nbody + ngeom] float32, the true base velocity
    (``MujocoTask.privileged``) then each body's mass and each geom's sliding friction as this
    world simulates them (randomized or nominal).
    """

    def __init__(
        self,
        task: MujocoTask,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        num_threads: int = 0,
        randomization: str | dict[str, Any] | RandomizationConfig | None = None,
        observations: tuple[str, ...] = ("policy",),
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        extra = task.observation_groups()
        available = (*OBSERVATIONS, *extra)
        unknown = set(observations) - set(available)
        if unknown or "policy" not in observations:
            raise ValueError(f"observations must include 'policy' and be among "
                             f"{list(available)} (task {task.name!r}), got {list(observations)}")
        self.task = task
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.model = task.model
        self.batch = Batch(
            # persistent where the task reads derived fields after a step: the stages computed
            # at the new state then carry into the next step instead of being recomputed
            self.model, num_envs, num_threads,
            persistent=task.needs_cfrc_ext or task.step_stage != _STAGE_NONE,
        )
        self.sim = BatchSim(self.batch, self.model)
        self._ctrl = self.sim.ctrl
        self._qpos = self.batch.bind("qpos")
        self._qvel = self.batch.bind("qvel")
        self._full_cols = _full_physics_columns(self.batch)
        self._cfrc: torch.Tensor | None = None
        if task.needs_cfrc_ext:
            self._cfrc = torch.zeros(num_envs, self.model.nbody, 6, dtype=torch.float64)
            self.sim.add("cfrc_ext", self._cfrc)
            self._scratch = mujoco.MjData(self.model)
        low, high = task.action_bounds()
        privileged = task.privileged_dim + self.model.nbody + self.model.ngeom
        groups = {"policy": ObsSpec((task.obs_dim,)), "privileged": ObsSpec((privileged,)),
                  **{k: ObsSpec(shape, dtype) for k, (shape, dtype) in extra.items()}}
        self.spec = EnvSpec(
            obs_dim=task.obs_dim,
            action_dim=self.model.nu,
            action_low=low,
            action_high=high,
            control_dt=task.dt,
            max_episode_steps=task.cfg.max_episode_steps,
            reward_terms=task.reward_terms,
            observations={g: groups[g] for g in available if g in observations},
            task=task.name,
            has_success=task.has_success,
            goal=task.goal_spec(),
        )
        self._gen = torch.Generator().manual_seed(seed)
        self._steps = torch.zeros(num_envs, dtype=torch.long)
        self.num_unstable = 0
        """Worlds reset because the physics went unstable, since construction."""
        # worlds a set_state made unstable (MuJoCo auto-reset them in forward): reported and
        # properly reset at the next step
        self._pending_unstable = np.zeros(num_envs, dtype=bool)
        self._seed = seed
        self._extra = [g for g in extra if g in observations]
        self._camera = None
        self._final: tuple[np.ndarray, np.ndarray] | None = None  # see render(final=True)
        if "image" in self._extra:
            from robotrl.envs.camera import RayCamera

            _, height, width = extra["image"][0]
            self._camera = RayCamera(self.model, task.camera, width, height)
        self._userdata = self.batch.bind("userdata")
        self._act = self.batch.bind("act")
        self._disableflags = (self.batch.expand("opt.disableflags")
                              if task.reset_unactuated else None)
        """Per-world ``opt.disableflags``, where the reset's mj_forward runs without actuation."""
        self._dr: BatchRandomizer | None = None
        dr_cfg = resolve_randomization(randomization)
        if dr_cfg.enabled():
            self.set_randomization(dr_cfg)
        self._bind_task_fields()
        self.reset()

    # ------------------------------------------------------------------ internals
    def _bind_task_fields(self) -> None:
        """Bind every field the task reads now: a derived field bound later misses a call."""
        self.batch.reset()
        zero = torch.zeros(self.num_envs, self.model.nu, dtype=torch.float64)
        before = self.task.before_step(self.sim)
        self.task.observe(self.sim)
        self.task.rewards(self.sim, before, zero)
        self.task.terminated(self.sim)

    def _warning_counts(self) -> np.ndarray:
        return self.batch.warning[:, _UNSTABLE, 1].sum(axis=1)

    def _reset_worlds(self, ids: np.ndarray) -> None:
        """Reset worlds ``ids`` (sorted int array) to fresh samples of the task's reset state."""
        self.task.before_reset(self.sim, torch.from_numpy(ids).long())
        qpos, qvel = self.task.reset_state(len(ids), self._gen)
        if self._dr is not None:
            mask = torch.zeros(self.num_envs, dtype=torch.bool)
            mask[torch.from_numpy(ids).long()] = True
            self._dr.on_reset(mask)
        self.batch.reset(ids, stage=_STAGE_NONE)
        self._qpos[ids] = qpos.numpy()
        self._qvel[ids] = qvel.numpy()
        if self.task.num_userdata:
            self._userdata[ids] = self.task.reset_userdata(len(ids), self._gen).numpy()
        act = self.task.reset_act(len(ids), self._gen)
        if act is not None:
            self._act[ids] = act.numpy()
        if self._disableflags is None:
            self.batch.forward(ids)  # as Gymnasium's set_state: mj_forward at the new state
        else:  # as dm_control's resets: mj_forward without actuation
            self._disableflags[ids] |= _NO_ACTUATION
            self.batch.forward(ids)
            self._disableflags[ids] &= ~_NO_ACTUATION
        self._after_reset(ids)
        self._pending_unstable[ids] = False

    def _after_reset(self, ids: np.ndarray) -> None:
        t = torch.as_tensor(ids, dtype=torch.long)
        self._steps[t] = torch.as_tensor(
            np.rint(self.batch.bind("time")[ids] / self.task.dt), dtype=torch.long
        )
        if self._cfrc is not None:
            self._cfrc[t] = 0.0  # Gymnasium's reset runs no mj_rnePostConstraint
        self._warn = self._warning_counts()

    def _post_constraint_cfrc(self) -> None:
        """cfrc_ext as Gymnasium computes it: mj_rnePostConstraint after mj_step, per world."""
        assert self._cfrc is not None
        scratch, model, out = self._scratch, self.model, self._cfrc.numpy()
        for i in range(self.num_envs):
            self.batch.get_data(i, scratch)
            mujoco.mj_rnePostConstraint(model, scratch)
            out[i] = scratch.cfrc_ext

    def _physics_step(self) -> np.ndarray:
        """Advance all worlds one control step; return the bool mask of unstable worlds."""
        unstable = np.zeros(self.num_envs, dtype=bool)
        try:
            self.batch.step(nstep=self.task.frame_skip, stage=self.task.step_stage)
        except SimulationError as err:
            unstable[err.ids] = True
        counts = self._warning_counts()
        unstable |= (counts != self._warn) | self._pending_unstable
        self._pending_unstable[:] = False
        self._warn = counts
        return unstable

    def _out(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float32)
        return x if self.device.type == "cpu" else x.to(self.device, non_blocking=True)

    def _observe(self, policy: torch.Tensor) -> Obs:
        """The observation groups, given the ``policy`` group [N, obs_dim] float64 (noised)."""
        obs = {"policy": self._out(policy)}
        if "privileged" in self.spec.observations:
            # an unstable world's state may be NaN: it ends this step, its values must not
            # reach a normalizer (as end_unstable does for the policy group)
            obs["privileged"] = self._out(torch.nan_to_num(torch.cat([
                self.task.privileged(self.sim), *self._physics_features()], dim=1)))
        for name in self._extra:
            if name == "image":
                assert self._camera is not None
                value = self._camera.render(self.batch, self.task.geom_colors(self.sim))
            else:
                value = self.task.observe_group(name, self.sim)
            obs[name] = value.to(self.device)
        return obs

    def _physics_features(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Body masses [N, nbody] and geom sliding frictions [N, ngeom], float64, as simulated."""
        values = {} if self._dr is None else self._dr.physics_params()
        n, m = self.num_envs, self.model
        mass = values.get("body_mass")
        friction = values.get("friction")
        if mass is None:
            mass = torch.from_numpy(m.body_mass).expand(n, -1)
        if friction is None:
            friction = torch.from_numpy(m.geom_friction[:, 0]).expand(n, -1)
        return mass, friction

    # ------------------------------------------------------------------ protocol
    def reset(self, seed: int | None = None) -> Obs:
        if seed is not None:
            self._gen.manual_seed(seed)
            if self._dr is not None:
                self._dr.gen.manual_seed(randomization_seed(seed))
        self._final = None
        self._reset_worlds(np.arange(self.num_envs, dtype=np.int32))
        return self.observe()

    def step(self, action: torch.Tensor) -> StepOut:
        check_action(action, self.spec, self.num_envs)
        action = policy_action = action.detach().to("cpu", torch.float64)
        dr = self._dr
        if dr is not None:
            action = dr.action(action)
            dr.before_physics()
        before = self.task.before_step(self.sim)
        self._ctrl.copy_(self.task.apply_action(self.sim, action, policy_action))
        unstable_np = self._physics_step()
        if self._cfrc is not None:
            self._post_constraint_cfrc()
        terms = self.task.rewards(self.sim, before, action)
        reward = torch.stack(list(terms.values())).sum(dim=0)
        terminated = self.task.terminated(self.sim)
        self.task.advance(self.sim, self._gen)
        obs = self.task.observe(self.sim)
        self._steps += 1
        truncated = self._steps >= self.spec.max_episode_steps
        n_unstable = int(unstable_np.sum())
        if n_unstable:
            self.num_unstable += n_unstable
            terminated, truncated, reward, obs = end_unstable(
                torch.from_numpy(unstable_np), terminated, truncated, reward, obs)
        done = terminated | truncated
        if dr is not None:
            obs = dr.observe(obs)
            dr.after_step(self._steps.masked_fill(done, 0))
        final_obs = self._observe(obs)
        success = distance = None  # read before the auto-reset below moves finished worlds
        if self.spec.goal is not None:  # one distance serves both: GoalSpec defines success
            distance = self.task.goal_distance(self.sim)
            success = distance < self.spec.goal.success_distance
        elif self.task.has_success:
            success = self.task.success(self.sim)
        if success is not None and n_unstable:
            success = success & ~torch.from_numpy(unstable_np)
        next_obs = final_obs
        self._final = None
        if bool(done.any()):
            ids = done.nonzero().flatten().numpy().astype(np.int32)
            self._final = (ids, self.batch.state[ids])  # the last frames (render(final=True))
            self._reset_worlds(ids)
            reset_obs = self.task.observe(self.sim)
            if dr is not None:
                reset_obs = dr.observe(reset_obs)
            next_obs = where_done(done, self._observe(reset_obs), final_obs)
        info: dict[str, Any] = {
            "final_obs": final_obs,
            "reward_terms": {k: self._out(v) for k, v in terms.items()},
            "unstable": n_unstable,
        }
        metrics = self.task.step_metrics(self.sim)
        if metrics:
            info["metrics"] = {k: self._out(v) for k, v in metrics.items()}
        if success is not None:
            info["success"] = success.to(self.device)
        if distance is not None:
            info["goal_distance"] = self._out(distance)
        dev = self.device
        return StepOut(next_obs, self._out(reward), terminated.to(dev), truncated.to(dev), info)

    def observe(self) -> Obs:
        obs = self.task.observe(self.sim)
        return self._observe(obs if self._dr is None else self._dr.observe(obs))

    def get_state(self) -> torch.Tensor:
        """MuJoCo's ``mjSTATE_FULLPHYSICS`` vector of every world, [N, S] float64."""
        return torch.from_numpy(self.batch.state[:, self._full_cols]).to(self.device)

    def set_state(self, state: torch.Tensor, env_ids: torch.Tensor | None = None) -> None:
        """Restore worlds as a fresh reset would: warm start cleared, derived fields recomputed."""
        if env_ids is None:
            ids = np.arange(self.num_envs)
        else:
            ids = torch.as_tensor(env_ids).detach().cpu().long().numpy().reshape(-1)
        state_np = torch.as_tensor(state).detach().cpu().to(torch.float64).numpy()
        expected = (len(ids), len(self._full_cols))
        if state_np.shape != expected:
            raise ValueError(
                f"state has shape {state_np.shape}, expected {expected} = (len(env_ids), "
                f"mj_stateSize(mjSTATE_FULLPHYSICS))"
            )
        if len(ids) and (ids.min() < 0 or ids.max() >= self.num_envs):
            raise ValueError(f"env_ids must be in [0, {self.num_envs}), got {ids.tolist()}")
        if len(np.unique(ids)) != len(ids):
            raise ValueError("env_ids must be unique")
        order = np.argsort(ids)
        ids = ids[order].astype(np.int32)
        self.batch.reset(ids, stage=_STAGE_NONE)
        self.batch.state[np.ix_(ids, self._full_cols)] = state_np[order]
        before = self._warning_counts()
        self.batch.forward(ids)
        self._pending_unstable |= self._warning_counts() != before
        self._after_reset(ids)

    def state_dict(self) -> dict[str, Any]:
        """The batch's full integration state (warm start and controls included), episode step
        counters and the reset RNG: loading it continues every world exactly as if uninterrupted
        (for tasks whose rewards read state, not RK4-stage derived fields)."""
        return {
            "integration_state": torch.from_numpy(self.batch.state.copy()),
            "steps": self._steps.clone(),
            "generator": self._gen.get_state(),
            "num_unstable": self.num_unstable,
            "cfrc_ext": None if self._cfrc is None else self._cfrc.clone(),
            "randomization": None if self._dr is None else self._dr.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rows = state["integration_state"].numpy()
        if rows.shape != self.batch.state.shape:
            raise ValueError(
                f"checkpointed env state has shape {rows.shape}, this env needs "
                f"{self.batch.state.shape} (num_envs, state size): different task or num_envs?"
            )
        self._load_randomization(state.get("randomization"))
        self.batch.state[:] = rows
        self.batch.forward()
        self._steps.copy_(state["steps"])
        self._gen.set_state(state["generator"])
        self.num_unstable = int(state["num_unstable"])
        if self._cfrc is not None and state.get("cfrc_ext") is not None:
            self._cfrc.copy_(state["cfrc_ext"])
        self._warn = self._warning_counts()

    def render(self, env_id: int = 0, width: int = 480, height: int = 480,
               camera: str | int = "view", final: bool = False) -> np.ndarray:
        """RGB frame [H, W, 3] uint8 of world ``env_id`` (needs an offscreen GL: MUJOCO_GL=egl),
        from ``camera``: "view" (the task's video camera, ``MujocoTask.view``: Gymnasium's
        camera settings, following the robot), "task" (the task's policy camera), a MuJoCo
        camera name or id, or -1 (the model's free camera); with the world's own geom colours
        (``MujocoTask.geom_colors``: tabletop recolours its objects). ``final``: if the last
        ``step`` ended the world's episode, its last state before the auto-reset (the episode's
        last frame; ``info["final_obs"]``'s state), else the current state."""
        data = self.batch.get_data(env_id)
        if final and self._final is not None and env_id in self._final[0]:
            ids, rows = self._final
            mujoco.mj_setState(self.model, data, rows[list(ids).index(env_id)],
                               mujoco.mjtState.mjSTATE_INTEGRATION)
        model = self.model if self._dr is None else self.batch.get_model(env_id)
        mujoco.mj_forward(model, data)
        renderer = getattr(self, "_renderer", None)
        if renderer is None or (renderer.width, renderer.height) != (width, height):
            if renderer is not None:
                renderer.close()
            before_opengl()
            self._renderer = renderer = mujoco.Renderer(_render_model(self.model), height=height,
                                                        width=width)
        if camera == "task":
            camera = self.task.camera if self.task.camera is not None else -1
        if camera == "view":
            camera = self.view_camera(data)
        elif isinstance(camera, str):
            name, camera = camera, mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
            if camera < 0:
                known = [self.model.camera(i).name for i in range(self.model.ncam)]
                raise ValueError(f"no camera {name!r} in task {self.task.name!r}; known: "
                                 f"'view', 'task', {known}")
        renderer.update_scene(data, camera=camera)
        colours = self.task.geom_colors(self.sim)[env_id].numpy()
        scene = renderer.scene
        for i in range(scene.ngeom):
            geom = scene.geoms[i]
            if geom.objtype == mujoco.mjtObj.mjOBJ_GEOM and 0 <= geom.objid < len(colours):
                geom.rgba[:3] = colours[geom.objid]
        for centre, radius in self.task.markers(data):  # e.g. a goal kept in userdata
            if scene.ngeom < scene.maxgeom:
                mujoco.mjv_initGeom(scene.geoms[scene.ngeom], mujoco.mjtGeom.mjGEOM_SPHERE,
                                    np.full(3, radius), np.asarray(centre), np.eye(3).flatten(),
                                    np.array([0.1, 0.8, 0.2, 0.5], dtype=np.float32))
                scene.ngeom += 1
        return renderer.render()

    def view_camera(self, data: mujoco.MjData) -> mujoco.MjvCamera:
        """The task's ``View`` as a MuJoCo free camera posed for ``data`` (after a forward)."""
        view = self.task.view
        if getattr(self, "_view_lookat", None) is None:  # Gymnasium's: median geom at qpos0
            rest = mujoco.MjData(self.model)
            mujoco.mj_forward(self.model, rest)
            self._view_lookat = (np.median(rest.geom_xpos, axis=0) if view.lookat is None
                                 else np.asarray(view.lookat, dtype=np.float64))
            body = mujoco.mjtObj.mjOBJ_BODY
            self._view_body = (-1 if view.track is None
                               else mujoco.mj_name2id(self.model, body, view.track))
            if view.track is not None and self._view_body < 0:
                raise ValueError(f"task {self.task.name!r}: view tracks unknown body "
                                 f"{view.track!r}")
        cam = mujoco.MjvCamera()
        cam.type = mujoco.mjtCamera.mjCAMERA_FREE
        cam.distance = self.model.stat.extent if view.distance is None else view.distance
        cam.elevation, cam.azimuth = view.elevation, view.azimuth
        cam.lookat[:] = self._view_lookat
        if self._view_body >= 0:
            cam.lookat[:2] = data.subtree_com[self._view_body, :2]
            if view.lookat is None:
                cam.lookat[2] = data.subtree_com[self._view_body, 2]
        return cam

    # ------------------------------------------------------------------ randomization
    def _make_randomizer(self, cfg: RandomizationConfig) -> BatchRandomizer:
        return BatchRandomizer(cfg, self.batch, self.model, self.task.obs_dim,
                               randomization_seed(self._seed), self.task.obs_noise_scale())

    def close(self) -> None:
        renderer = getattr(self, "_renderer", None)
        if renderer is not None:
            renderer.close()
            self._renderer = None


def _render_model(model: mujoco.MjModel, half_size: float = 1000.0) -> mujoco.MjModel:
    """A copy of ``model`` for drawing: floor planes drawn ``half_size`` metres each way with
    the same checker pitch (Gymnasium's are 40 m: a running HalfCheetah leaves its floor within
    a few seconds and then runs over the void). Collision ignores a plane's size; the physics
    model is untouched."""
    model = copy.copy(model)
    for g in np.flatnonzero(model.geom_type == mujoco.mjtGeom.mjGEOM_PLANE):
        if model.geom_size[g, 0] <= 0 or model.geom_size[g, 0] >= half_size:
            continue  # drawn infinite already, or large enough
        scale = half_size / model.geom_size[g, 0]
        model.geom_size[g, :2] *= scale
        mat = model.geom_matid[g]
        if mat >= 0 and not model.mat_texuniform[mat]:  # texture repeats per plane: keep pitch
            model.mat_texrepeat[mat] *= scale
    return model
