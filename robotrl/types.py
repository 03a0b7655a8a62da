"""Protocols shared across layers: what a runner may call on an algorithm."""

from __future__ import annotations

from typing import Any, Protocol

import torch


class OnPolicyAlgorithm(Protocol):
    """An algorithm the on-policy runner drives (PPO, TRPO, ...).

    ``act`` and ``process_env_step`` run under ``torch.inference_mode()`` during collection;
    ``update`` runs outside it. Shapes: N = num_envs.
    """

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """Sample actions [N, act_dim] for obs [N, obs_dim]; record what the update needs."""
        ...

    def act_deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """Deterministic actions [N, act_dim] for evaluation; records nothing."""
        ...

    def process_env_step(self, reward: torch.Tensor, terminated: torch.Tensor,
                         truncated: torch.Tensor, final_obs: torch.Tensor) -> None:
        """Record the step's outcome: reward [N], terminated/truncated [N] bool, final_obs [N, D]."""
        ...

    def compute_returns(self, last_obs: torch.Tensor) -> None:
        """Close the rollout with the observation [N, obs_dim] after its last step."""
        ...

    def update(self, progress: float) -> dict[str, float]:
        """Learn from the rollout; ``progress`` in [0, 1] is the fraction of training done."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class OffPolicyAlgorithm(Protocol):
    """An algorithm the off-policy runner drives (SAC, ...): it stores transitions in its own
    replay buffer and learns from it. Same call order as on-policy, without ``compute_returns``.
    """

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """Exploration actions [N, act_dim] for obs [N, obs_dim]; remembers (obs, action)."""
        ...

    def act_deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """Deterministic actions [N, act_dim] for evaluation; records nothing."""
        ...

    def process_env_step(self, reward: torch.Tensor, terminated: torch.Tensor,
                         truncated: torch.Tensor, final_obs: torch.Tensor) -> None:
        """Store the transitions: reward [N], flags [N] bool, final_obs [N, D] = next states."""
        ...

    def update(self, progress: float) -> dict[str, float]:
        """Do the gradient updates the stored transitions earned; may return {} (warm-up)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
