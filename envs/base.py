"""The batched-environment protocol every backend speaks.

A ``BatchedEnv`` holds ``num_envs`` worlds and exchanges torch tensors on ``env.device``:

    obs = env.reset(seed=0)                 # [N, obs_dim]
    out = env.step(action)                  # action: [N, act_dim]
    out.obs, out.reward                     # [N, obs_dim], [N]
    out.terminated, out.truncated           # [N] bool, kept separate (bootstrap on truncation)
    out.info["final_obs"]                   # [N, obs_dim]: the observation before auto-reset

Finished worlds reset automatically inside ``step``; for them ``out.obs`` is the first
observation of the next episode and ``info["final_obs"]`` the last one of the finished episode
(for the other rows it equals ``out.obs``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch


@dataclass(frozen=True)
class EnvSpec:
    """Static description of a batched environment."""

    obs_dim: int
    """Length of the flat policy observation."""
    action_dim: int
    """Length of the action vector."""
    action_low: torch.Tensor
    """Lower action bounds, [action_dim] (float32, on CPU)."""
    action_high: torch.Tensor
    """Upper action bounds, [action_dim] (float32, on CPU)."""
    control_dt: float
    """Seconds of simulated time per ``step``."""
    max_episode_steps: int
    """Steps after which an episode is truncated."""
    reward_terms: tuple[str, ...] = ()
    """Names of the reward terms reported in ``info["reward_terms"]``."""
    obs_groups: dict[str, int] = field(default_factory=dict)
    """Named observation groups and their sizes (``{"policy": obs_dim}`` when empty)."""
    task: str = ""
    """Task name the env was made for."""


class StepOut(NamedTuple):
    """What ``BatchedEnv.step`` returns; every tensor has leading dimension N = num_envs."""

    obs: torch.Tensor
    """[N, obs_dim] float32: next observation (the reset one for finished worlds)."""
    reward: torch.Tensor
    """[N] float32."""
    terminated: torch.Tensor
    """[N] bool: the episode reached a terminal state (no bootstrap)."""
    truncated: torch.Tensor
    """[N] bool: the episode was cut by the time limit (bootstrap from ``final_obs``)."""
    info: dict[str, Any]
    """``final_obs`` [N, obs_dim], ``reward_terms`` {name: [N]}, backend extras."""


class BatchedEnv(ABC):
    """A batch of ``num_envs`` worlds stepped together; see the module docstring."""

    num_envs: int
    device: torch.device
    spec: EnvSpec

    @abstractmethod
    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Reset every world; reseed the reset distribution when ``seed`` is given.

        Returns the observation, [N, obs_dim].
        """

    @abstractmethod
    def step(self, action: torch.Tensor) -> StepOut:
        """Apply ``action`` [N, act_dim] for one control step and auto-reset finished worlds."""

    def get_state(self) -> torch.Tensor:
        """Full simulator state of every world, [N, S] float64."""
        raise NotImplementedError(f"{type(self).__name__} cannot snapshot its state")

    def set_state(self, state: torch.Tensor, env_ids: torch.Tensor | None = None) -> None:
        """Restore worlds ``env_ids`` ([K] long, all when None) from ``state`` [K, S]."""
        raise NotImplementedError(f"{type(self).__name__} cannot restore a state")

    def render(self, env_id: int = 0) -> Any:
        """An RGB frame [H, W, 3] uint8 of world ``env_id``; backends without a renderer raise."""
        raise NotImplementedError(f"the {type(self).__name__} backend cannot render")

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the batch exactly (checkpointing); see backends."""
        raise NotImplementedError(f"{type(self).__name__} cannot checkpoint its state")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        raise NotImplementedError(f"{type(self).__name__} cannot restore a checkpoint")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release simulator resources."""

    def __enter__(self) -> BatchedEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_action_shape(action: torch.Tensor, spec: EnvSpec, num_envs: int) -> None:
    """Raise a clear error for an action of the wrong type, shape or dtype (no host sync)."""
    if not isinstance(action, torch.Tensor):
        raise TypeError(
            f"action must be a torch.Tensor of shape [{num_envs}, {spec.action_dim}], "
            f"got {type(action).__name__}"
        )
    if tuple(action.shape) != (num_envs, spec.action_dim):
        raise ValueError(
            f"action has shape {tuple(action.shape)}, expected ({num_envs}, {spec.action_dim}) "
            f"= (num_envs, action_dim) for task {spec.task!r}"
        )
    if not action.is_floating_point():
        raise TypeError(f"action must be a floating-point tensor, got dtype {action.dtype}")


def check_action(action: torch.Tensor, spec: EnvSpec, num_envs: int) -> None:
    """``check_action_shape`` plus NaN/Inf entries (reads a flag on the host: CPU backends)."""
    check_action_shape(action, spec, num_envs)
    if not bool(torch.isfinite(action).all()):
        bad = (~torch.isfinite(action)).any(dim=1).nonzero().flatten().tolist()
        raise ValueError(
            f"action contains NaN or Inf in envs {bad[:10]}{'...' if len(bad) > 10 else ''}; "
            "refusing to feed it to the physics"
        )


def end_unstable(unstable: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor,
                 reward: torch.Tensor, obs: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(terminated, truncated, reward, obs) with the worlds in ``unstable`` [N] bool ended: an
    unstable world's state is garbage, so its episode terminates (no bootstrap) with reward 0,
    and non-finite observations become 0 so that they cannot reach the learner."""
    return (terminated | unstable, truncated & ~unstable, reward.masked_fill(unstable, 0.0),
            torch.nan_to_num(obs, nan=0.0, posinf=0.0, neginf=0.0))
