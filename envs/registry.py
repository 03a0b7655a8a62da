"""Task and backend registry: ``make`` and ``list_tasks``."""

from __future__ import annotations

import importlib
from typing import Any

import torch

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
    "swimmer": "swimmer:Swimmer",
}

BACKENDS: tuple[str, ...] = ("mujoco", "gymnasium", "mjx", "brax")
"""Backends ``make`` accepts."""


def list_tasks() -> list[str]:
    """Names of the built-in tasks."""
    return list(_TASKS)


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


def make(
    task: str,
    num_envs: int,
    backend: str = "mujoco",
    device: str | torch.device = "cpu",
    seed: int = 0,
    **overrides: Any,
) -> BatchedEnv:
    """Make ``num_envs`` worlds of ``task`` on ``backend``.

    ``overrides`` are fields of the task's config (e.g. ``ctrl_cost_weight=0.2``); the
    ``mujoco``, ``mjx`` and ``brax`` backends also take ``randomization`` (a preset name of
    ``configs/randomization/``, a mapping or a ``RandomizationConfig``; default nominal
    physics), ``mujoco`` also ``num_threads`` (0: all cores). The ``gymnasium`` backend takes
    a built-in task name or any Gymnasium id, and ``vectorization`` ("sync" or "async").
    ``mjx`` runs the built-in tasks on MuJoCo XLA (``device`` cpu or cuda; also takes
    ``iterations``/``ls_iterations``); ``brax`` runs Brax's own envs (``envs/brax.py``).
    """
    if backend == "mujoco":
        from robotrl.envs.mujoco import MujocoEnv

        num_threads = int(overrides.pop("num_threads", 0))
        randomization = overrides.pop("randomization", None)
        observations = tuple(overrides.pop("observations", ("policy",)))
        return MujocoEnv(make_task(task, **overrides), num_envs, device, seed, num_threads,
                         randomization, observations)
    if backend == "gymnasium":
        from robotrl.envs.gym import GymnasiumEnv
        from robotrl.envs.randomization import resolve

        if resolve(overrides.pop("randomization", None)).enabled():
            raise ValueError("randomization needs the 'mujoco', 'mjx' or 'brax' backend (per-world"
                             " model fields); the gymnasium backend takes randomization=none")

        env_id = task_class(task).gym_id if task in _TASKS else task
        return GymnasiumEnv(env_id, num_envs, device=device, seed=seed, **overrides)
    if backend == "mjx":
        from robotrl.envs.mjx import MjxEnv

        solver = {k: int(overrides.pop(k)) for k in ("iterations", "ls_iterations") if k in overrides}
        randomization = overrides.pop("randomization", None)
        return MjxEnv(make_task(task, **overrides), num_envs, device, seed, **solver,
                      randomization=randomization)
    if backend == "brax":
        from robotrl.envs.brax import BraxEnv

        return BraxEnv(task, num_envs, device=device, seed=seed, **overrides)
    raise ValueError(f"unknown backend {backend!r}; available backends: {', '.join(BACKENDS)}")
