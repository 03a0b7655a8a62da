"""Off-policy runner (SAC): step every world, store transitions, update from replay.

An iteration is ``steps_per_env`` steps of all N worlds (N x steps_per_env transitions into
the algorithm's replay buffer), then ``update``, which does the gradient steps those
transitions earned (``utd_ratio`` each). Many worlds per update make collection cheap: one
batched simulator call yields N transitions.
"""

from __future__ import annotations

from robotrl.runners.base import Runner, RunnerSettings
from robotrl.types import OffPolicyAlgorithm

__all__ = ["OffPolicyRunner", "RunnerSettings"]


class OffPolicyRunner(Runner):
    """The shared loop; transitions go to the algorithm's replay, nothing closes a rollout."""

    alg: OffPolicyAlgorithm
    iteration_key = "collect_steps"
