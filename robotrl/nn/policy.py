"""Gaussian actor-critic for continuous control."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributions import Normal

from robotrl.nn.mlp import mlp, orthogonal_init

LOG_STD_MIN = -5.0
"""Lower bound on log std (std ~ 0.007): keeps log-probabilities finite when the policy sharpens."""
LOG_STD_MAX = 2.0
"""Upper bound on log std (std ~ 7.4)."""

_POLICY_OUT_GAIN = 0.01
"""Output gain of the mean head: near-zero initial means (Andrychowicz et al. 2021, sec. 3.2)."""


class GaussianActorCritic(nn.Module):
    """A diagonal Gaussian policy and a state-value function on (normalized) observations.

    Separate networks by default; with ``shared`` one trunk of widths ``actor_hidden`` feeds a
    linear mean head and a linear value head (``critic_hidden`` is then unused). The log std is
    a free parameter per action dimension, or with ``state_dependent_std`` a second output of
    the mean head, offset by ``init_log_std``. Both are clamped to [LOG_STD_MIN, LOG_STD_MAX],
    and from below to ``log(min_std)`` per action dimension when ``min_std`` [act_dim] is given.
    With ``critic_obs_dim`` the value network takes its own input (an asymmetric actor-critic:
    the critic also sees privileged observations the actor does not).
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        actor_hidden: Sequence[int] = (64, 64),
        critic_hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        shared: bool = False,
        init_log_std: float = 0.0,
        state_dependent_std: bool = False,
        ortho_init: bool = True,
        critic_obs_dim: int | None = None,
        min_std: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        if shared and critic_obs_dim is not None:
            raise ValueError("a shared backbone feeds actor and critic the same input; an "
                             "asymmetric critic (its own observations) needs shared=False")
        self.obs_dim = obs_dim
        self.act_dim = act_dim
        self.shared = shared
        self.state_dependent_std = state_dependent_std
        self.init_log_std = init_log_std
        head_out = 2 * act_dim if state_dependent_std else act_dim
        self.trunk: nn.Module
        if shared:
            if not actor_hidden:
                raise ValueError(
                    "a shared backbone needs at least one hidden layer in actor_hidden"
                )
            self.trunk = mlp(obs_dim, actor_hidden, None, activation, ortho_init)
            self.actor_head = nn.Linear(actor_hidden[-1], head_out)
            self.critic_head = nn.Linear(actor_hidden[-1], 1)
            if ortho_init:
                orthogonal_init(self.actor_head, _POLICY_OUT_GAIN)
                orthogonal_init(self.critic_head, 1.0)
        else:
            self.trunk = nn.Identity()
            self.actor_head = mlp(
                obs_dim, actor_hidden, head_out, activation, ortho_init, _POLICY_OUT_GAIN
            )
            self.critic_head = mlp(critic_obs_dim or obs_dim, critic_hidden, 1, activation,
                                   ortho_init, 1.0)
        if not state_dependent_std:
            self.log_std = nn.Parameter(torch.full((act_dim,), float(init_log_std)))
        self.log_std_min: torch.Tensor | None
        if min_std is None:
            self.log_std_min = None
        else:  # derived from the config, so not saved with the weights
            floor = torch.as_tensor(min_std, dtype=torch.float32).log().clamp_min(LOG_STD_MIN)
            self.register_buffer("log_std_min", floor.expand(act_dim).clone(), persistent=False)

    def _mean_log_std(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.actor_head(features)
        if self.state_dependent_std:
            mean, raw = out.chunk(2, dim=-1)
            log_std = raw + self.init_log_std
        else:
            mean = out
            log_std = self.log_std.expand_as(mean)
        if self.log_std_min is None:
            return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        return mean, torch.maximum(log_std, self.log_std_min).clamp_max(LOG_STD_MAX)

    def forward(self, obs: torch.Tensor,
                critic_obs: torch.Tensor | None = None) -> tuple[Normal, torch.Tensor]:
        """Action distribution and value from one trunk pass.

        Args:
            obs: [N, obs_dim] normalized observations.
            critic_obs: [N, critic_obs_dim] the critic's input (asymmetric); None: ``obs``.

        Returns:
            ``(Normal with loc/scale [N, act_dim], value [N])``.
        """
        if self.shared:
            features = self.trunk(obs)
            mean, log_std = self._mean_log_std(features)
            value = self.critic_head(features)
        else:
            mean, log_std = self._mean_log_std(obs)
            value = self.critic_head(obs if critic_obs is None else critic_obs)
        # validate_args=False: validation reads tensors on the host (a sync per call)
        return Normal(mean, log_std.exp(), validate_args=False), value.squeeze(-1)

    def dist(self, obs: torch.Tensor) -> Normal:
        """Action distribution for ``obs`` [N, obs_dim]: Normal with loc/scale [N, act_dim]."""
        mean, log_std = self._mean_log_std(self.trunk(obs))
        return Normal(mean, log_std.exp(), validate_args=False)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State value of the critic's input ``obs`` [N, critic_obs_dim or obs_dim]: [N]."""
        return self.critic_head(self.trunk(obs)).squeeze(-1)

    def deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """Mean action for ``obs`` [N, obs_dim]: [N, act_dim] (unclipped)."""
        out = self.actor_head(self.trunk(obs))
        return out[..., : self.act_dim] if self.state_dependent_std else out
