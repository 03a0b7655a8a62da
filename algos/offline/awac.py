"""AWAC (Nair et al. 2020, "Accelerating Online RL with Offline Datasets"), offline.

A critic learned by TD on the policy's own next actions, and a policy fitted by advantage-
weighted regression: weights exp((Q(s, a) - Q(s, a~pi)) / lambda) on the data's actions.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from robotrl.algos.offline.base import GaussianActor, OfflineConfig, OfflineLearner, polyak
from robotrl.algos.offline.losses import advantage_weighted_loss, ensemble_mse, td_target
from robotrl.algos.optim import adam
from robotrl.nn.ensemble import EnsembleQ


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

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.temperature <= 0 or self.max_weight <= 0:
            raise ValueError("temperature and max_weight must be > 0")


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
        self.actor = GaussianActor(obs_dim, a, cfg.hidden, cfg.activation).to(dev)
        self.critic = EnsembleQ(obs_dim, a, cfg.hidden, cfg.num_critics, cfg.activation).to(dev)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = adam(self.actor.parameters(), cfg.actor_lr)
        self.critic_opt = adam(self.critic.parameters(), cfg.critic_lr)
        self.actor_step = self.step("actor", self.actor_opt)
        self.critic_step = self.step("critic", self.critic_opt)
        self.modules.update(actor=self.actor, critic=self.critic, critic_target=self.critic_target)
        self.optimizers.update(actor=self.actor_opt, critic=self.critic_opt)

    def _update_once(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        cfg, obs, action = self.cfg, batch["obs"], batch["action"]
        with torch.no_grad():
            next_action = self.actor.sample(batch["next_obs"], self.generator)
            next_q = self.critic_target(batch["next_obs"], next_action).min(0).values
            target = td_target(batch["reward"], batch["terminated"], next_q, cfg.gamma)
        loss, metrics = ensemble_mse(self.critic(obs, action), target)
        metrics[self.critic_step.metric] = self.critic_step(loss, check=False)
        with torch.no_grad():  # one sampled action estimates V(s) (as CORL)
            pi_action = self.actor.sample(obs, self.generator)
            advantage = (self.critic(obs, action).min(0).values
                         - self.critic(obs, pi_action).min(0).values)
        a_loss, a_metrics = advantage_weighted_loss(self.actor.log_prob(obs, action), advantage,
                                                    cfg.temperature, cfg.max_weight)
        a_metrics[self.actor_step.metric] = self.actor_step(a_loss, check=False)
        metrics.update(a_metrics)
        polyak(self.critic_target, self.critic, cfg.tau)
        return metrics
