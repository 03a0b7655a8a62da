"""Tanh-squashed Gaussian policy (Haarnoja et al. 2018, SAC, appendix C)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from robotrl.nn.mlp import mlp

LOG_STD_MIN = -20.0
"""Lower bound on the pre-squash log std (as in the SAC reference implementation)."""
LOG_STD_MAX = 2.0
"""Upper bound on the pre-squash log std."""

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def tanh_log_det_jacobian(u: torch.Tensor) -> torch.Tensor:
    """log |d tanh(u) / du| = log(1 - tanh(u)^2) per element, [..., A] -> [..., A].

    Written as 2 (log 2 - u - softplus(-2u)), which stays finite where tanh(u) rounds to +-1
    (the naive form gives log 0 = -inf once |u| > ~9 in float32).
    """
    return 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))


def squashed_log_prob(
    noise: torch.Tensor, log_std: torch.Tensor, u: torch.Tensor, epsilon: float = 0.0
) -> torch.Tensor:
    """log pi(tanh(u)) for u = mean + std * noise, summed over action dims: [..., A] -> [...].

    Change of variables: log N(u; mean, std) - sum log(1 - tanh(u)^2) (SAC eq. 21).
    ``epsilon`` > 0 takes log(1 - tanh(u)^2 + epsilon) instead of the exact term
    (Stable-Baselines3's guard against log 0, there 1e-6; the exact form needs none).
    """
    gaussian = -0.5 * noise.square() - log_std - _HALF_LOG_2PI
    if epsilon > 0:
        log_det = torch.log(1.0 - torch.tanh(u).square() + epsilon)
    else:
        log_det = tanh_log_det_jacobian(u)
    return (gaussian - log_det).sum(-1)


class SquashedGaussianActor(nn.Module):
    """obs -> (mean, log_std) of a Gaussian on u; actions a = tanh(u) in (-1, 1)^A.

    The algorithm maps a to the env's bounds with an affine map; the constant log-det of that
    map does not change gradients, so log-probabilities are those of a (as the SAC reference).
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int] = (256, 256),
        activation: str = "relu",
        net: nn.Module | None = None,
        squash_epsilon: float = 0.0,
    ) -> None:
        """Args: ``net`` [B, obs_dim] -> [B, 2 act_dim] replaces the MLP of ``hidden`` widths
        (e.g. a deep residual network, ``robotrl.nn.residual.DeepResNet``);
        ``squash_epsilon`` as ``squashed_log_prob``'s ``epsilon`` (0: the exact term)."""
        super().__init__()
        self.act_dim, self.obs_dim = act_dim, obs_dim
        self.squash_epsilon = squash_epsilon
        self.net = net if net is not None else mlp(obs_dim, hidden, 2 * act_dim, activation,
                                                   ortho_init=False)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, log_std)``, each [B, A], for ``obs`` [B, obs_dim]."""
        mean, log_std = self.net(obs).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(
        self, obs: torch.Tensor, generator: torch.Generator | None = None,
        num_samples: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterized sample: ``(action [B, A] in (-1, 1), log_prob [B])``; with
        ``num_samples`` K, K samples per state, ``(action [B, K, A], log_prob [B, K])``, from one
        evaluation of the network per state (the noise is drawn as for ``obs`` repeated K times
        per row, so both give the same samples)."""
        mean, log_std = self(obs)
        if num_samples is not None:
            shape = (mean.shape[0], num_samples, mean.shape[1])
            mean, log_std = mean[:, None].expand(shape), log_std[:, None].expand(shape)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        u = mean + log_std.exp() * noise
        return torch.tanh(u), squashed_log_prob(noise, log_std, u, self.squash_epsilon)

    def deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """tanh(mean): [B, A] in (-1, 1)."""
        return torch.tanh(self(obs)[0])
