"""Batched simulators speaking torch tensors: ``make``, ``list_tasks``, the env protocol, and
adapters into Gymnasium's and Stable-Baselines3's vector APIs."""

from robotrl.envs.base import BatchedEnv, EnvSpec, StepOut
from robotrl.envs.interop import as_gymnasium_vector, as_sb3_vecenv
from robotrl.envs.registry import BACKENDS, list_tasks, make, make_task

__all__ = ["BACKENDS", "BatchedEnv", "EnvSpec", "StepOut", "as_gymnasium_vector", "as_sb3_vecenv",
           "list_tasks", "make", "make_task"]
