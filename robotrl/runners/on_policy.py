"""On-policy runner (PPO, TRPO): each rollout of T steps is closed with ``compute_returns``."""

from __future__ import annotations

from robotrl.runners.base import Runner, RunnerSettings
from robotrl.types import Obs, OnPolicyAlgorithm

__all__ = ["OnPolicyRunner", "RunnerSettings"]


class OnPolicyRunner(Runner):
    """Collect T steps in every world, close the rollout, update on it (then it is cleared)."""

    alg: OnPolicyAlgorithm
    iteration_key = "rollout_steps"

    def _end_rollout(self, obs: Obs) -> None:
        self.alg.compute_returns(obs)
