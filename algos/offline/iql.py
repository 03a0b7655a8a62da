"""IQL (Kostrikov et al. 2022, "Offline Reinforcement Learning with Implicit Q-Learning").

Never queries Q at actions outside the dataset: V(s) is fitted to an upper expectile of
Q(s, a) over the data, Q to r + gamma V(s'), and the policy by advantage-weighted regression on
the data's actions.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import torch

from robotrl.algos.offline.base import GaussianActor, OfflineConfig, OfflineLearner, polyak
from robotrl.algos.offline.losses import (
    advantage_weighted_loss,
    ensemble_mse,
    expectile_loss,
    td_target,
)
from robotrl.algos.optim import adam
from robotrl.data.dataset import Dataset
from robotrl.nn.ensemble import EnsembleQ
from robotrl.nn.mlp import mlp


@dataclasses.dataclass
class IQLConfig(OfflineConfig):
    """IQL; defaults are the paper's MuJoCo settings (its appendix B), as in CORL's ``iql.py``."""

    expectile: float = 0.7
    """tau of the expectile regression of V (0.5: the mean; towards 1: the max)."""
    temperature: float = 1.0 / 3.0
    """Advantage temperature of the policy weights exp(adv / temperature) (the paper's
    beta = 3)."""
    max_weight: float = 100.0
    """Clip of the exponentiated advantages."""
    num_critics: int = 2
    """Q ensemble size (V's target takes the minimum)."""
    actor_cosine: bool = True
    """Anneal the actor's learning rate to 0 with a cosine over training."""
    normalize_reward: bool = True
    """Scale rewards by 1000 / (max - min episode return) of the dataset (IQL's locomotion
    setting)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.expectile < 1.0:
            raise ValueError(f"expectile must be in (0, 1), got {self.expectile}")
        if self.temperature <= 0 or self.max_weight <= 0:
            raise ValueError("temperature and max_weight must be > 0")


def return_range_scale(data: Dataset) -> float:
    """1000 / (max - min episode return): IQL's and CORL's reward scale for locomotion."""
    returns = data.episode_returns()
    spread = float(returns.max() - returns.min())
    return 1000.0 / spread if spread > 0 else 1.0


class IQL(OfflineLearner):
    """See the module docstring. Networks: ``value`` (MLP), ``critic`` and ``critic_target``
    (``EnsembleQ``), ``actor`` (``GaussianActor``; acts with its mean)."""

    NAME = "IQL"
    METRIC_KEYS = ("loss/critic", "train/grad_norm/critic", "train/q", "loss/value",
                   "train/grad_norm/value", "train/v_gap", "loss/actor", "train/grad_norm/actor",
                   "train/weight")

    def __init__(self, obs_dim: int, action_low: torch.Tensor, action_high: torch.Tensor,
                 cfg: IQLConfig, device: str | torch.device = "cpu",
                 seed: int | None = None) -> None:
        super().__init__(obs_dim, action_low, action_high, cfg, device, seed)
        dev, a = self.device, self.act_dim
        self.actor = GaussianActor(obs_dim, a, cfg.hidden, cfg.activation).to(dev)
        self.value = mlp(obs_dim, cfg.hidden, 1, cfg.activation, ortho_init=False).to(dev)
        self.critic = EnsembleQ(obs_dim, a, cfg.hidden, cfg.num_critics, cfg.activation).to(dev)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = adam(self.actor.parameters(), cfg.actor_lr)
        self.value_opt = adam(self.value.parameters(), cfg.critic_lr)
        self.critic_opt = adam(self.critic.parameters(), cfg.critic_lr)
        self.actor_step = self.step("actor", self.actor_opt)
        self.value_step = self.step("value", self.value_opt)
        self.critic_step = self.step("critic", self.critic_opt)
        self.modules.update(actor=self.actor, value=self.value, critic=self.critic,
                            critic_target=self.critic_target)
        self.optimizers.update(actor=self.actor_opt, value=self.value_opt, critic=self.critic_opt)

    def reward_transform(self, data: Dataset) -> tuple[float, float]:
        return (return_range_scale(data), 0.0) if self.cfg.normalize_reward else (1.0, 0.0)

    def update(self, progress: float = 0.0) -> dict[str, float]:
        if self.cfg.actor_cosine:  # a function of progress: resume needs no scheduler state
            lr = self.cfg.actor_lr * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
            for group in self.actor_opt.param_groups:
                group["lr"] = lr
        return super().update(progress)

    def _update_once(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        cfg, obs, action = self.cfg, batch["obs"], batch["action"]
        with torch.no_grad():
            q_target = self.critic_target(obs, action).min(0).values
        v = self.value(obs).squeeze(-1)
        v_loss, metrics = expectile_loss(q_target - v, cfg.expectile)
        metrics[self.value_step.metric] = self.value_step(v_loss, check=False)

        a_loss, a_metrics = advantage_weighted_loss(self.actor.log_prob(obs, action),
                                                    q_target - v.detach(), cfg.temperature,
                                                    cfg.max_weight)
        a_metrics[self.actor_step.metric] = self.actor_step(a_loss, check=False)
        metrics.update(a_metrics)

        with torch.no_grad():
            next_v = self.value(batch["next_obs"]).squeeze(-1)
            target = td_target(batch["reward"], batch["terminated"], next_v, cfg.gamma)
        q_loss, q_metrics = ensemble_mse(self.critic(obs, action), target)
        q_metrics[self.critic_step.metric] = self.critic_step(q_loss, check=False)
        metrics.update(q_metrics)
        polyak(self.critic_target, self.critic, cfg.tau)
        return metrics
