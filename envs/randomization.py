"""Domain randomization: typed parameter ranges and their per-world application on a ``Batch``.

    env = make("hopper", 256, randomization="locomotion")   # a preset in configs/randomization/
    env.physics_params()["body_mass"]                        # [N, nbody] the sampled masses
    env.set_randomization(cfg)                               # new ranges (curriculum)

Physical parameters are per-simulation model fields of ``mujoco.batch.Batch`` (``expand``),
sampled independently per world at that world's reset (and every ``resample_interval`` steps),
after which ``Batch.set_const`` recomputes the constants MuJoCo derives from them (e.g. the
subtree masses and ``dof_invweight0`` after a mass or armature change). Observation and action
noise, action delay and pushes act on the tensors around the physics step. Everything is drawn
from one explicit ``torch.Generator`` seeded from the env seed (Tobin et al. 2017; Peng et al.
2018 for dynamics randomization with latency).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
import torch

DISTRIBUTIONS: tuple[str, ...] = ("uniform", "loguniform")
"""How a ``Range`` draws its samples."""
MODES: tuple[str, ...] = ("scale", "additive")
"""How a sample combines with the nominal value: ``nominal * x`` or ``nominal + x``."""


@dataclasses.dataclass
class Range:
    """A sampling range of one parameter."""

    low: float
    """Lower end (a factor in ``scale`` mode, an offset in ``additive`` mode)."""
    high: float
    """Upper end; ``low == high`` gives a fixed perturbation."""
    distribution: str = "uniform"
    """One of DISTRIBUTIONS; ``loguniform`` needs ``low > 0``."""
    mode: str = "scale"
    """One of MODES."""
    shared: bool = False
    """One sample per world for all elements (bodies, geoms, ...) instead of one per element."""

    def check(self, name: str, min_scale: float | None) -> None:
        """Raise naming ``name`` if the range makes no sense; ``min_scale``: least scale factor."""
        where = f"randomization.{name}"
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"{where}.distribution: unknown {self.distribution!r}; "
                             f"allowed: {', '.join(DISTRIBUTIONS)}")
        if self.mode not in MODES:
            raise ValueError(f"{where}.mode: unknown {self.mode!r}; allowed: {', '.join(MODES)}")
        if not (np.isfinite(self.low) and np.isfinite(self.high)):
            raise ValueError(f"{where}: low and high must be finite, got [{self.low}, {self.high}]")
        if self.low > self.high:
            raise ValueError(f"{where}: low {self.low} > high {self.high}")
        if self.distribution == "loguniform" and self.low <= 0:
            raise ValueError(f"{where}: loguniform needs low > 0, got {self.low}")
        if self.mode == "scale" and min_scale is not None and self.low < min_scale:
            raise ValueError(f"{where}: scale factors must be >= {min_scale} (a physical "
                             f"{name.replace('_', ' ')} cannot be negative), got low={self.low}")

    def sample(self, n: int, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
        """[n, *shape] float64 samples (broadcast over ``shape`` when ``shared``)."""
        draw = (n,) + ((1,) * len(shape) if self.shared else shape)
        u = torch.rand(draw, generator=gen, dtype=torch.float64)
        if self.low == self.high:
            x = torch.full_like(u, self.low)
        elif self.distribution == "loguniform":
            lo, hi = np.log(self.low), np.log(self.high)
            x = torch.exp(lo + u * (hi - lo))
        else:
            x = self.low + u * (self.high - self.low)
        return x.expand((n,) + shape)


@dataclasses.dataclass
class RandomizationConfig:
    """Ranges of every randomized quantity; ``None``/0 leaves it nominal."""

    body_mass: Range | None = None
    """Body masses; the inertia of a body is scaled by the same factor (uniform density)."""
    friction: Range | None = None
    """Sliding friction coefficient of every geom (``geom_friction[:, 0]``)."""
    joint_damping: Range | None = None
    """Damping of every degree of freedom (``dof_damping``)."""
    armature: Range | None = None
    """Rotor inertia of every degree of freedom (``dof_armature``)."""
    actuator_gain: Range | None = None
    """Actuator strength: ``gear`` of motors, ``kp`` (gainprm[0], -biasprm[1]) of servos."""
    gravity: Range | None = None
    """Each component of ``opt.gravity`` (scale mode leaves zero components at zero)."""
    com_offset: Range | None = None
    """Offset (m) of every body's center of mass (``body_ipos``); use mode ``additive``."""
    obs_noise: float | list[float] = 0.0
    """Std of Gaussian noise on the policy observation: one value or one per dimension."""
    action_noise: float = 0.0
    """Std of Gaussian noise added to the applied action, in action units."""
    action_delay_min: int = 0
    """Least action delay in control steps."""
    action_delay_max: int = 0
    """Most action delay in control steps; each episode draws one uniformly from min..max."""
    push_velocity: float = 0.0
    """Largest velocity kick (m/s) on each translational root dof, uniform in [-v, v]."""
    push_interval: tuple[int, int] = (200, 400)
    """Control steps between pushes, drawn uniformly from this inclusive range."""
    resample_interval: int = 0
    """0: physical parameters drawn per episode only; K: also every K steps of an episode."""

    def model_ranges(self) -> dict[str, Range]:
        """The physical-parameter ranges that are set, by name."""
        return {k: getattr(self, k) for k in _MODEL_PARAMS if getattr(self, k) is not None}

    def enabled(self) -> bool:
        """Whether anything is randomized."""
        noise = np.any(np.asarray(self.obs_noise) != 0)
        return bool(self.model_ranges() or noise or self.action_noise or self.action_delay_max
                    or self.push_velocity)

    def check(self, obs_dim: int | None = None) -> None:
        """Raise naming the parameter and the allowed values on a bad setting."""
        for name, rng in self.model_ranges().items():
            rng.check(name, _MODEL_PARAMS[name][1])
        noise = np.asarray(self.obs_noise, dtype=np.float64)
        if (noise < 0).any() or not np.isfinite(noise).all():
            raise ValueError(f"randomization.obs_noise must be finite and >= 0, got {noise}")
        if obs_dim is not None and noise.ndim == 1 and len(noise) != obs_dim:
            raise ValueError(f"randomization.obs_noise has {len(noise)} entries; give one value "
                             f"or one per observation dimension ({obs_dim})")
        for key in ("action_noise", "push_velocity"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"randomization.{key} must be >= 0, got {getattr(self, key)}")
        if not 0 <= self.action_delay_min <= self.action_delay_max:
            raise ValueError("randomization: need 0 <= action_delay_min <= action_delay_max, got "
                             f"{self.action_delay_min}, {self.action_delay_max}")
        lo, hi = self.push_interval
        if not 1 <= lo <= hi:
            raise ValueError(f"randomization.push_interval must satisfy 1 <= low <= high, got "
                             f"{self.push_interval}")
        if self.resample_interval < 0:
            raise ValueError(f"randomization.resample_interval must be >= 0 (0: per episode "
                             f"only), got {self.resample_interval}")


# name -> (model field, least scale factor or None when any sign is physical)
_MODEL_PARAMS: dict[str, tuple[str, float | None]] = {
    "body_mass": ("body_mass", 1e-6),
    "friction": ("geom_friction", 0.0),
    "joint_damping": ("dof_damping", 0.0),
    "armature": ("dof_armature", 0.0),
    "actuator_gain": ("actuator_gear", 0.0),
    "gravity": ("opt.gravity", None),
    "com_offset": ("body_ipos", None),
}
_NONNEGATIVE = ("body_mass", "friction", "joint_damping", "armature", "actuator_gain")


def preset_names() -> list[str]:
    """Names of the presets in ``configs/randomization/``."""
    return sorted(p.stem for p in _preset_dir().glob("*.yaml"))


def _preset_dir() -> Path:
    import robotrl.configs

    return Path(robotrl.configs.__file__).parent / "randomization"


def resolve(spec: str | dict[str, Any] | RandomizationConfig | None) -> RandomizationConfig:
    """A config from a preset name, a mapping of fields, a config, or None (nothing)."""
    from robotrl.config import from_dict

    if spec is None:
        return RandomizationConfig()
    if isinstance(spec, RandomizationConfig):
        return spec
    if isinstance(spec, str):
        names = preset_names()
        if spec not in names:
            raise ValueError(f"unknown randomization preset {spec!r}; available: {names}")
        import yaml

        spec = yaml.safe_load((_preset_dir() / f"{spec}.yaml").read_text()) or {}
        spec.pop("name", None)
    if not isinstance(spec, dict):
        raise TypeError(f"randomization must be a preset name, a mapping or a "
                        f"RandomizationConfig, got {type(spec).__name__}")
    cfg = from_dict(RandomizationConfig, spec, "randomization")
    cfg.check()
    return cfg


class DomainRandomizer:
    """Applies a ``RandomizationConfig`` to the worlds of a ``Batch``; see the module docstring."""

    def __init__(self, cfg: RandomizationConfig, batch: Any, model: mujoco.MjModel,
                 obs_dim: int, seed: int) -> None:
        self.batch, self.model, self.n = batch, model, batch.nsim
        self.obs_dim, self.nu = obs_dim, model.nu
        self.gen = torch.Generator().manual_seed(seed)
        self._values: dict[str, torch.Tensor] = {}  # param -> live [N, ...] view of the field
        self._nominal: dict[str, torch.Tensor] = {}
        self._ids = torch.arange(self.n)
        # motors get their gear scaled; servos (affine bias) their kp, keeping ctrl a position
        self._servo = torch.as_tensor(model.actuator_biastype != 0)
        self._inertia0 = torch.as_tensor(model.body_inertia.copy())
        self._qvel = torch.from_numpy(batch.bind("qvel"))
        # the translational dofs of the root body's joints receive the pushes
        root = [model.jnt_dofadr[j] + k for j in range(model.njnt) if model.jnt_bodyid[j] == 1
                for k in range({0: 3, 2: 1}.get(int(model.jnt_type[j]), 0))]
        self._root_dofs = torch.as_tensor(root, dtype=torch.long)
        self.set_config(cfg)

    def set_config(self, cfg: RandomizationConfig) -> None:
        """Use ``cfg`` from each world's next draw on; delay history and timers restart."""
        cfg.check(self.obs_dim)
        self.cfg = cfg
        for name, rng in cfg.model_ranges().items():
            self._field(name)
            if rng.mode == "additive" and name in _NONNEGATIVE:
                least = float(self._nominal[name].min()) + rng.low
                if least < 0:
                    raise ValueError(f"randomization.{name}: additive low {rng.low} makes a "
                                     f"nominal value negative ({least:.3g}); use low >= "
                                     f"{-float(self._nominal[name].min()):.3g} or mode=scale")
        noise = torch.as_tensor(cfg.obs_noise, dtype=torch.float64)
        self._obs_std = noise if bool((noise != 0).any()) else None
        kmax = cfg.action_delay_max
        self.delay = torch.full((self.n,), cfg.action_delay_min, dtype=torch.long)
        self._hist = torch.zeros(self.n, kmax + 1, self.nu, dtype=torch.float64) if kmax else None
        self._push_timer = torch.zeros(self.n, dtype=torch.long)

    # ------------------------------------------------------------------ model fields
    def _field(self, name: str) -> torch.Tensor:
        """Live [N, ...] tensor of the parameter's model values, expanding the field once."""
        if name not in self._values:
            field = _MODEL_PARAMS[name][0]
            raw = torch.from_numpy(self.batch.expand(field))
            view = raw[..., 0] if name == "friction" else raw
            if name == "actuator_gain":
                gear = raw[..., 0]
                gain = torch.from_numpy(self.batch.expand("actuator_gainprm"))[..., 0]
                view = torch.where(self._servo, gain, gear)
                self._gear, self._gain = gear, gain
                self._bias = torch.from_numpy(self.batch.expand("actuator_biasprm"))[..., 1]
            self._values[name] = view
            self._nominal[name] = view[0].clone()
        return self._values[name]

    def _write(self, name: str, ids: torch.Tensor, value: torch.Tensor) -> None:
        """Write parameter ``name`` of worlds ``ids`` ([K, ...] values) into the batch."""
        if name == "body_mass":
            self._values[name][ids] = value
            inertia = torch.from_numpy(self.batch.expand("body_inertia"))
            inertia[ids] = self._inertia0 * (value / self._nominal[name].clamp_min(1e-12))[..., None]
        elif name == "actuator_gain":
            self._gear[ids] = torch.where(self._servo, self._gear[ids], value)
            self._gain[ids] = torch.where(self._servo, value, self._gain[ids])
            self._bias[ids] = torch.where(self._servo, -value, self._bias[ids])
            self._values[name] = torch.where(self._servo, self._gain, self._gear)
        else:
            self._values[name][ids] = value

    def resample(self, ids: torch.Tensor) -> None:
        """Draw new physical parameters for worlds ``ids`` ([K] long) and update MuJoCo's
        derived constants for them."""
        if not len(ids):
            return
        ranges = self.cfg.model_ranges()
        for name in list(self._values):
            nominal, rng = self._nominal[name], ranges.get(name)
            if rng is None:  # removed by set_config: back to nominal
                value = nominal.expand(len(ids), *nominal.shape)
            else:
                x = rng.sample(len(ids), tuple(nominal.shape), self.gen)
                value = nominal * x if rng.mode == "scale" else nominal + x
            self._write(name, ids, value)
        if self._values:
            self.batch.set_const(ids.numpy().astype(np.int32))

    # ------------------------------------------------------------------ episode hooks
    def on_reset(self, ids: torch.Tensor) -> None:
        """Worlds ``ids`` ([K] long) start an episode: new parameters, delay, push timer."""
        self.resample(ids)
        cfg = self.cfg
        if self._hist is not None:
            self._hist[ids] = 0.0  # the actuators are idle until the first delayed command
            self.delay[ids] = torch.randint(cfg.action_delay_min, cfg.action_delay_max + 1,
                                            (len(ids),), generator=self.gen)
        if cfg.push_velocity > 0:
            self._push_timer[ids] = self._interval(len(ids))

    def _interval(self, k: int) -> torch.Tensor:
        lo, hi = self.cfg.push_interval
        return torch.randint(lo, hi + 1, (k,), generator=self.gen)

    def action(self, action: torch.Tensor) -> torch.Tensor:
        """The action [N, nu] float64 that reaches the actuators: delayed, then noised."""
        if self._hist is not None:
            self._hist[:, 1:] = self._hist[:, :-1].clone()
            self._hist[:, 0] = action
            action = self._hist[self._ids, self.delay]
        if self.cfg.action_noise > 0:
            noise = torch.randn(action.shape, generator=self.gen, dtype=torch.float64)
            action = action + self.cfg.action_noise * noise
        return action

    def before_physics(self) -> None:
        """Kick the root of worlds whose push timer ran out."""
        if self.cfg.push_velocity <= 0 or not len(self._root_dofs):
            return
        self._push_timer -= 1
        due = (self._push_timer <= 0).nonzero().flatten()
        if len(due):
            v = self.cfg.push_velocity
            kick = (torch.rand(len(due), len(self._root_dofs), generator=self.gen,
                               dtype=torch.float64) * 2 - 1) * v
            self._qvel[due[:, None], self._root_dofs] += kick
            self._push_timer[due] = self._interval(len(due))

    def after_step(self, steps: torch.Tensor) -> None:
        """Periodic resampling: worlds whose episode step count ``steps`` [N] hit a multiple."""
        k = self.cfg.resample_interval
        if k > 0 and self._values:
            self.resample(((steps % k == 0) & (steps > 0)).nonzero().flatten())

    def observe(self, obs: torch.Tensor) -> torch.Tensor:
        """``obs`` [K, obs_dim] float64 with Gaussian noise added."""
        if self._obs_std is None:
            return obs
        noise = torch.randn(obs.shape, generator=self.gen, dtype=torch.float64)
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
            "values": {k: v.clone() for k, v in self._values.items()},
            "delay": self.delay.clone(),
            "history": None if self._hist is None else self._hist.clone(),
            "push_timer": self._push_timer.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.set_config(resolve(state["config"]))
        self.gen.set_state(state["generator"])
        for name, value in state["values"].items():
            self._field(name)
            self._write(name, self._ids, value)
        if self._values:
            self.batch.set_const()
        self.delay.copy_(state["delay"])
        if self._hist is not None:
            self._hist.copy_(state["history"])
        self._push_timer.copy_(state["push_timer"])
