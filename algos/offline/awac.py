"""AWAC (Nair et al. 2020, "Accelerating Online RL with Offline Datasets"), offline.

A critic learned by TD on the policy's own next actions, and a policy fitted by advantage-
weighted regression: weights exp((Q(s, a) - Q(s, a~pi)) / lambda) on the data's actions.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from robotrl.algos.offline.base import (
    GaussianActor,
    OfflineConfig,
    OfflineLearner,
    check_choice,
    check_log_std_range,
)
from robotrl.algos.offline.losses import (
    advantage_weighted_loss,
    ensemble_mse,
    softmax_weighted_loss,
)
from robotrl.nn.ensemble import EnsembleQ
from robotrl.nn.squashed_gaussian import squashed_log_prob
from robotrl.nn.target import polyak, td_target
from robotrl.optim import adam


@dataclasses.dataclass
class AWACConfig(OfflineConfig):
    """AWAC; defaults are CORL's ``awac.py`` MuJoCo configs."""

    temperature: float = 1.0 / 3.0
    """lambda of the weights exp(adv / lambda) (CORL: 0.3333; the paper: 1.0)."""
    max_weight: float = 100.0
    """Clip of the exponentiated advantages."""
    num_critics: int = 2
    """Q ensemble size (targets and advantages take the minimum)."""
    hidden: tuple[int, ...] = (256, 256, 256)
    """Hidden widths of actor and critics."""
    advantage_weights: str = "clipped_exp"
    """clipped_exp: -mean(min(exp(adv / lambda), max_weight) log pi) (CORL); batch_softmax:
    -sum(B softmax_batch(adv / lambda) log pi), no clip (d3rlpy; see
    ``losses.softmax_weighted_loss``)."""
    backup: str = "policy"
    """The TD target's next action: policy: a' ~ pi(s') as the actor samples, no entropy
    term (CORL); squashed_entropy: a' = tanh(mu + sigma eps), minus log pi(a'|s') of
    that squashed Gaussian at temperature 1 (d3rlpy, whose AWAC keeps SAC's soft target with
    its fixed placeholder temperature 1)."""
    log_std_range: tuple[float, float] = (-5.0, 2.0)
    """Bounds of the policy's state-independent log std (d3rlpy: (-6, 0))."""
    sigmoid_log_std: bool = False
    """Map the log-std parameter into ``log_std_range`` by a sigmoid (d3rlpy) instead of
    clamping it (CORL); see ``GaussianActor``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.temperature <= 0 or self.max_weight <= 0:
            raise ValueError("temperature and max_weight must be > 0")
        check_choice("advantage_weights", self.advantage_weights,
                     ("clipped_exp", "batch_softmax"))
        check_choice("backup", self.backup, ("policy", "squashed_entropy"))
        self.log_std_range = check_log_std_range(self.log_std_range)


class AWAC(OfflineLearner):
    """See the module docstring. Networks: ``actor`` (``GaussianActor``, acts with its mean),
    ``critic`` and ``critic_target`` (``EnsembleQ``)."""

    NAME = "AWAC"
    METRIC_KEYS = ("loss/critic", "train/grad_norm/critic", "train/q", "loss/actor",
                   "train/grad_norm/actor", "train/weight")

    def __init__(self, obs_dim: int, action_low: torch.Tensor, action_high: torch.Tensor,
                 cfg: AWACConfig, device: str | torch.device = "cpu",
                 seed: int | None = None) -> None:
        super().__init__(obs_dim, action_low, action_high, cfg, device, seed)
        dev, a = self.device, self.act_dim
        self.actor = GaussianActor(obs_dim, a, cfg.hidden, cfg.activation, cfg.log_std_range,
                                   cfg.sigmoid_log_std).to(dev)
        self.critic = EnsembleQ(obs_dim, a, cfg.hidden, cfg.num_critics, cfg.activation).to(dev)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = adam(self.actor.parameters(), cfg.actor_lr)
        self.critic_opt = adam(self.critic.parameters(), cfg.critic_lr)
        self.actor_step = self.step("actor", self.actor_opt)
        self.critic_step = self.step("critic", self.critic_opt)
        self.modules.update(actor=self.actor, critic=self.critic, critic_target=self.critic_target)
        self.optimizers.update(actor=self.actor_opt, critic=self.critic_opt)

    def _next_value(self, next_obs: torch.Tensor) -> torch.Tensor:
        """The bootstrap value at s' ([B]) of ``cfg.backup``; called without gradients."""
        if self.cfg.backup == "squashed_entropy":
            mu = self.actor.net(next_obs)
            log_std = self.actor.current_log_std().expand_as(mu)
            noise = torch.randn(mu.shape, device=mu.device, dtype=mu.dtype,
                                generator=self.generator)
            u = mu + log_std.exp() * noise
            next_q = self.critic_target(next_obs, torch.tanh(u)).min(0).values
            return next_q - squashed_log_prob(noise, log_std, u)
        next_action = self.actor.sample(next_obs, self.generator)
        return self.critic_target(next_obs, next_action).min(0).values

    def _update_once(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        cfg, obs, action = self.cfg, batch["obs"], batch["action"]
        with torch.no_grad():
            target = td_target(batch["reward"], batch["terminated"],
                               self._next_value(batch["next_obs"]), cfg.gamma)
        loss, metrics = ensemble_mse(self.critic(obs, action), target)
        metrics[self.critic_step.metric] = self.critic_step(loss, check=False)
        with torch.no_grad():  # one sampled action estimates V(s) (as CORL)
            pi_action = self.actor.sample(obs, self.generator)
            advantage = (self.critic(obs, action).min(0).values
                         - self.critic(obs, pi_action).min(0).values)
        log_prob = self.actor.log_prob(obs, action)
        if cfg.advantage_weights == "batch_softmax":
            a_loss, a_metrics = softmax_weighted_loss(log_prob, advantage, cfg.temperature)
        else:
            a_loss, a_metrics = advantage_weighted_loss(log_prob, advantage, cfg.temperature,
                                                        cfg.max_weight)
        a_metrics[self.actor_step.metric] = self.actor_step(a_loss, check=False)
        metrics.update(a_metrics)
        polyak(self.critic_target, self.critic, cfg.tau)
        return metrics
