"""Target networks and bootstrapped targets: what learners and off-policy evaluation share."""

from __future__ import annotations

import torch
from torch import nn


def polyak(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- (1 - tau) target + tau source, in one foreach kernel."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


def td_target(reward: torch.Tensor, terminated: torch.Tensor, next_value: torch.Tensor,
              gamma: float) -> torch.Tensor:
    """r + gamma (1 - terminated) V(s'): [B] from reward [B], terminated [B] bool, next_value [B]."""
    return reward + gamma * (~terminated) * next_value
