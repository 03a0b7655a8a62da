"""Task and backend registry: ``make``, ``list_tasks`` and the backend table.

    env = make("hopper", 256, num_threads=4, ctrl_cost_weight=0.01)   # native MuJoCo
    env = make("Pendulum-v1", 8, backend="gymnasium", vectorization="async")

``BACKEND_TABLE`` maps each backend name to a ``BackendEntry``: its constructor (which imports
the simulator's module only when called, so the JAX backends need JAX only when used), the
backend options it takes with their types, what its task options are, and a one-line
description. ``make`` checks options against the entry before building anything; adding a
backend is one entry in the table.
"""

from __future__ import annotations

import dataclasses
import importlib
import numbers
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch

from robotrl.config import RandomizationConfig
from robotrl.envs.base import BatchedEnv
from robotrl.envs.tasks.base import MujocoTask, make_config

# task name -> "module:Class" under robotrl.envs.tasks; imported on demand
_TASKS: dict[str, str] = {
    "halfcheetah": "halfcheetah:HalfCheetah",
    "hopper": "hopper:Hopper",
    "walker2d": "walker2d:Walker2d",
    "ant": "ant:Ant",
    "humanoid": "humanoid:Humanoid",
    "inverted_pendulum": "inverted_pendulum:InvertedPendulum",
    "inverted_double_pendulum": "inverted_double_pendulum:InvertedDoublePendulum",
    "reacher": "reacher:Reacher",
    "reacher_goal": "reacher_goal:ReacherGoal",
    "pusher_goal": "pusher_goal:PusherGoal",
    "ant_goal": "goals:AntGoal",
    "ant_umaze": "goals:AntUMaze",
    "ant_bigmaze": "goals:AntBigMaze",
    "humanoid_goal": "goals:HumanoidGoal",
    "swimmer": "swimmer:Swimmer",
    "tabletop": "tabletop:Tabletop",
    "go1_velocity": "velocity:Go1Velocity",
    "go1_velocity_rough": "velocity:Go1VelocityRough",
    "g1_velocity": "velocity:G1Velocity",
    # the DeepMind Control Suite (robotrl.envs.tasks.dmc; models from the dm_control package)
    "dmc/cheetah-run": "dmc.cheetah:CheetahRun",
    "dmc/walker-stand": "dmc.walker:WalkerStand",
    "dmc/walker-walk": "dmc.walker:WalkerWalk",
    "dmc/walker-run": "dmc.walker:WalkerRun",
    "dmc/hopper-stand": "dmc.hopper:HopperStand",
    "dmc/hopper-hop": "dmc.hopper:HopperHop",
    "dmc/reacher-easy": "dmc.reacher:ReacherEasy",
    "dmc/reacher-hard": "dmc.reacher:ReacherHard",
    "dmc/finger-spin": "dmc.finger:FingerSpin",
    "dmc/pendulum-swingup": "dmc.pendulum:PendulumSwingup",
    "dmc/acrobot-swingup": "dmc.acrobot:AcrobotSwingup",
    "dmc/ball_in_cup-catch": "dmc.ball_in_cup:BallInCupCatch",
    "dmc/humanoid-stand": "dmc.humanoid:HumanoidStand",
    "dmc/humanoid-walk": "dmc.humanoid:HumanoidWalk",
    "dmc/humanoid-run": "dmc.humanoid:HumanoidRun",
    "dmc/cartpole-balance": "dmc.cartpole:CartpoleBalance",
    "dmc/cartpole-swingup": "dmc.cartpole:CartpoleSwingup",
    "dmc/quadruped-walk": "dmc.quadruped:QuadrupedWalk",
    "dmc/quadruped-run": "dmc.quadruped:QuadrupedRun",
    "dmc/fish-swim": "dmc.fish:FishSwim",
    "dmc/dog-run": "dmc.dog:DogRun",
}


def list_tasks(goal: bool | None = None, success: bool | None = None) -> list[str]:
    """Names of the built-in tasks; ``goal``/``success``: only those that are (True) or are not
    (False) goal-conditioned / define a success criterion."""
    from robotrl.envs.tasks.base import GoalTask

    names = list(_TASKS)
    if goal is not None:
        names = [n for n in names if issubclass(task_class(n), GoalTask) == goal]
    if success is not None:
        names = [n for n in names if bool(task_class(n).has_success) == success]
    return names


def task_class(name: str) -> type[MujocoTask]:
    """The task class registered as ``name``."""
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; available tasks: {', '.join(_TASKS)}")
    module, cls = _TASKS[name].split(":")
    return getattr(importlib.import_module(f"robotrl.envs.tasks.{module}"), cls)


def make_task(name: str, **overrides: Any) -> MujocoTask:
    """Instantiate task ``name`` with config ``overrides`` (its config dataclass fields)."""
    cls = task_class(name)
    return cls(make_config(cls.config_cls, name, overrides), cls.load_model())


# ------------------------------------------------------------------------------ option types
def type_name(tp: Any) -> str:
    """How an option type reads in messages: ``int``, ``Sequence[str]``, ``str | None``."""
    if tp is None or tp is type(None):
        return "None"
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        return " | ".join(type_name(arg) for arg in typing.get_args(tp))
    if origin is not None:
        args = ", ".join("..." if a is Ellipsis else type_name(a) for a in typing.get_args(tp))
        return f"{type_name(origin)}[{args}]"
    return getattr(tp, "__name__", repr(tp))


def matches(value: Any, tp: Any) -> bool:
    """Whether ``value`` is of option type ``tp``: a class (``int`` takes integers but not
    bools), ``None``, a union, or a sequence type whose items are checked (``Sequence[str]``,
    ``tuple[str, ...]``; a string is not a sequence of strings)."""
    if tp is None or tp is type(None):
        return value is None
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        return any(matches(value, arg) for arg in typing.get_args(tp))
    if origin is not None:
        if not isinstance(value, origin) or isinstance(value, (str, bytes)):
            return False
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if issubclass(origin, Sequence) and len(args) == 1:
            return all(matches(item, args[0]) for item in value)
        return True
    if tp is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    return isinstance(value, tp)


RANDOMIZATION = RandomizationConfig | str | Mapping | None
"""Type of the ``randomization`` option: a preset name of ``configs/randomization/``, a mapping
of ``RandomizationConfig`` fields or a config; None: nominal physics."""


# ------------------------------------------------------------------------------ backend table
def config_fields(task: str) -> tuple[str, ...]:
    """Fields of built-in task ``task``'s config dataclass (a ValueError for unknown tasks)."""
    return tuple(f.name for f in dataclasses.fields(task_class(task).config_cls))


@dataclasses.dataclass(frozen=True)
class BackendEntry:
    """One backend of ``make``."""

    constructor: Callable[..., BatchedEnv]
    """``constructor(task, num_envs, device, seed, task_options, **backend_options)``: the env.
    ``task`` is as given to ``make``; ``task_options`` (a dict) the options that are not backend
    options, checked against ``task_fields``; ``backend_options`` those given of ``options``,
    type-checked. Imports the simulator's module when called, not at registration."""
    options: Mapping[str, Any]
    """Backend options the constructor takes, name -> type (``matches``/``type_name``)."""
    description: str
    """One line on what the backend runs."""
    task_fields: Callable[[str], Collection[str] | None] = config_fields
    """Names of the task options ``task`` takes on this backend; None: any, passed on for the
    simulator to check."""
    task_fields_name: str = "task config fields"
    """What ``task_fields`` are, for error messages."""

    def option_help(self) -> str:
        """``name: type`` of each backend option, comma separated."""
        return ", ".join(f"{k}: {type_name(t)}" for k, t in self.options.items()) or "none"


def _randomization(spec: Any) -> Any:
    """``spec`` with a non-dict mapping made a dict (``resolve`` takes dicts)."""
    return dict(spec) if isinstance(spec, Mapping) and not isinstance(spec, dict) else spec


def _mujoco(task: str, num_envs: int, device: str | torch.device, seed: int,
            task_options: dict[str, Any], num_threads: int = 0, randomization: Any = None,
            observations: Sequence[str] = ("policy",)) -> BatchedEnv:
    from robotrl.envs.mujoco import MujocoEnv

    return MujocoEnv(make_task(task, **task_options), num_envs, device, seed, int(num_threads),
                     _randomization(randomization), tuple(observations))


def _gym_id(task: str) -> str:
    """The Gymnasium id ``task`` names: a built-in task's ``gym_id``, else ``task`` itself."""
    return task_class(task).gym_id if task in _TASKS else task


def _gym_fields(task: str) -> Collection[str] | None:
    """Keyword arguments ``gymnasium.make`` and the env's constructor take; None when the
    constructor forwards ``**kwargs`` past what can be read (``GymnasiumEnv`` then lets it
    decide)."""
    import gymnasium

    from robotrl.envs.gym import MAKE_KEYS, constructor_options, find_gym_spec

    entry = find_gym_spec(_gym_id(task)).entry_point
    if entry is None:
        return None
    creator = gymnasium.envs.registration.load_env_creator(entry) if isinstance(entry, str) \
        else entry
    allowed = constructor_options(creator)
    return None if allowed is None else allowed | set(MAKE_KEYS)


def _gymnasium(task: str, num_envs: int, device: str | torch.device, seed: int,
               task_options: dict[str, Any], randomization: Any = None,
               vectorization: str = "sync") -> BatchedEnv:
    from robotrl.config import resolve_randomization
    from robotrl.envs.gym import GymnasiumEnv

    if resolve_randomization(_randomization(randomization)).enabled():
        raise ValueError("randomization needs the 'mujoco', 'mjx' or 'brax' backend (per-world"
                         " model fields); the gymnasium backend takes randomization=none")
    return GymnasiumEnv(_gym_id(task), num_envs, device=device, seed=seed,
                        vectorization=vectorization, **task_options)


def _mjx(task: str, num_envs: int, device: str | torch.device, seed: int,
         task_options: dict[str, Any], iterations: int | None = None,
         ls_iterations: int | None = None, randomization: Any = None) -> BatchedEnv:
    from robotrl.envs.mjx import MjxEnv

    solver = {k: None if v is None else int(v)
              for k, v in (("iterations", iterations), ("ls_iterations", ls_iterations))}
    return MjxEnv(make_task(task, **task_options), num_envs, device, seed, **solver,
                  randomization=_randomization(randomization))


def _brax_fields(task: str) -> Collection[str] | None:
    """Keyword arguments Brax's env ``task`` takes (its constructor's, through the ``**kwargs``
    it forwards to ``PipelineEnv``; ``sys`` and ``backend`` are BraxEnv's); None for a name Brax
    does not know (``BraxEnv`` then lists the ones it does)."""
    from brax import envs

    from robotrl.envs.brax import ALIASES
    from robotrl.envs.gym import constructor_options

    cls = getattr(envs, "_envs", {}).get(ALIASES.get(task, task))
    allowed = None if cls is None else constructor_options(cls)
    return None if allowed is None else allowed - {"sys", "backend"}


def _brax(task: str, num_envs: int, device: str | torch.device, seed: int,
          task_options: dict[str, Any], **backend_options: Any) -> BatchedEnv:
    from robotrl.envs.brax import BraxEnv

    if "randomization" in backend_options:
        backend_options["randomization"] = _randomization(backend_options["randomization"])
    return BraxEnv(task, num_envs, device=device, seed=seed, **backend_options, **task_options)


BACKEND_TABLE: dict[str, BackendEntry] = {
    "mujoco": BackendEntry(
        constructor=_mujoco,
        options={"num_threads": int, "randomization": RANDOMIZATION,
                 "observations": Sequence[str]},
        description="robotrl's tasks on native MuJoCo, a batch stepped on CPU threads "
                    "(num_threads 0: all cores; observations: the groups, e.g. privileged)",
    ),
    "gymnasium": BackendEntry(
        constructor=_gymnasium,
        options={"randomization": RANDOMIZATION, "vectorization": str},
        description="any Gymnasium id (a built-in task name: its Gymnasium twin) in a sync or "
                    "async vector env; no randomization",
        task_fields=_gym_fields,
        task_fields_name="Gymnasium env options",
    ),
    "mjx": BackendEntry(
        constructor=_mjx,
        options={"iterations": int | None, "ls_iterations": int | None,
                 "randomization": RANDOMIZATION},
        description="robotrl's tasks on MuJoCo XLA (JAX), on cpu or cuda; solver iterations "
                    "(None: the default, 1 on a GPU)",
    ),
    "brax": BackendEntry(
        constructor=_brax,
        options={"pipeline": str, "max_episode_steps": int, "fresh_reset": bool,
                 "iterations": int | None, "randomization": RANDOMIZATION},
        description="Brax's own envs (its MJCF, observation and reward) on a Brax pipeline "
                    "(envs/brax.py)",
        task_fields=_brax_fields,
        task_fields_name="Brax env options",
    ),
}
"""Backend name -> entry; ``make`` reads it at each call."""

BACKENDS: tuple[str, ...] = tuple(BACKEND_TABLE)
"""The built-in backends ``make`` accepts (``BACKEND_TABLE``'s names at import)."""


def backend_entry(name: str) -> BackendEntry:
    """The table entry of backend ``name``; a ValueError listing the available ones."""
    if name not in BACKEND_TABLE:
        raise ValueError(f"unknown backend {name!r}; available backends: "
                         f"{', '.join(BACKEND_TABLE)}")
    return BACKEND_TABLE[name]


def _check_options(name: str, entry: BackendEntry, task: str,
                   backend_options: dict[str, Any], task_options: dict[str, Any]) -> None:
    """Refuse task options the backend does not take and backend options of the wrong type."""
    fields = entry.task_fields(task) if task_options else None
    unknown = [] if fields is None else sorted(set(task_options) - set(fields))
    if unknown:
        elsewhere = [f"{k!r} is an option of backend(s) "
                     f"{', '.join(b for b, e in BACKEND_TABLE.items() if k in e.options)}"
                     for k in unknown if any(k in e.options for e in BACKEND_TABLE.values())]
        hint = f" ({'; '.join(elsewhere)})" if elsewhere else ""
        raise ValueError(
            f"unknown option(s) {unknown} for task {task!r} on backend {name!r}{hint}; "
            f"backend {name!r} options: {entry.option_help()}; "
            f"{entry.task_fields_name}: {sorted(fields or ())}"
        )
    for key, value in backend_options.items():
        tp = entry.options[key]
        if not matches(value, tp):
            raise TypeError(f"option {key!r} of backend {name!r} must be {type_name(tp)}, "
                            f"got {type(value).__name__} {value!r}")


def make(
    task: str,
    num_envs: int,
    backend: str = "mujoco",
    device: str | torch.device = "cpu",
    seed: int = 0,
    **options: Any,
) -> BatchedEnv:
    """Make ``num_envs`` worlds of ``task`` on ``backend`` (a name in ``BACKEND_TABLE``).

    Returns a ``BatchedEnv`` whose observations are dicts of ``[num_envs, ...]`` tensors on
    ``device`` (``"policy"`` always). ``options`` are the backend's options (its entry's
    ``options``, type-checked) and the rest task options: the fields of the task's config
    dataclass (e.g. ``ctrl_cost_weight=0.2``) on ``mujoco`` and ``mjx``, the Gymnasium env's
    keyword arguments on ``gymnasium``, Brax's env arguments on ``brax``. Backend options:

    * ``mujoco``: ``num_threads: int`` (0: all cores), ``randomization``,
      ``observations: Sequence[str]`` (groups to return, ``"policy"`` among them).
    * ``gymnasium``: ``task`` a built-in task name (its Gymnasium twin) or any Gymnasium id;
      ``vectorization: str`` (``"sync"`` or ``"async"``); ``randomization`` only when disabled.
    * ``mjx``: robotrl's tasks on MuJoCo XLA (``device`` cpu or cuda); ``iterations``,
      ``ls_iterations: int | None`` (solver iterations; None: the default), ``randomization``.
    * ``brax``: Brax's own envs; ``pipeline: str``, ``max_episode_steps: int``,
      ``fresh_reset: bool``, ``iterations: int | None``, ``randomization`` (``envs/brax.py``).

    ``randomization``: ``RandomizationConfig | str | Mapping | None``, a preset name of
    ``configs/randomization/``, a mapping of config fields or a config (None: nominal physics).

    Raises ValueError for an unknown backend (listing the available ones), an unknown task or
    an option that is neither a backend nor a task option (naming the backend, its options
    with their types and the task's fields); TypeError for a backend option of the wrong type.
    """
    entry = backend_entry(backend)
    backend_options, task_options = check_options(task, backend, **options)
    return entry.constructor(task, num_envs, device, seed, task_options, **backend_options)


def check_options(task: str, backend: str = "mujoco",
                  **options: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``make``'s option checks without making anything: (backend options, task options), or
    the ValueError or TypeError ``make`` would raise."""
    entry = backend_entry(backend)
    backend_options = {k: v for k, v in options.items() if k in entry.options}
    task_options = {k: v for k, v in options.items() if k not in entry.options}
    _check_options(backend, entry, task, backend_options, task_options)
    return backend_options, task_options
