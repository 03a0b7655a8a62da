"""Learning algorithms; they see tensors and specs, never environments."""

from robotrl.algos.advantages import gae, group_normalize
from robotrl.algos.pg_core import (
    AGGREGATIONS,
    aggregate,
    clipped_surrogate,
    kl_k3,
    policy_loss,
    surrogate,
    value_loss,
)
from robotrl.algos.ppo import PPO, PPOConfig
from robotrl.algos.sac import SAC, SACConfig
from robotrl.algos.trpo import TRPO, TRPOConfig

__all__ = [
    "AGGREGATIONS",
    "PPO",
    "PPOConfig",
    "SAC",
    "SACConfig",
    "TRPO",
    "TRPOConfig",
    "aggregate",
    "clipped_surrogate",
    "gae",
    "group_normalize",
    "kl_k3",
    "policy_loss",
    "surrogate",
    "value_loss",
]
