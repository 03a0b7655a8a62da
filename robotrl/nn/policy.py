"""Gaussian policies for continuous control: the actor-critic of PPO and TRPO, and the
critic-free ``GaussianPolicy`` of GRPO."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn
from torch.distributions import Normal

from robotrl.nn.actor import OUTPUT_TRANSFORMS, DeterministicActor
from robotrl.nn.linear import Linear
from robotrl.nn.mlp import as_mlp, mlp, orthogonal_init
from robotrl.nn.normalizer import RunningNormalizer
from robotrl.types import Obs, policy_obs

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
            self.actor_head = Linear(actor_hidden[-1], head_out)
            self.critic_head = Linear(actor_hidden[-1], 1)
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
        else:  # [act_dim]: Normal broadcasts it, and PPO's loss sums its gradient in one op
            mean, log_std = out, self.log_std
        if self.log_std_min is None:
            return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        return mean, torch.maximum(log_std, self.log_std_min).clamp_max(LOG_STD_MAX)

    def heads(self, obs: torch.Tensor, critic_obs: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The raw outputs of one trunk pass: ``(mean [N, act_dim], log_std, value [N])``, the
        clamped log std [act_dim] (a free parameter) or [N, act_dim] (state-dependent).

        Args:
            obs: [N, obs_dim] normalized observations.
            critic_obs: [N, critic_obs_dim] the critic's input (asymmetric); None: ``obs``.
        """
        if self.shared:
            features = self.trunk(obs)
            mean, log_std = self._mean_log_std(features)
            value = self.critic_head(features)
        else:
            mean, log_std = self._mean_log_std(obs)
            value = self.critic_head(obs if critic_obs is None else critic_obs)
        return mean, log_std, value.squeeze(-1)

    def forward(self, obs: torch.Tensor,
                critic_obs: torch.Tensor | None = None) -> tuple[Normal, torch.Tensor]:
        """Action distribution (Normal with loc/scale [N, act_dim]) and value [N] of ``heads``."""
        mean, log_std, value = self.heads(obs, critic_obs)
        # validate_args=False: validation reads tensors on the host (a sync per call)
        return Normal(mean, log_std.exp().expand_as(mean), validate_args=False), value

    def dist(self, obs: torch.Tensor) -> Normal:
        """Action distribution for ``obs`` [N, obs_dim]: Normal with loc/scale [N, act_dim]."""
        mean, log_std = self._mean_log_std(self.trunk(obs))
        return Normal(mean, log_std.exp().expand_as(mean), validate_args=False)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State value of the critic's input ``obs`` [N, critic_obs_dim or obs_dim]: [N]."""
        return self.critic_head(self.trunk(obs)).squeeze(-1)

    def deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """Mean action for ``obs`` [N, obs_dim]: [N, act_dim] (unclipped)."""
        out = self.actor_head(self.trunk(obs))
        return out[..., : self.act_dim] if self.state_dependent_std else out


class GaussianPolicy(nn.Module):
    """A diagonal Gaussian policy on raw observations, with the sampling interface GRPO uses.

    The mean is ``network(normalize(obs))`` (``output="clip"``: unbounded, the env clips the
    sampled action) or ``center + half_range * tanh(network(...))`` (``output="tanh"``: a
    pretrained actor that squashes, e.g. SAC's or BC's); the log std is a free parameter per
    action dimension, clamped to [LOG_STD_MIN, LOG_STD_MAX]. The learner sees only ``sample``,
    ``log_prob``, ``entropy`` and ``deterministic`` (log-probabilities, not distributions), the
    interface a token policy also provides (``robotrl.vla``). ``arch`` (plain data) rebuilds
    the module, so a checkpoint of a fine-tuned policy needs no code of the algorithm it came
    from.

    Attributes:
        network: ``mlp`` from normalized obs [B, obs_dim] to [B, act_dim].
        normalizer: ``RunningNormalizer`` applied first, or None.
        log_std: [act_dim] parameter.
        arch: hidden widths, activation, output transform, normalizer settings.
    """

    def __init__(self, obs_dim: int, action_low: torch.Tensor, action_high: torch.Tensor,
                 hidden: Sequence[int] = (64, 64), activation: str = "tanh",
                 output: str = "clip", normalize: bool = True, init_log_std: float = 0.0,
                 norm_eps: float = 1e-8, norm_clip: float = 10.0) -> None:
        super().__init__()
        if output not in OUTPUT_TRANSFORMS:
            raise ValueError(f"unknown output {output!r}; known: {', '.join(OUTPUT_TRANSFORMS)}")
        low = torch.as_tensor(action_low, dtype=torch.float32).detach().cpu().flatten()
        high = torch.as_tensor(action_high, dtype=torch.float32).detach().cpu().flatten()
        self.obs_dim, self.act_dim, self.output = int(obs_dim), int(low.numel()), output
        self.arch = {"hidden": [int(h) for h in hidden], "activation": activation,
                     "output": output, "normalize": bool(normalize), "norm_eps": float(norm_eps),
                     "norm_clip": float(norm_clip)}
        self.network = mlp(obs_dim, hidden, self.act_dim, activation, True, _POLICY_OUT_GAIN)
        self.normalizer = RunningNormalizer(obs_dim, norm_eps, norm_clip) if normalize else None
        self.log_std = nn.Parameter(torch.full((self.act_dim,), float(init_log_std)))
        self.register_buffer("low", low.clone())
        self.register_buffer("high", high.clone())

    @classmethod
    def from_actor(cls, actor: DeterministicActor, init_log_std: float) -> GaussianPolicy:
        """A trainable policy whose mean is ``actor`` (any algorithm's ``export_actor`` with a
        plain MLP network: PPO, TRPO, SAC, BC, TD3+BC, IQL, ...): the same weights, observation
        normalization and output transform, so ``deterministic(obs)`` equals ``actor(obs)``."""
        network, hidden, activation = as_mlp(actor.network, actor.act_dim)
        policy = cls(actor.obs_dim, actor.low, actor.high, hidden, activation, actor.output,
                     actor.normalize, init_log_std, actor.eps or 1e-8,
                     actor.clip if actor.normalize else 10.0)
        policy.network.load_state_dict(network.state_dict())
        if policy.normalizer is not None:
            policy.normalizer.mean.copy_(actor.mean.double())
            # the actor keeps std = sqrt(var + eps) in float32; this var gives it back exactly
            policy.normalizer.var.copy_(actor.std.double().square() - actor.eps)
        return policy

    def mean(self, obs: torch.Tensor) -> torch.Tensor:
        """Mean action [B, act_dim] of raw observations ``obs`` [B, obs_dim] (not clipped)."""
        x = obs if self.normalizer is None else self.normalizer(obs)
        y = self.network(x)
        if self.output == "tanh":
            return (self.high + self.low) / 2 + (self.high - self.low) / 2 * torch.tanh(y)
        return y

    def dist(self, obs: torch.Tensor) -> Normal:
        """The action distribution of ``obs`` [B, obs_dim]: Normal with loc/scale [B, act_dim]."""
        mean = self.mean(obs)
        std = self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp().expand_as(mean)
        return Normal(mean, std, validate_args=False)

    observations: tuple[str, ...] = ("policy",)
    """Observation groups the policy reads (its methods also take the bare ``policy`` tensor)."""

    def sample(self, obs: Obs | torch.Tensor, generator: torch.Generator
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(action [B, act_dim] unclipped, its log-probability [B]) drawn with ``generator``."""
        dist = self.dist(policy_obs(obs))
        noise = torch.randn(dist.loc.shape, generator=generator, device=dist.loc.device,
                            dtype=dist.loc.dtype)
        action = dist.loc + dist.scale * noise
        return action, dist.log_prob(action).sum(-1)

    def log_prob(self, obs: Obs | torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """log pi(action | obs): [B] (summed over action dimensions)."""
        return self.dist(policy_obs(obs)).log_prob(action).sum(-1)

    def entropy(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """Entropy of pi(. | obs): [B] (summed over action dimensions)."""
        return self.dist(policy_obs(obs)).entropy().sum(-1)

    def evaluate(self, obs: Obs | torch.Tensor, action: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probability, entropy), each [B, 1]: one "token" per action (a token policy has
        one per action dimension and chunk step)."""
        dist = self.dist(policy_obs(obs))
        return dist.log_prob(action).sum(-1, keepdim=True), dist.entropy().sum(-1, keepdim=True)

    def deterministic(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """Mean action clipped to the bounds: [B, act_dim]."""
        return torch.clamp(self.mean(policy_obs(obs)), self.low, self.high)

    def reference(self) -> GaussianPolicy:
        """A frozen copy: its ``evaluate`` gives this policy's present log-probabilities (GRPO's
        KL reference; the token policies' ``reference`` has the same contract)."""
        return copy.deepcopy(self).requires_grad_(False)

    def export(self) -> DeterministicActor:
        """Frozen copy of ``deterministic`` for sim2real export."""
        return DeterministicActor(self.network, self.obs_dim, self.low, self.high, self.output,
                                  self.normalizer)
