"""Batched simulators speaking torch tensors: ``make``, ``list_tasks`` and the env protocol."""

from robotrl.envs.base import BatchedEnv, EnvSpec, StepOut
from robotrl.envs.registry import BACKENDS, list_tasks, make, make_task

__all__ = ["BACKENDS", "BatchedEnv", "EnvSpec", "StepOut", "list_tasks", "make", "make_task"]
