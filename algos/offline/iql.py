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

from robotrl.algos.offline.base import (
    GaussianActor,
    OfflineConfig,
    OfflineLearner,
    check_log_std_range,
)
from robotrl.algos.offline.losses import (
    advantage_weighted_loss,
    ensemble_mse,
    expectile_loss,
)
from robotrl.data.dataset import Dataset
from robotrl.nn.ensemble import EnsembleQ
from robotrl.nn.mlp import mlp
from robotrl.nn.target import polyak, td_target
from robotrl.optim import adam


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
    q_on_updated_value: bool = True
    """Q bootstraps from V after this update's V step (Kostrikov et al.'s code); False: from V
    before it (CORL, d3rlpy)."""
    actor_on_updated_value: bool = True
    """The actor's advantages Q - V use V after this update's V step (Kostrikov et al.'s code,
    d3rlpy); False: V before it (CORL). With ``q_on_updated_value`` the default is the
    authors' order (V, then actor and Q from the new V); before issue 43 it was False, a mix
    of the authors' and CORL's orders that matched neither."""
    log_std_range: tuple[float, float] = (-5.0, 2.0)
    """Bounds of the policy's state-independent log std."""
    sigmoid_log_std: bool = False
    """Map the log-std parameter into ``log_std_range`` by a sigmoid (d3rlpy) instead of
    clamping it (IQL's reference code, CORL); see ``GaussianActor``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.expectile < 1.0:
            raise ValueError(f"expectile must be in (0, 1), got {self.expectile}")
        if self.temperature <= 0 or self.max_weight <= 0:
            raise ValueError("temperature and max_weight must be > 0")
        self.log_std_range = check_log_std_range(self.log_std_range)


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
        self.actor = GaussianActor(obs_dim, a, cfg.hidden, cfg.activation, cfg.log_std_range,
                                   cfg.sigmoid_log_std).to(dev)
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
        self.set_actor_lr(progress)
        return super().update(progress)

    def set_actor_lr(self, progress: float) -> None:
        """The actor's cosine-annealed rate at ``progress`` (with ``actor_cosine``): a function
        of progress, so resume needs no scheduler state."""
        if self.cfg.actor_cosine:
            lr = self.cfg.actor_lr * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
            for group in self.actor_opt.param_groups:
                group["lr"] = lr

    def _update_once(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        cfg, obs, action = self.cfg, batch["obs"], batch["action"]
        with torch.no_grad():
            q_target = self.critic_target(obs, action).min(0).values
        v = self.value(obs).squeeze(-1)
        v_loss, metrics = expectile_loss(q_target - v, cfg.expectile)
        if not cfg.q_on_updated_value:
            metrics.update(self._update_critic(batch))
        metrics[self.value_step.metric] = self.value_step(v_loss, check=False)
        if cfg.actor_on_updated_value:
            with torch.no_grad():
                v = self.value(obs).squeeze(-1)
        metrics.update(self._update_actor(obs, action, q_target - v.detach()))
        if cfg.q_on_updated_value:
            metrics.update(self._update_critic(batch))
        polyak(self.critic_target, self.critic, cfg.tau)
        return metrics

    def _update_actor(self, obs: torch.Tensor, action: torch.Tensor,
                      advantage: torch.Tensor) -> dict[str, Any]:
        """Advantage-weighted regression on the data's actions; ``advantage`` [B] detached."""
        loss, metrics = advantage_weighted_loss(self.actor.log_prob(obs, action), advantage,
                                                self.cfg.temperature, self.cfg.max_weight)
        metrics[self.actor_step.metric] = self.actor_step(loss, check=False)
        return metrics

    def _update_critic(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Q towards r + gamma V(s') with the value function as it is now."""
        with torch.no_grad():
            next_v = self.value(batch["next_obs"]).squeeze(-1)
            target = td_target(batch["reward"], batch["terminated"], next_v, self.cfg.gamma)
        loss, metrics = ensemble_mse(self.critic(batch["obs"], batch["action"]), target)
        metrics[self.critic_step.metric] = self.critic_step(loss, check=False)
        return metrics
