"""Domain randomization ranges: what may vary per world, how it is drawn, and the presets.

    env = make("hopper", 256, randomization="locomotion")   # a preset in configs/randomization/
    env.physics_params()["body_mass"]                        # [N, nbody] the sampled masses
    env.set_randomization(cfg)                               # new ranges (curriculum)

Physical parameters (masses, friction, damping, armature, actuator gains, gravity, COM) are
drawn independently per world at that world's reset (and every ``resample_interval`` steps);
observation and action noise, action delay and pushes act on the tensors around the physics
step (Tobin et al. 2017; Peng et al. 2018 for dynamics randomization with latency). How the
draws reach each backend's physics: ``envs/randomizer.py``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

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
        u = torch.rand(draw, generator=gen, dtype=torch.float64, device=gen.device)
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
    """Offset (m) of every body's center of mass (``body_ipos``); use mode ``additive``. Bodies
    MuJoCo compiled as ``simple`` (e.g. Reacher's target) keep theirs: their inertial frame must
    stay their body frame."""
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
