"""Typed run configuration: the source of truth for every key ``robotrl train`` accepts.

Hydra YAML in ``configs/`` only selects and overrides these dataclasses; ``from_dict`` turns the
composed mapping into them, failing on unknown keys (naming the allowed ones) and wrong types.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Union

import numpy as np
import torch

from robotrl.registry import (
    ALGORITHMS,
    POLICIES,
    MLPPolicyConfig,
    algo_config_class,
    algorithm,
    policy_config_class,
    policy_name,
    resolve,
)

# Domain randomization -----------------------------------------------------------------------------
# Domain randomization ranges: what may vary per world, how it is drawn, and the presets.
#
#     env = make("hopper", 256, randomization="locomotion")   # a preset in configs/randomization/
#     env.physics_params()["body_mass"]                        # [N, nbody] the sampled masses
#     env.set_randomization(cfg)                               # new ranges (curriculum)
#
# Physical parameters (masses, friction, damping, armature, actuator gains, gravity, COM) are
# drawn independently per world at that world's reset (and every ``resample_interval`` steps);
# observation and action noise, action delay and pushes act on the tensors around the physics
# step (Tobin et al. 2017; Peng et al. 2018 for dynamics randomization with latency). How the
# draws reach each backend's physics: ``envs/randomizer.py``.

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
        return {k: getattr(self, k) for k in MODEL_PARAMS if getattr(self, k) is not None}

    def enabled(self) -> bool:
        """Whether anything is randomized."""
        noise = np.any(np.asarray(self.obs_noise) != 0)
        return bool(self.model_ranges() or noise or self.action_noise or self.action_delay_max
                    or self.push_velocity)

    def check(self, obs_dim: int | None = None) -> None:
        """Raise naming the parameter and the allowed values on a bad setting."""
        for name, rng in self.model_ranges().items():
            rng.check(name, MODEL_PARAMS[name][1])
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
MODEL_PARAMS: dict[str, tuple[str, float | None]] = {
    "body_mass": ("body_mass", 1e-6),
    "friction": ("geom_friction", 0.0),
    "joint_damping": ("dof_damping", 0.0),
    "armature": ("dof_armature", 0.0),
    "actuator_gain": ("actuator_gear", 0.0),
    "gravity": ("opt.gravity", None),
    "com_offset": ("body_ipos", None),
}
NONNEGATIVE_PARAMS = ("body_mass", "friction", "joint_damping", "armature", "actuator_gain")


def randomization_presets() -> list[str]:
    """Names of the presets in ``configs/randomization/``."""
    return sorted(p.stem for p in _preset_dir().glob("*.yaml"))


def _preset_dir() -> Path:
    import robotrl.configs

    return Path(robotrl.configs.__file__).parent / "randomization"


def resolve_randomization(spec: str | dict[str, Any] | RandomizationConfig | None) -> RandomizationConfig:
    """A config from a preset name, a mapping of fields, a config, or None (nothing)."""
    if spec is None:
        return RandomizationConfig()
    if isinstance(spec, RandomizationConfig):
        return spec
    if isinstance(spec, str):
        names = randomization_presets()
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


@dataclasses.dataclass
class EnvConfig:
    """Which task to simulate and how."""

    task: str = "halfcheetah"
    """Task name (``robotrl.envs.list_tasks()``) or, on the gymnasium backend, a Gymnasium id."""
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Task config overrides, e.g. ``{ctrl_cost_weight: 0.2, max_episode_steps: 500}``."""
    train_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Task config overrides for the training worlds alone, over ``options``; evaluation (and
    ``robotrl eval``, export and gap) keeps ``options``. E.g. ``{max_episode_steps: 200}``:
    shorter training episodes (truncated, so bootstrapped) scored on the task's full length.
    They must leave the observation and action sizes as they are."""


@dataclasses.dataclass
class BackendConfig:
    """Simulator backend."""

    name: str = "mujoco"
    """A key of ``robotrl.envs.registry.BACKEND_TABLE`` (mujoco, gymnasium, mjx, brax)."""
    num_threads: int = 0
    """Simulation threads for the native backend (0: all cores)."""


@dataclasses.dataclass
class LoggerConfig:
    """Logging and progress display."""

    tensorboard: bool = True
    """Write TensorBoard event files to ``run_dir``."""
    progress: bool = True
    """Show a rich progress bar (steps, steps/s, ETA, latest mean return)."""
    log_interval: int = 1
    """Log metrics every this many iterations."""
    video: bool = False
    """Film world 0's first episode at each evaluation from the task's view camera:
    ``run_dir/videos/step_*.mp4`` and TensorBoard's ``eval/video`` (needs the ``video`` extra
    and ``MUJOCO_GL=egl``; ~25 s per 1000-step episode at 240x240 on this CPU)."""
    wandb: bool = False
    """Also log to Weights & Biases (``logger=wandb``; the ``wandb`` extra): the same scalars
    at the same steps, the resolved config, evaluation videos; W&B's files in
    ``run_dir/wandb/``, its run id in ``run_dir/wandb_id.json`` (a resume continues that run).
    Online, offline or disabled as ``WANDB_MODE`` says."""
    wandb_project: str = "robotrl"
    """W&B project."""
    wandb_entity: str = ""
    """W&B team or user ('': the account's default entity)."""
    wandb_group: str = ""
    """W&B group ('': the jobs of a multirun share one, the sweep directory's name; the seeds
    of a ``num_seeds`` run share ``run_dir``'s name; a single run has none)."""
    wandb_tags: list[str] = dataclasses.field(default_factory=list)
    """W&B tags, e.g. ``'logger.wandb_tags=[ppo,baseline]'``."""
    wandb_artifacts: bool = False
    """Upload ``checkpoints/last.pt`` and ``best.pt`` as a W&B model artifact when the run
    ends."""


@dataclasses.dataclass
class TrainConfig:
    """One training run: ``robotrl train key=value ...``."""

    algo: Any = None
    """Algorithm config; its YAML carries ``name`` (one of ALGORITHMS)."""
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    """Task selection."""
    policy: Any = dataclasses.field(default_factory=MLPPolicyConfig)
    """Policy family (``configs/policy/``; its YAML carries ``name``, one of POLICIES): ``mlp``
    (the algorithm's own networks), or ``vla`` (the small VLA transformer); token policies are
    trained by GRPO and BC."""
    backend: BackendConfig = dataclasses.field(default_factory=BackendConfig)
    """Simulator backend."""
    logger: LoggerConfig = dataclasses.field(default_factory=LoggerConfig)
    """Logging."""
    randomization: RandomizationConfig = dataclasses.field(default_factory=RandomizationConfig)
    """Domain randomization of the training envs (``configs/randomization/``; evaluation envs
    stay nominal)."""
    num_envs: int = 128
    """Parallel training worlds."""
    total_steps: int = 2_000_000
    """Environment steps (summed over worlds) to train for; gradient updates for offline
    algorithms."""
    dataset: str = ""
    """Offline algorithms' data: a Minari dataset id (under ``MINARI_DATASETS_PATH``), a Minari
    dataset directory or a D4RL-style ``.hdf5`` file; the task comes from its card."""
    seed: int = 0
    """Seed of the run: networks, sampling, env resets."""
    num_seeds: int = 1
    """Train seeds ``seed .. seed + num_seeds - 1`` in one process, their updates batched
    (``robotrl.runners.seed_batch``); each seed is an ordinary run in ``run_dir/s<seed>``.
    Algorithms with a seed-batched learner: every offline learner, ``sac``, ``crossq``,
    ``fasttd3`` and ``ppo`` (MLP policies)."""
    device: str = "cpu"
    """Learner device (``cpu``, ``cuda``, ``cuda:1``)."""
    torch_threads: int = 1
    """Intra-op threads of torch (0: all cores). 1 by default: the native simulator already uses
    every core, and torch's spinning worker threads slow it down (measured: 5.9k vs 5.3k
    PPO env-steps/s on HalfCheetah, 2 cores, see benchmarks/README.md)."""
    max_minutes: float = 0.0
    """Wall-clock budget in minutes (0: none); on expiry the run checkpoints and evaluates."""
    run_dir: str = "runs/default"
    """Directory for all outputs: config.yaml, TensorBoard events, checkpoints/last.pt."""
    resume: str = ""
    """Checkpoint to continue from ('' starts fresh)."""
    init: str = ""
    """Checkpoint of another run whose actor starts this one (GRPO fine-tuning of a PPO, SAC or
    BC policy; it is also the KL reference); '' starts from scratch."""
    checkpoint_interval: int = 50
    """Write ``checkpoints/last.pt`` every this many iterations (and at the end)."""
    eval_interval: int = 100
    """Evaluate deterministically every this many iterations (0: only at the end)."""
    eval_episodes: int = 10
    """Episodes per evaluation (one per evaluation world)."""
    distributed: bool = False
    """Data-parallel training over the processes ``torchrun`` started (``robotrl.distributed``):
    each rank runs ``num_envs`` worlds of its own and gradients are averaged; ``total_steps``
    counts the steps of every rank."""


def _check_type(value: Any, hint: Any, path: str) -> Any:
    """Return ``value`` converted to ``hint`` where lossless, else raise naming ``path``."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        errors = []
        for option in typing.get_args(hint):
            try:
                return _check_type(value, option, path)
            except TypeError as err:
                errors.append(str(err))
        raise TypeError(f"{path}: {value!r} matches none of {hint}")
    if hint is type(None):
        if value is None:
            return None
        raise TypeError(f"{path}: expected None, got {value!r}")
    if origin in (list, tuple) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{path}: expected a list, got {type(value).__name__} {value!r}")
        args = typing.get_args(hint)
        item = args[0] if args else Any
        out = [_check_type(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if (origin or hint) is tuple else out
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise TypeError(f"{path}: expected a mapping, got {type(value).__name__} {value!r}")
        args = typing.get_args(hint)
        item = args[1] if len(args) == 2 else Any
        return {k: _check_type(v, item, f"{path}.{k}") for k, v in value.items()}
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise TypeError(f"{path}: expected true/false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise TypeError(f"{path}: expected an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise TypeError(f"{path}: expected a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise TypeError(f"{path}: expected a string, got {value!r}")
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, path)
    return value


def from_dict(cls: type, data: Any, path: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, validating keys and types recursively."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise TypeError(f"{path or cls.__name__}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        where = f" in {path}" if path else ""
        raise ValueError(f"unknown config key(s) {unknown}{where}; allowed keys: {names}")
    kwargs = {}
    for key, value in data.items():
        sub = f"{path}.{key}" if path else key
        if cls is TrainConfig and key == "algo":
            kwargs[key] = _algo_from_dict(value)
        elif cls is TrainConfig and key == "policy":
            kwargs[key] = _named_from_dict(value, "policy", list(POLICIES), policy_config_class)
        else:
            kwargs[key] = _check_type(value, hints[key], sub)
    return cls(**kwargs)


def _algo_from_dict(value: Any) -> Any:
    return _named_from_dict(value, "algo", list(ALGORITHMS), algo_config_class)


def _named_from_dict(value: Any, key: str, names: list[str], config_class: Any) -> Any:
    """A registry entry's config from ``{name: ..., fields...}``."""
    if dataclasses.is_dataclass(value):
        return value
    if not isinstance(value, dict) or "name" not in value:
        raise ValueError(f"{key} must be a mapping with a 'name' (one of {names}), got {value!r}")
    fields = dict(value)
    name = fields.pop("name")
    cls = config_class(name)
    if key == "algo" and "num_steps" in fields:  # a run saved before the key was renamed
        new = [f.name for f in dataclasses.fields(cls) if f.name in RENAMED_NUM_STEPS]
        if new and new[0] not in fields:
            fields[new[0]] = fields.pop("num_steps")
    return from_dict(cls, fields, key)


RENAMED_NUM_STEPS = ("rollout_steps", "collect_steps", "updates_per_iteration", "horizon")
"""What ``algo.num_steps`` of configs saved before the rename became, by runner kind; a saved
config is read with its new name (the command line refuses the old one, naming the new)."""


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Plain-data form of ``cfg`` (``algo`` carries its ``name``), round-trips via ``from_dict``."""
    out = dataclasses.asdict(cfg)
    out["algo"] = {"name": algorithm(cfg.algo).name, **dataclasses.asdict(cfg.algo)}
    out["policy"] = {"name": policy_name(cfg.policy), **dataclasses.asdict(cfg.policy)}
    return out


def validate(cfg: TrainConfig) -> None:
    """Value checks that types cannot express; raise before any training starts. The task
    and backend names are checked above this layer (``robotrl.experiment.validate``)."""
    if cfg.num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {cfg.num_envs}")
    if cfg.total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {cfg.total_steps}")
    if cfg.torch_threads < 0:
        raise ValueError(f"torch_threads must be >= 0 (0: all cores), got {cfg.torch_threads}")
    if cfg.max_minutes < 0:
        raise ValueError(f"max_minutes must be >= 0, got {cfg.max_minutes}")
    entry = algorithm(cfg.algo)
    if cfg.num_seeds < 1:
        raise ValueError(f"num_seeds must be >= 1, got {cfg.num_seeds}")
    if cfg.num_seeds > 1:
        batched = sorted(n for n, e in ALGORITHMS.items() if e.seed_batch is not None)
        if entry.seed_batch is None:
            raise ValueError(f"num_seeds > 1 needs a seed-batched learner; algo={entry.name} "
                             f"has none (those that have: {batched}); run its seeds as separate "
                             "runs (a multirun: seed=0,1,2)")
        for key in ("resume", "init"):
            if getattr(cfg, key):
                raise ValueError(f"num_seeds > 1 does not take {key}=: each seed is its own run "
                                 f"(run_dir/s<seed>); {key} one seed's run alone")
        if cfg.distributed:
            raise ValueError("num_seeds > 1 runs in one process: distributed=true is not for it")
        if policy_name(cfg.policy) != "mlp":
            raise ValueError(f"num_seeds > 1 batches MLP policies; policy={policy_name(cfg.policy)}"
                             " trains its seeds as separate runs (a multirun: seed=0,1,2)")
        check = getattr(resolve(entry.seed_batch), "check_config", None)
        if check is not None:  # what a seed batch does not take (PPO: a shared backbone, ...)
            check(cfg.algo)
    if entry.offline and not cfg.dataset:
        raise ValueError(f"algo={entry.name} learns from a dataset: give "
                         f"dataset=<Minari id | directory | file.hdf5>")
    if cfg.dataset and not entry.offline:
        offline_algos = [n for n, e in ALGORITHMS.items() if e.offline]
        raise ValueError(f"dataset= is for offline algorithms ({offline_algos}); "
                         f"algo={entry.name} collects its own data")
    if cfg.init:
        from pathlib import Path

        if not Path(cfg.init).is_file():
            raise ValueError(f"init={cfg.init!r} is not a file; give a checkpoint "
                             "(runs/<...>/checkpoints/best.pt or last.pt)")
    if cfg.distributed:
        import os

        from robotrl.distributed import TORCHRUN_VARS

        missing = [v for v in TORCHRUN_VARS if v not in os.environ]
        if missing:
            raise ValueError(
                f"distributed=true needs the processes torchrun starts ({', '.join(missing)} "
                "unset): torchrun --nproc-per-node N -m robotrl.cli.main train distributed=true ...")
    if entry.runner == "group" and cfg.randomization.enabled():
        raise ValueError("algo=grpo compares G rollouts from one state in identical worlds; "
                         "domain randomization would make them differ: use randomization=none")
    cfg.randomization.check()
    if cfg.randomization.enabled() and cfg.backend.name == "gymnasium":
        raise ValueError("randomization needs backend=mujoco, mjx or brax (per-world model "
                         "fields), got backend=gymnasium")
    if cfg.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"device={cfg.device!r} but CUDA is not available; use device=cpu")
    elif cfg.device != "cpu":
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {cfg.device!r}")
