"""MJX backend: the native tasks stepped by MuJoCo XLA, jitted and vmapped, on a GPU or CPU.

JAX does the physics: one jitted call per control step sets ``ctrl`` and runs ``frame_skip``
``mjx.step`` substeps for every world (``vmap``), then ``mjx.rne_postconstraint`` for tasks that
read ``cfrc_ext`` (Gymnasium computes it after ``mj_step``, as the native backend does). The
task's own torch code (``envs/tasks``) computes observations, reward terms, terminations and
reset samples on torch views of the JAX arrays (DLPack: zero-copy, stream-ordered, no host sync),
so a task is defined once for both backends. Auto-reset is on device: every step samples a reset
state for every world with a torch generator on the env's device and one jitted call puts it,
with ``mjx.forward``, into the finished worlds (``where``); nothing is copied to the host.

Differences from the native backend (see tests/envs/test_jax_backends.py for the tolerances):

* float32 physics (JAX's default), so trajectories drift from the float64 native ones; contact
  sims diverge chaotically after some tens of steps.
* Solver: on CPU the model's ``opt.iterations``/``ls_iterations``; on a GPU 1 Newton iteration
  and 8 line-search steps unless set (see ``MjxEnv``), so GPU physics is less converged
  than the native backend's. MJX has no PGS solver: Humanoid's MJCF asks for PGS, which becomes
  Newton here (different contact forces; Humanoid is not parity-tested on mjx).
* MJX computes two things unlike MuJoCo C, which ``envs/mjx_fixes.py`` makes it compute as C
  does (at import): the contact frame of a capsule on a plane, and RK4 on free and ball joints
  (C 4.0 runs a Runge-Kutta-Munthe-Kaas step there). With both, float64 MJX matches C to 1e-10
  per Ant control step. In float32, from the native worlds' state before every step, the
  observed positions and velocities agree to 2.4e-4 relative on HalfCheetah, 4.1e-6 on Hopper,
  2.4e-5 on Walker2d, 8.5e-5 on Ant (``benchmarks/mjx_fidelity.py``); free-running from one
  state HalfCheetah, Hopper and Ant stay within 1e-2 for 15 steps, Humanoid (Newton for PGS)
  within 2e-4 for 8, and then the chaotic trajectories separate.
* Reacher's goal rejection sampling reads a count on the host at each reset sample (one
  synchronization per step on a GPU); the other tasks' reset samples stay on the device.
* Unstable worlds (non-finite or > 1e10 state; MuJoCo's BADQPOS/BADQVEL tests) end with
  ``terminated``, reward 0 and a reset, as natively; MJX has no warning counters.
* Non-finite actions: on CPU the action is checked as natively (an error); on a GPU that check
  would synchronize every step, so a non-finite action makes its world unstable instead.
* Domain randomization (``randomization=``) draws the same values as natively for the same seed
  (``envs/mjx_randomization.py``); a push is added to ``qvel`` inside the jitted step, after the
  task's ``before_step`` (natively before it; the built-in tasks' ``before_step`` reads positions).
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import mujoco
import torch

from robotrl.config import RandomizationConfig, resolve_randomization
from robotrl.envs.base import (
    BatchedEnv,
    EnvSpec,
    Obs,
    StepOut,
    check_action,
    check_action_shape,
    end_unstable,
)
from robotrl.envs.jax_bridge import (
    GPU_LS_ITERATIONS,
    jax,
    jax_device,
    jnp,
    mjx,
    to_jax,
    to_torch,
    with_fields,
)
from robotrl.envs.randomizer import DomainRandomizer, RandomizedEnv, randomization_seed
from robotrl.envs.tasks.base import MujocoTask

MAX_STATE = 1e10
"""MuJoCo's mjMAXVAL: a larger |qpos| or |qvel| counts as unstable."""
_FULL_PHYSICS = int(mujoco.mjtState.mjSTATE_FULLPHYSICS)
# mjtState element -> mjx.Data field, for the elements of mjSTATE_FULLPHYSICS
# what a restart (reset, set_state, load_state_dict) sets; every other field as after make_data
_RESTART_FIELDS = ("time", "qpos", "qvel", "act", "ctrl", "qacc_warmstart", "history",
                   "plugin_state")
_STATE_FIELDS = {
    int(mujoco.mjtState.mjSTATE_TIME): "time",
    int(mujoco.mjtState.mjSTATE_QPOS): "qpos",
    int(mujoco.mjtState.mjSTATE_QVEL): "qvel",
    int(mujoco.mjtState.mjSTATE_ACT): "act",
    int(mujoco.mjtState.mjSTATE_HISTORY): "history",
    int(mujoco.mjtState.mjSTATE_PLUGIN): "plugin_state",
    int(mujoco.mjtState.mjSTATE_USERDATA): "userdata",  # a task's episode variables
}


# ---------------------------------------------------------------------- Sim over mjx.Data
class MjxSim:
    """``Sim`` over a batched ``mjx.Data``: attribute access gives float64 tensors [N, ...].

    Fields are converted once per ``bind`` (float32 -> float64 copies on the device, so the tasks
    compute as natively and no torch tensor aliases a JAX buffer beyond the step).
    """

    def __init__(self, model: mujoco.MjModel, num_envs: int) -> None:
        self.model = model
        self.num_envs = num_envs
        self._data: Any = None
        self._cache: dict[str, torch.Tensor] = {}

    def bind(self, data: Any) -> None:
        self._data = data
        self._cache.clear()

    def __getattr__(self, name: str) -> torch.Tensor:
        if name.startswith("_"):
            raise AttributeError(name)
        cache = self._cache
        if name not in cache:
            data = self._data
            arr = getattr(data, name, None)
            if not isinstance(arr, jax.Array):
                arr = getattr(data._impl, name, None)  # derived fields: cinert, cfrc_ext, ...
            if not isinstance(arr, jax.Array):
                raise AttributeError(f"mjx.Data has no array field {name!r}")
            cache[name] = to_torch(arr).to(torch.float64)
        return cache[name]


def _on_device(task: MujocoTask, device: torch.device) -> MujocoTask:
    """A shallow copy of ``task`` whose tensor attributes (init_qpos, weights...) live on device."""
    task = copy.copy(task)
    for name, value in vars(task).items():
        if isinstance(value, torch.Tensor):
            setattr(task, name, value.to(device))
    return task


class MjxEnv(RandomizedEnv, BatchedEnv):
    """``num_envs`` worlds of one task stepped by MJX on ``device`` (``cpu`` or ``cuda[:i]``).

    ``iterations``/``ls_iterations`` set the constraint solver's (line-search) iterations; None
    keeps the model's on CPU (parity with the native backend) and takes 1 and ``GPU_LS_ITERATIONS``
    on a GPU: with more than one solver iteration MJX runs a ``lax.while_loop`` whose condition
    XLA copies to the host every iteration (measured on an H100: ~160 device-to-host copies per
    Ant step, 10x slower), while one Newton iteration from the warm start is how Brax and MuJoCo
    Playground run MJX locomotion.

    ``randomization`` (a preset name, a mapping or a ``RandomizationConfig``) randomizes each
    world's physics per episode on the device (``envs/mjx_randomization.py``), with the same
    configs and draws as the native backend's.
    """

    def __init__(
        self,
        task: MujocoTask,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        iterations: int | None = None,
        ls_iterations: int | None = None,
        randomization: str | dict[str, Any] | RandomizationConfig | None = None,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if task.observation_groups():
            raise ValueError(f"task {task.name!r} has observation groups beyond policy "
                             f"({list(task.observation_groups())}), which the mjx backend does "
                             "not return: use backend=mujoco")
        self._restart_fields = _RESTART_FIELDS + (("userdata",) if task.num_userdata else ())
        """What a restart sets: the integration state, and a task's episode variables."""
        self.num_envs = num_envs
        self.device = torch.device(device)
        if iterations is None and self.device.type == "cuda":
            iterations = 1
        if ls_iterations is None and self.device.type == "cuda":
            ls_iterations = GPU_LS_ITERATIONS
        for name, value in (("iterations", iterations), ("ls_iterations", ls_iterations)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (None: the default), got {value}")
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.task = _on_device(task, self.device)
        model = copy.copy(task.model)
        if model.opt.solver == mujoco.mjtSolver.mjSOL_PGS:
            model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON  # MJX has no PGS (Humanoid)
        if iterations is not None:
            model.opt.iterations = iterations
        if ls_iterations is not None:
            model.opt.ls_iterations = ls_iterations
        self.model = model
        self._jdev = jax_device(self.device)
        self._gpu = self.device.type == "cuda"
        self.sim = MjxSim(task.model, num_envs)
        low, high = task.action_bounds()
        self.spec = EnvSpec(
            obs_dim=task.obs_dim, action_dim=model.nu, action_low=low, action_high=high,
            control_dt=task.dt, max_episode_steps=task.cfg.max_episode_steps,
            reward_terms=task.reward_terms, task=task.name,
        )
        self._state_layout = self._full_physics_layout()
        self._build(num_envs)
        self._gen = torch.Generator(device=self.device).manual_seed(seed)
        self._steps = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self._num_unstable = torch.zeros((), dtype=torch.long, device=self.device)
        self._seed = seed
        self._dr: DomainRandomizer | None = None
        dr_cfg = resolve_randomization(randomization)
        if dr_cfg.enabled():
            self.set_randomization(dr_cfg)
        self.reset()

    # ------------------------------------------------------------------ jitted physics
    def _build(self, n: int) -> None:
        m = mjx.put_model(self.model, device=self._jdev)
        self.mjx_model = m
        template = mjx.make_data(m, device=self._jdev)
        self._data = jax.tree.map(lambda x: jnp.repeat(x[None], n, axis=0), template)
        self.sim.bind(self._data)
        # every restart passes every field (zeros where not given): one compilation of _restart
        self._zeros = {k: torch.zeros_like(getattr(self.sim, k), dtype=torch.float32)
                       for k in self._restart_fields}
        frame_skip, post = self.task.frame_skip, self.task.needs_cfrc_ext
        # dm_control's tasks read the new state's positions and velocities (mj_step1 after the
        # step); MJX has no mj_step1, so mjx.forward: the same position and velocity fields,
        # acceleration fields of the new state (not the last substep's, as in MuJoCo)
        current = self.task.step_stage != int(mujoco.mjtStage.mjSTAGE_NONE)

        def physics(d: Any, ctrl: jax.Array, model: dict[str, jax.Array],
                    kick: jax.Array | None) -> Any:
            mw = with_fields(m, model)  # this world's randomized model (none: m itself)
            d = d.replace(ctrl=ctrl)
            if kick is not None:  # a randomization push
                d = d.replace(qvel=d.qvel + kick)
            d = jax.lax.fori_loop(0, frame_skip, lambda _, d: mjx.step(mw, d), d)
            if current:
                d = mjx.forward(mw, d)
            # Gymnasium's cfrc_ext: mj_rnePostConstraint after mj_step
            return mjx.rne_postconstraint(mw, d) if post else d

        m_reset = m  # the reset's mj_forward: without actuation for dm_control's tasks
        if self.task.reset_unactuated:
            unactuated = copy.copy(self.model)
            unactuated.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_ACTUATION)
            m_reset = mjx.put_model(unactuated, device=self._jdev)

        def restart(d: Any, mask: jax.Array, fields: dict[str, jax.Array],
                    model: dict[str, jax.Array]) -> Any:
            # as mj_resetData + setting the state + mj_forward (Gymnasium's reset/set_state);
            # cfrc_ext stays zero as after Gymnasium's reset
            fresh = mjx.forward(with_fields(m_reset, model), template.replace(**fields))
            return jax.tree.map(lambda a, b: jnp.where(mask, a, b), fresh, d)

        self._physics = jax.jit(jax.vmap(physics))
        self._restart = jax.jit(jax.vmap(restart))

    def _full_physics_layout(self) -> list[tuple[str, int]]:
        """(mjx.Data field, size) of each ``mjSTATE_FULLPHYSICS`` element, and ``USERDATA``
        where the task keeps episode variables there, in mj_getState order (the native
        backend's snapshot layout)."""
        layout = []
        spec = _FULL_PHYSICS | (int(mujoco.mjtState.mjSTATE_USERDATA)
                                if self.task.num_userdata else 0)
        for bit in range(spec.bit_length()):
            element = 1 << bit
            if not spec & element:
                continue
            size = mujoco.mj_stateSize(self.model, element)
            if element not in _STATE_FIELDS:
                if size:
                    raise NotImplementedError(f"MJX has no state element {element} (size {size})")
                continue
            layout.append((_STATE_FIELDS[element], size))
        return layout

    def _device_scope(self) -> contextlib.AbstractContextManager[Any]:
        """Factory calls in the task's code (``torch.zeros``, ``torch.rand``) land on device."""
        return torch.device(self.device) if self._gpu else contextlib.nullcontext()

    def _restart_worlds(self, mask: torch.Tensor, fields: dict[str, torch.Tensor]) -> None:
        """Restart the worlds in ``mask`` [N] bool from ``fields`` ({name: [N, ...]}; missing
        ones as after ``mj_resetData``: zero), then ``mjx.forward``."""
        jfields = {k: to_jax(fields[k].to(torch.float32) if k in fields else self._zeros[k])
                   for k in self._restart_fields}
        self._data = self._restart(self._data, to_jax(mask), jfields, self._model_fields())
        self.sim.bind(self._data)

    def _model_fields(self) -> dict[str, jax.Array]:
        return {} if self._dr is None else self._dr.model_fields()

    def _make_randomizer(self, cfg: RandomizationConfig) -> DomainRandomizer:
        from robotrl.envs.mjx_randomization import MjxRandomizer

        return MjxRandomizer(cfg, self.model, self.mjx_model, self.task.obs_dim, self.num_envs,
                             randomization_seed(self._seed), self.device)

    def _reset_fields(self, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Fresh reset samples for every world (the restart keeps those of ``mask``), after the
        task's ``before_reset`` for the worlds of ``mask``."""
        if type(self.task).before_reset is not MujocoTask.before_reset:  # (a host sync)
            self.task.before_reset(self.sim, mask.nonzero().flatten())
        qpos, qvel = self.task.reset_state(self.num_envs, self._gen)
        fields = {"qpos": qpos, "qvel": qvel}
        if self.task.num_userdata:
            fields["userdata"] = self.task.reset_userdata(self.num_envs, self._gen)
        act = self.task.reset_act(self.num_envs, self._gen)
        if act is not None:
            fields["act"] = act
        return fields

    def _push_userdata(self) -> None:
        """Write the task's edits of ``sim.userdata`` (a float64 copy) back into the worlds."""
        if self.task.num_userdata:
            self._data = self._data.replace(userdata=to_jax(self.sim.userdata.to(torch.float32)))
            self.sim.bind(self._data)

    def _out(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float32)

    # ------------------------------------------------------------------ protocol
    def reset(self, seed: int | None = None) -> Obs:
        dr = self._dr
        if seed is not None:
            self._gen.manual_seed(seed)
            if dr is not None:
                dr.gen.manual_seed(randomization_seed(seed))
        with self._device_scope():
            mask = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
            if dr is not None:
                dr.on_reset(mask)
            self._restart_worlds(mask, self._reset_fields(mask))
            self._steps.zero_()
            obs = self.task.observe(self.sim)
            return {"policy": self._out(obs if dr is None else dr.observe(obs))}

    def step(self, action: torch.Tensor) -> StepOut:
        if self._gpu:
            check_action_shape(action, self.spec, self.num_envs)
        else:
            check_action(action, self.spec, self.num_envs)
        task, sim, dev, dr = self.task, self.sim, self.device, self._dr
        with self._device_scope():
            ctrl = policy_action = action.detach().to(dev, torch.float64)
            kick = None
            if dr is not None:
                ctrl = dr.action(ctrl)
                kick = dr.qvel_kick(self.model.nv)
            before = task.before_step(sim)
            applied = ctrl.to(torch.float32).to(torch.float64)  # what the physics gets
            target = task.apply_action(sim, applied, policy_action).to(torch.float32)
            self._push_userdata()
            self._data = self._physics(self._data, to_jax(target), self._model_fields(), kick)
            sim.bind(self._data)
            terms = task.rewards(sim, before, applied)
            reward = torch.stack(list(terms.values())).sum(dim=0)
            terminated = task.terminated(sim).to(dev)
            task.advance(sim, self._gen)
            self._push_userdata()
            obs = task.observe(sim)
            self._steps += 1
            truncated = self._steps >= self.spec.max_episode_steps
            stable = ((sim.qpos.abs() < MAX_STATE).all(dim=1)
                      & (sim.qvel.abs() < MAX_STATE).all(dim=1))  # NaN compares False
            unstable = ~stable
            n_unstable = unstable.sum()
            self._num_unstable += n_unstable
            terminated, truncated, reward, obs = end_unstable(unstable, terminated, truncated,
                                                              reward, obs)
            done = terminated | truncated
            if dr is not None:
                obs = dr.observe(obs)
                dr.after_step(self._steps.masked_fill(done, 0))
            final_obs = self._out(obs)
            next_obs = final_obs
            # on CPU, skipping the reset when no world finished is free; on a GPU, asking
            # would synchronize, so the reset runs every step and `where` picks the rows
            if self._gpu or bool(done.any()):
                if dr is not None:
                    dr.on_reset(done)
                self._restart_worlds(done, self._reset_fields(done))
                self._steps.masked_fill_(done, 0)
                reset_obs = task.observe(sim)
                if dr is not None:
                    reset_obs = dr.observe(reset_obs)
                next_obs = torch.where(done[:, None], self._out(reset_obs), final_obs)
        info: dict[str, Any] = {
            "final_obs": {"policy": final_obs},
            "reward_terms": {k: self._out(v) for k, v in terms.items()},
            "unstable": n_unstable,
        }
        return StepOut({"policy": next_obs}, self._out(reward), terminated, truncated, info)

    @property
    def num_unstable(self) -> int:
        """Worlds reset because the physics went unstable, since construction (synchronizes)."""
        return int(self._num_unstable)

    # ------------------------------------------------------------------ snapshots
    def get_state(self) -> torch.Tensor:
        """``mjSTATE_FULLPHYSICS`` of every world, [N, S] float64: the native backend's layout,
        so states move between the ``mujoco`` and ``mjx`` backends."""
        cols = [getattr(self.sim, name).reshape(self.num_envs, -1) for name, _ in self._state_layout]
        return torch.cat(cols, dim=1)

    def set_state(self, state: torch.Tensor, env_ids: torch.Tensor | None = None) -> None:
        """Restore worlds as a fresh reset would: solver warm start cleared, ``mjx.forward``."""
        n, size = self.num_envs, sum(s for _, s in self._state_layout)
        ids = torch.arange(n, device=self.device) if env_ids is None else \
            torch.as_tensor(env_ids, device=self.device).long().reshape(-1)
        state = torch.as_tensor(state).detach().to(self.device, torch.float64)
        if tuple(state.shape) != (len(ids), size):
            raise ValueError(f"state has shape {tuple(state.shape)}, expected {(len(ids), size)} "
                             "= (len(env_ids), mj_stateSize(mjSTATE_FULLPHYSICS))")
        ids_cpu = ids.cpu()
        if len(ids_cpu) and (int(ids_cpu.min()) < 0 or int(ids_cpu.max()) >= n):
            raise ValueError(f"env_ids must be in [0, {n}), got {ids_cpu.tolist()}")
        if len(ids_cpu.unique()) != len(ids_cpu):
            raise ValueError("env_ids must be unique")
        current = self.get_state()
        current[ids] = state
        mask = torch.zeros(n, dtype=torch.bool, device=self.device)
        mask[ids] = True
        fields, col = {}, 0
        for name, s in self._state_layout:
            fields[name] = current[:, col:col + s].reshape(getattr(self.sim, name).shape)
            col += s
        self._restart_worlds(mask, fields)
        steps = torch.round(current[:, 0] / self.task.dt).long()
        self._steps = torch.where(mask, steps, self._steps)

    _CKPT_FIELDS = ("time", "qpos", "qvel", "act", "ctrl", "qacc_warmstart")

    @property
    def _ckpt_fields(self) -> tuple[str, ...]:
        return self._CKPT_FIELDS + (("userdata",) if self.task.num_userdata else ())

    def state_dict(self) -> dict[str, Any]:
        """Integration state (warm start and controls included), step counters, reset RNG.

        Loading it recomputes derived fields with ``mjx.forward``, so worlds continue exactly
        for tasks whose rewards read state, not derived fields of the last substep (as natively).
        """
        # clone: on CPU .cpu() returns the live tensor, which later steps update in place
        out: dict[str, Any] = {k: getattr(self.sim, k).cpu().clone() for k in self._ckpt_fields}
        out["cfrc_ext"] = self.sim.cfrc_ext.cpu().clone() if self.task.needs_cfrc_ext else None
        out.update(steps=self._steps.cpu().clone(), generator=self._gen.get_state(),
                   num_unstable=self.num_unstable,
                   randomization=None if self._dr is None else self._dr.state_dict())
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if tuple(state["qpos"].shape) != tuple(self.sim.qpos.shape):
            raise ValueError(f"checkpointed qpos has shape {tuple(state['qpos'].shape)}, this env "
                             f"needs {tuple(self.sim.qpos.shape)}: different task or num_envs?")
        self._load_randomization(state.get("randomization"))  # first: restarts use the model
        mask = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        self._restart_worlds(mask, {k: state[k].to(self.device) for k in self._ckpt_fields})
        if state.get("cfrc_ext") is not None:
            cfrc = to_jax(state["cfrc_ext"].to(self.device, torch.float32))
            impl = self._data._impl.replace(cfrc_ext=cfrc)
            self._data = self._data.replace(_impl=impl)
            self.sim.bind(self._data)
        self._steps.copy_(state["steps"])
        self._gen.set_state(state["generator"])
        self._num_unstable.fill_(int(state["num_unstable"]))
