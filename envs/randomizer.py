"""Domain randomization applied: per-world values, drawn by mask, put into each backend's physics.

``DomainRandomizer`` keeps every randomized parameter's value per world (``[N, ...]`` float64 on
the env's device), draws new ones for the worlds in a boolean mask at their reset (and every
``resample_interval`` steps), and does the observation/action noise, action delay and push
arithmetic around the physics step; everything comes from one explicit ``torch.Generator``
seeded from the env seed's ``randomization`` stream (``robotrl.seeding``). The backends say how values reach their physics:
``BatchRandomizer`` (native) writes them into the per-simulation model fields of
``mujoco.batch.Batch`` and calls ``Batch.set_const``; ``MjxRandomizer``
(``envs/mjx_randomization.py``) hands them to the jitted MJX/Brax step as a vmapped model.
``RandomizedEnv`` is the env-side API (``set_randomization``, ``physics_params``, checkpoints).
The ranges themselves are ``RandomizationConfig`` (``envs/randomization.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import mujoco
import numpy as np
import torch

from robotrl.config import (
    MODEL_PARAMS,
    NONNEGATIVE_PARAMS,
    RandomizationConfig,
    Range,
    resolve_randomization,
)
from robotrl.seeding import derive_seed


class DomainRandomizer:
    """Applies a ``RandomizationConfig`` to ``num_envs`` worlds; see the module docstring.

    The backend-independent part: it keeps each randomized parameter's current value per world
    (``[N, ...]`` float64 on ``device``), draws new ones for the worlds in a mask, and does the
    noise, delay and push arithmetic. Subclasses put the values into their physics (``_apply``).
    Worlds are selected by boolean masks: on the CPU only the selected rows are drawn; on a GPU
    every row is drawn and ``where`` keeps the selected ones (asking which rows are selected
    would wait for the device every step).
    """

    def __init__(self, cfg: RandomizationConfig, model: mujoco.MjModel, obs_dim: int,
                 num_envs: int, seed: int, device: str | torch.device = "cpu",
                 obs_scale: torch.Tensor | None = None) -> None:
        self.model, self.n = model, num_envs
        self._obs_scale = obs_scale
        """[obs_dim] the task's per-dimension noise std that ``obs_noise`` multiplies (None:
        ``obs_noise`` is the std itself)."""
        self.device = torch.device(device)
        self.obs_dim, self.nu = obs_dim, model.nu
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.dense = self.device.type != "cpu"
        """Draw every row and keep the selected ones with ``where`` (no host sync), instead of
        drawing the selected rows only."""
        self._values: dict[str, torch.Tensor] = {}  # param -> [N, ...] current value per world
        self._nominal: dict[str, torch.Tensor] = {}
        self._ids = torch.arange(self.n, device=self.device)
        # motors get their gear scaled; servos (affine bias) their kp, keeping ctrl a position
        self._servo = torch.as_tensor(model.actuator_biastype != 0, device=self.device)
        # nominal model fields that a parameter changes only part of (see model_field_values)
        f64 = {"dtype": torch.float64, "device": self.device}
        self._inertia0 = torch.tensor(model.body_inertia, **f64)
        self._friction0 = torch.tensor(model.geom_friction, **f64)
        self._gear0 = torch.tensor(model.actuator_gear, **f64)
        self._gain0 = torch.tensor(model.actuator_gainprm, **f64)
        self._bias0 = torch.tensor(model.actuator_biasprm, **f64)
        # the translational dofs of the root body's joints receive the pushes
        root = [model.jnt_dofadr[j] + k for j in range(model.njnt) if model.jnt_bodyid[j] == 1
                for k in range({0: 3, 2: 1}.get(int(model.jnt_type[j]), 0))]
        self._root_dofs = torch.as_tensor(root, dtype=torch.long, device=self.device)
        # mj_setConst refuses to move the inertial frame of a body compiled as simple
        self._fixed_com = torch.as_tensor(model.body_simple != 0, device=self.device)[:, None]
        self.set_config(cfg)

    def _apply(self, mask: torch.Tensor) -> None:
        """Make the physics of worlds ``mask`` [N] bool use their current ``_values``."""
        raise NotImplementedError

    def set_config(self, cfg: RandomizationConfig) -> None:
        """Use ``cfg`` from each world's next draw on; delay history and timers restart."""
        cfg.check(self.obs_dim)
        self.cfg = cfg
        for name, rng in cfg.model_ranges().items():
            self._field(name)
            if rng.mode == "additive" and name in NONNEGATIVE_PARAMS:
                least = float(self._nominal[name].min()) + rng.low
                if least < 0:
                    raise ValueError(f"randomization.{name}: additive low {rng.low} makes a "
                                     f"nominal value negative ({least:.3g}); use low >= "
                                     f"{-float(self._nominal[name].min()):.3g} or mode=scale")
        noise = torch.as_tensor(cfg.obs_noise, dtype=torch.float64)
        if self._obs_scale is not None:
            noise = noise * self._obs_scale.to(torch.float64)
        self._obs_std = noise.to(self.device) if bool((noise != 0).any()) else None
        kmax, dev = cfg.action_delay_max, self.device
        self.delay = torch.full((self.n,), cfg.action_delay_min, dtype=torch.long, device=dev)
        self._hist = (torch.zeros(self.n, kmax + 1, self.nu, dtype=torch.float64, device=dev)
                      if kmax else None)
        self._push_timer = torch.zeros(self.n, dtype=torch.long, device=dev)

    # ------------------------------------------------------------------ model fields
    def _field(self, name: str) -> torch.Tensor:
        """[N, ...] values of a parameter, nominal in every world until its first draw."""
        if name not in self._values:
            m = self.model
            nominal = {
                "body_mass": lambda: m.body_mass,
                "friction": lambda: m.geom_friction[:, 0],
                "joint_damping": lambda: m.dof_damping,
                "armature": lambda: m.dof_armature,
                "actuator_gain": lambda: np.where(m.actuator_biastype != 0,
                                                  m.actuator_gainprm[:, 0], m.actuator_gear[:, 0]),
                "gravity": lambda: m.opt.gravity,
                "com_offset": lambda: m.body_ipos,
            }[name]()
            value = torch.tensor(np.array(nominal, dtype=np.float64), device=self.device)
            self._nominal[name] = value
            self._values[name] = value.expand(self.n, *value.shape).clone()
        return self._values[name]

    def model_field_values(self, rows: torch.Tensor | slice = slice(None)
                           ) -> dict[str, torch.Tensor]:
        """The MuJoCo model fields the current values set, for the worlds ``rows``:
        ``{field: [K, ...] float64}`` with mjModel names (``opt.gravity`` for gravity). A mass
        scales its body's inertia too (uniform density); a motor's strength is its gear, a
        servo's its kp (``gainprm[0] = -biasprm[1]``); the other columns stay nominal."""
        out: dict[str, torch.Tensor] = {}
        for name, values in self._values.items():
            value = values[rows]
            k = len(value)
            if name == "body_mass":
                out["body_mass"] = value
                ratio = value / self._nominal[name].clamp_min(1e-12)
                out["body_inertia"] = self._inertia0 * ratio[..., None]
            elif name == "friction":
                friction = self._friction0.expand(k, -1, -1).clone()
                friction[..., 0] = value
                out["geom_friction"] = friction
            elif name == "actuator_gain":
                gear, gain, bias = (x.expand(k, -1, -1).clone()
                                    for x in (self._gear0, self._gain0, self._bias0))
                servo = self._servo
                gear[..., 0] = torch.where(servo, gear[..., 0], value)
                gain[..., 0] = torch.where(servo, value, gain[..., 0])
                bias[..., 1] = torch.where(servo, -value, bias[..., 1])
                out.update(actuator_gear=gear, actuator_gainprm=gain, actuator_biasprm=bias)
            else:
                out[MODEL_PARAMS[name][0]] = value
        return out

    def _redraw(self, current: torch.Tensor, mask: torch.Tensor,
                draw: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """``current`` [N, ...] with the rows in ``mask`` replaced by ``draw(k)`` ([k, ...]):
        in place on the CPU (k = selected rows), a new tensor on a GPU (k = N, ``where``)."""
        if not self.dense:
            ids = mask.nonzero().flatten()
            if len(ids):
                current[ids] = draw(len(ids))
            return current
        keep = mask.reshape(-1, *(1,) * (current.dim() - 1))
        return torch.where(keep, draw(self.n), current)

    def resample(self, mask: torch.Tensor) -> None:
        """Draw new physical parameters for the worlds in ``mask`` ([N] bool) and apply them."""
        if not self._values:
            return
        ranges = self.cfg.model_ranges()
        for name in list(self._values):
            nominal, rng = self._nominal[name], ranges.get(name)

            def draw(k: int, nominal: torch.Tensor = nominal, rng: Range | None = rng,
                     com: bool = name == "com_offset") -> torch.Tensor:
                if rng is None:  # removed by set_config: back to nominal
                    return nominal.expand(k, *nominal.shape)
                x = rng.sample(k, tuple(nominal.shape), self.gen)
                value = nominal * x if rng.mode == "scale" else nominal + x
                return torch.where(self._fixed_com, nominal, value) if com else value

            self._values[name] = self._redraw(self._values[name], mask, draw)
        self._apply(mask)

    # ------------------------------------------------------------------ episode hooks
    def on_reset(self, mask: torch.Tensor) -> None:
        """Worlds in ``mask`` ([N] bool) start an episode: new parameters, delay, push timer."""
        self.resample(mask)
        cfg = self.cfg
        if self._hist is not None:
            self._hist.masked_fill_(mask[:, None, None], 0.0)  # actuators idle until the first
            self.delay = self._redraw(self.delay, mask, lambda k: torch.randint(  # command
                cfg.action_delay_min, cfg.action_delay_max + 1, (k,), generator=self.gen,
                device=self.device))
        if cfg.push_velocity > 0:
            self._push_timer = self._redraw(self._push_timer, mask, self._interval)

    def _interval(self, k: int) -> torch.Tensor:
        lo, hi = self.cfg.push_interval
        return torch.randint(lo, hi + 1, (k,), generator=self.gen, device=self.device)

    def action(self, action: torch.Tensor) -> torch.Tensor:
        """The action [N, nu] float64 that reaches the actuators: delayed, then noised."""
        if self._hist is not None:
            self._hist[:, 1:] = self._hist[:, :-1].clone()
            self._hist[:, 0] = action
            action = self._hist[self._ids, self.delay]
        if self.cfg.action_noise > 0:
            noise = torch.randn(action.shape, generator=self.gen, dtype=torch.float64,
                                device=self.device)
            action = action + self.cfg.action_noise * noise
        return action

    def push(self) -> torch.Tensor | None:
        """Velocity kicks [N, len(root dofs)] for worlds whose push timer ran out (zero rows
        elsewhere); None when pushes are off (or, on the CPU, when no world is due)."""
        if self.cfg.push_velocity <= 0 or not len(self._root_dofs):
            return None
        self._push_timer -= 1
        due = self._push_timer <= 0
        if not self.dense and not bool(due.any()):  # on the CPU asking is free
            return None
        v, nroot = self.cfg.push_velocity, len(self._root_dofs)
        kick = torch.zeros(self.n, nroot, dtype=torch.float64, device=self.device)
        kick = self._redraw(kick, due, lambda k: (torch.rand(
            k, nroot, generator=self.gen, dtype=torch.float64, device=self.device) * 2 - 1) * v)
        self._push_timer = self._redraw(self._push_timer, due, self._interval)
        return kick

    def after_step(self, steps: torch.Tensor) -> None:
        """Periodic resampling: worlds whose episode step count ``steps`` [N] hit a multiple."""
        k = self.cfg.resample_interval
        if k > 0 and self._values:
            self.resample((steps % k == 0) & (steps > 0))

    def observe(self, obs: torch.Tensor) -> torch.Tensor:
        """``obs`` [K, obs_dim] float64 with Gaussian noise added."""
        if self._obs_std is None:
            return obs
        noise = torch.randn(obs.shape, generator=self.gen, dtype=torch.float64,
                            device=self.device)
        return obs + noise * self._obs_std

    # ------------------------------------------------------------------ reading, checkpoints
    def physics_params(self) -> dict[str, torch.Tensor]:
        """Current value of every randomized quantity per world: model values [N, ...]
        (``body_mass`` [N, nbody], ``friction`` [N, ngeom], ``gravity`` [N, 3], ``com_offset``
        as ``body_ipos`` [N, nbody, 3], ...) and ``action_delay`` [N]."""
        out = {k: v.clone() for k, v in self._values.items() if k in self.cfg.model_ranges()}
        if self._hist is not None:
            out["action_delay"] = self.delay.clone()
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "config": dataclasses.asdict(self.cfg),
            "generator": self.gen.get_state(),
            "values": {k: v.cpu().clone() for k, v in self._values.items()},
            "delay": self.delay.cpu().clone(),
            "history": None if self._hist is None else self._hist.cpu().clone(),
            "push_timer": self._push_timer.cpu().clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.set_config(resolve_randomization(state["config"]))
        self.gen.set_state(state["generator"])
        dev = self.device
        for name, value in state["values"].items():
            self._field(name).copy_(value.to(dev))
        if self._values:
            self._apply(torch.ones(self.n, dtype=torch.bool, device=dev))
        self.delay.copy_(state["delay"].to(dev))
        if self._hist is not None:
            self._hist.copy_(state["history"].to(dev))
        self._push_timer.copy_(state["push_timer"].to(dev))


def randomization_seed(env_seed: int) -> int:
    """Seed of the randomization generator: the env seed's ``randomization`` stream, so turning
    randomization on leaves the reset distribution's draws unchanged."""
    return derive_seed(env_seed, "randomization")


class RandomizedEnv:
    """The randomization API of an env holding a ``DomainRandomizer`` in ``_dr`` (None: nominal
    physics, no extra work); the env says how to make one (``_make_randomizer``)."""

    _dr: DomainRandomizer | None
    num_envs: int

    def _make_randomizer(self, cfg: RandomizationConfig) -> DomainRandomizer:
        raise NotImplementedError

    def set_randomization(
        self, cfg: str | dict[str, Any] | RandomizationConfig | None, resample: bool = False
    ) -> None:
        """Use new randomization ranges (a curriculum step); they apply from each world's next
        reset, or to every world at once with ``resample=True``."""
        cfg = resolve_randomization(cfg)
        if self._dr is None:
            if not cfg.enabled():
                return
            self._dr = self._make_randomizer(cfg)
        else:
            self._dr.set_config(cfg)
        if resample:
            self._dr.on_reset(self._all_worlds())

    def _all_worlds(self) -> torch.Tensor:
        dev = self._dr.device if self._dr is not None else "cpu"
        return torch.ones(self.num_envs, dtype=torch.bool, device=dev)

    @property
    def randomization(self) -> RandomizationConfig:
        """The current randomization ranges (all nominal when none)."""
        return RandomizationConfig() if self._dr is None else self._dr.cfg

    def physics_params(self) -> dict[str, torch.Tensor]:
        """Sampled physics of every world: ``{name: [N, ...]}`` (empty without randomization);
        see ``DomainRandomizer.physics_params``."""
        return {} if self._dr is None else self._dr.physics_params()

    def _load_randomization(self, state: dict[str, Any] | None) -> None:
        """Restore the randomizer from a checkpoint's entry (None: saved without one)."""
        if state is not None and self._dr is None and not resolve_randomization(state["config"]).enabled():
            state = None  # saved all nominal (a curriculum at zero): nothing to restore
        if state is not None:
            if self._dr is None:
                self.set_randomization(state["config"])
            assert self._dr is not None
            self._dr.load_state_dict(state)
        elif self._dr is not None:  # saved without randomization: back to the nominal model
            self._dr.set_config(RandomizationConfig())
            self._dr.resample(self._all_worlds())


class BatchRandomizer(DomainRandomizer):
    """Randomization of the native backend: values written into the per-world model fields of a
    ``mujoco.batch.Batch`` (``expand``), then ``Batch.set_const`` for those worlds."""

    def __init__(self, cfg: RandomizationConfig, batch: Any, model: mujoco.MjModel,
                 obs_dim: int, seed: int, obs_scale: torch.Tensor | None = None) -> None:
        self.batch = batch
        self._expanded: dict[str, torch.Tensor] = {}
        self._qvel = torch.from_numpy(batch.bind("qvel"))
        super().__init__(cfg, model, obs_dim, batch.nsim, seed, obs_scale=obs_scale)

    def _batch_field(self, field: str) -> torch.Tensor:
        if field not in self._expanded:
            self._expanded[field] = torch.from_numpy(self.batch.expand(field))
        return self._expanded[field]

    def _apply(self, mask: torch.Tensor) -> None:
        ids = mask.nonzero().flatten()
        if not len(ids):
            return
        for field, value in self.model_field_values(ids).items():
            self._batch_field(field)[ids] = value
        self.batch.set_const(ids.numpy().astype(np.int32))

    def before_physics(self) -> None:
        """Kick the root of worlds whose push timer ran out."""
        kick = self.push()
        if kick is not None:
            self._qvel[:, self._root_dofs] += kick
