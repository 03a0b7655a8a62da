"""TD3+BC (Fujimoto & Gu 2021, "A Minimalist Approach to Offline Reinforcement Learning").

TD3 (twin critics, target policy smoothing, delayed actor and target updates) whose actor loss
adds a behaviour-cloning term: -lambda Q(s, pi(s)) + (pi(s) - a)^2, lambda = alpha / mean|Q|.
ReBRAC (``rebrac.py``) and the MCEP variant (``mcep.py``) reuse this class and override the
actor objective and the bootstrap value.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from robotrl.algos.offline.base import OfflineConfig, OfflineLearner, TanhActor
from robotrl.algos.offline.losses import ensemble_mse, td3bc_actor_loss
from robotrl.nn.ensemble import EnsembleQ
from robotrl.nn.target import polyak, td_target
from robotrl.optim import adam


@dataclasses.dataclass
class TD3BCConfig(OfflineConfig):
    """TD3+BC; defaults are the paper's (its Table 4), as in CORL's ``td3_bc.py``."""

    alpha: float = 2.5
    """Weight of the Q term against BC: lambda = alpha / mean|Q| (larger: less cloning)."""
    policy_noise: float = 0.2
    """Std of the target policy smoothing noise (actions in [-1, 1])."""
    noise_clip: float = 0.5
    """Clip of the smoothing noise."""
    policy_freq: int = 2
    """Critic updates per actor and target update."""
    num_critics: int = 2
    """Critic ensemble size (clipped double Q: targets take the minimum)."""
    actor_on_first_update: bool = False
    """Update the actor and the targets on updates 0, p, 2p, ... (p = ``policy_freq``; ReBRAC's
    and d3rlpy's loops) instead of p-1, 2p-1, ... (TD3's and Fujimoto's TD3+BC)."""
    lagged_actor_target: bool = False
    """Move the target actor toward the actor as it was before this update's actor step
    (ReBRAC's authors' ``update_actor`` passes the old ``actor.params`` to
    ``incremental_update``); False: toward the updated actor, as TD3 and the critic target."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.policy_freq < 1 or self.num_critics < 1:
            raise ValueError(f"policy_freq and num_critics must be >= 1, got "
                             f"{self.policy_freq}, {self.num_critics}")
        if self.alpha <= 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha}")


class TD3BC(OfflineLearner):
    """See the module docstring. Networks: ``actor`` and ``actor_target`` (``TanhActor``),
    ``critic`` and ``critic_target`` (``EnsembleQ``)."""

    NAME = "TD3+BC"
    METRIC_KEYS = ("loss/critic", "train/grad_norm/critic", "train/q", "loss/actor",
                   "train/grad_norm/actor", "train/bc_mse", "train/lambda")
    CRITIC_LAYER_NORM = False

    def __init__(self, obs_dim: int, action_low: torch.Tensor, action_high: torch.Tensor,
                 cfg: TD3BCConfig, device: str | torch.device = "cpu",
                 seed: int | None = None) -> None:
        super().__init__(obs_dim, action_low, action_high, cfg, device, seed)
        dev, a = self.device, self.act_dim
        self.actor = TanhActor(obs_dim, a, cfg.hidden, cfg.activation).to(dev)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic = EnsembleQ(obs_dim, a, cfg.hidden, cfg.num_critics, cfg.activation,
                                self.CRITIC_LAYER_NORM).to(dev)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = adam(self.actor.parameters(), cfg.actor_lr)
        self.critic_opt = adam(self.critic.parameters(), cfg.critic_lr)
        self.actor_step = self.step("actor", self.actor_opt)
        self.critic_step = self.step("critic", self.critic_opt)
        self.modules.update(actor=self.actor, actor_target=self.actor_target,
                            critic=self.critic, critic_target=self.critic_target)
        self.optimizers.update(actor=self.actor_opt, critic=self.critic_opt)

    def _next_value(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """min_e Q'_e(s', a') with a' = pi'(s') + clipped noise: [B]."""
        next_action = self._smoothed_next_action(batch["next_obs"])
        return self.critic_target(batch["next_obs"], next_action).min(0).values

    def _smoothed_next_action(self, next_obs: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        mean = self.actor_target(next_obs)
        noise = torch.randn(mean.shape, device=self.device, dtype=mean.dtype,
                            generator=self.generator)
        noise = (noise * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
        return (mean + noise).clamp(-1.0, 1.0)

    def _actor_loss(self, actor: torch.nn.Module, batch: dict[str, torch.Tensor],
                    alpha: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The policy loss of ``actor`` with Q-weight ``alpha`` (MCEP trains a second actor)."""
        action = actor(batch["obs"])
        q = self.critic.member(batch["obs"], action, 0)
        return td3bc_actor_loss(q, action, batch["action"], alpha)

    def _update_actor(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        loss, metrics = self._actor_loss(self.actor, batch, self.cfg.alpha)
        metrics[self.actor_step.metric] = self.actor_step(loss, check=False)
        return metrics

    def _update_once(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        cfg = self.cfg
        with torch.no_grad():
            target = td_target(batch["reward"], batch["terminated"], self._next_value(batch),
                               cfg.gamma)
        loss, metrics = ensemble_mse(self.critic(batch["obs"], batch["action"]), target)
        metrics[self.critic_step.metric] = self.critic_step(loss, check=False)
        phase = 0 if cfg.actor_on_first_update else cfg.policy_freq - 1
        if self.num_updates % cfg.policy_freq == phase:
            if cfg.lagged_actor_target:  # the target's step reads the actor before its step
                polyak(self.actor_target, self.actor, cfg.tau)
            self.critic.requires_grad_(False)  # the actor's backward skips critic weights
            metrics.update(self._update_actor(batch))
            self.critic.requires_grad_(True)
            if not cfg.lagged_actor_target:
                polyak(self.actor_target, self.actor, cfg.tau)
            polyak(self.critic_target, self.critic, cfg.tau)
        return metrics
