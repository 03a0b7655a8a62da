"""CQL (Kumar et al. 2020, "Conservative Q-Learning for Offline RL"), continuous CQL(H).

SAC whose critic loss adds a conservative term: alpha (logsumexp_a Q(s, a) - Q(s, a_data)),
the log-sum-exp estimated by importance sampling over uniform actions and policy actions at s
and s' (the paper's appendix F). With ``lagrange=true`` the term's weight is tuned so the gap
stays near ``target_action_gap`` (the paper's CQL-Lagrange).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import torch
from torch import nn

from robotrl.algos.offline.base import OfflineConfig, OfflineLearner, check_choice
from robotrl.algos.offline.losses import (
    alpha_temperature_loss,
    cql_penalty,
    ensemble_mse,
)
from robotrl.algos.sac import actor_loss, temperature_loss
from robotrl.nn.actor import DeterministicActor, FirstColumns
from robotrl.nn.ensemble import EnsembleQ
from robotrl.nn.squashed_gaussian import SquashedGaussianActor
from robotrl.nn.target import polyak, td_target
from robotrl.optim import adam


@dataclasses.dataclass
class CQLConfig(OfflineConfig):
    """CQL; defaults are CORL's ``cql.py`` MuJoCo configs."""

    cql_alpha: float = 10.0
    """Weight of the conservative term (the maximum weight with ``lagrange``)."""
    num_actions: int = 10
    """Actions sampled per state from each proposal (uniform, pi(s), pi(s'))."""
    cql_temperature: float = 1.0
    """Temperature of the log-sum-exp."""
    lagrange: bool = False
    """Tune the conservative weight by dual gradient descent towards ``target_action_gap``."""
    target_action_gap: float = 5.0
    """Gap logsumexp Q - Q(data) the Lagrange version holds (used only with ``lagrange``)."""
    actor_lr: float = 3e-5
    """Adam learning rate of the actor and the SAC temperature."""
    hidden: tuple[int, ...] = (256, 256, 256)
    """Hidden widths of actor and critics."""
    num_critics: int = 2
    """Q ensemble size (targets take the minimum)."""
    backup_entropy: bool = False
    """Subtract alpha log pi(a'|s') from the bootstrap value (SAC's soft backup; CORL's
    ``backup_entropy``, off by default there too; d3rlpy's ``soft_q_backup``)."""
    temperature_loss: str = "log_alpha"
    """SAC temperature loss: log_alpha: -log(alpha) (log pi + target entropy) (SAC's reference
    code, CORL); alpha: -alpha (log pi + target entropy) (d3rlpy: the same fixed point, the
    gradient scaled by alpha)."""
    update_order: str = "actor_first"
    """actor_first: the temperature steps, the actor steps with the temperature from before
    that step, then the critics step on the updated actor's samples with the Lagrange weight
    from before its step; critic_first (d3rlpy): the critics step first, with the Lagrange
    weight from after its step, then temperature and actor, the actor with the temperature from
    after its step. Either way the bootstrap's alpha is the one the update started with."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_actions < 1 or self.num_critics < 1:
            raise ValueError("num_actions and num_critics must be >= 1")
        if self.cql_alpha < 0 or self.cql_temperature <= 0:
            raise ValueError("cql_alpha must be >= 0 and cql_temperature > 0")
        check_choice("temperature_loss", self.temperature_loss, ("log_alpha", "alpha"))
        check_choice("update_order", self.update_order, ("actor_first", "critic_first"))


class CQL(OfflineLearner):
    """See the module docstring. Networks: ``actor`` (``SquashedGaussianActor``, acts with
    tanh(mean)), ``critic`` and ``critic_target`` (``EnsembleQ``), ``log_alpha`` (SAC's
    temperature, target entropy -A), ``log_alpha_prime`` (with ``lagrange``)."""

    NAME = "CQL"
    METRIC_KEYS = ("loss/critic", "train/grad_norm/critic", "train/q", "train/cql_gap",
                   "loss/actor", "train/grad_norm/actor", "train/entropy", "train/alpha",
                   "train/cql_weight")

    def __init__(self, obs_dim: int, action_low: torch.Tensor, action_high: torch.Tensor,
                 cfg: CQLConfig, device: str | torch.device = "cpu",
                 seed: int | None = None) -> None:
        super().__init__(obs_dim, action_low, action_high, cfg, device, seed)
        dev, a = self.device, self.act_dim
        self.actor = SquashedGaussianActor(obs_dim, a, cfg.hidden, cfg.activation).to(dev)
        self.critic = EnsembleQ(obs_dim, a, cfg.hidden, cfg.num_critics, cfg.activation).to(dev)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.temperature = _Scalar(0.0).to(dev)  # log alpha
        self.cql_weight = _Scalar(0.0).to(dev)  # log alpha' (Lagrange)
        self.target_entropy = -float(a)
        self.actor_opt = adam(self.actor.parameters(), cfg.actor_lr)
        self.critic_opt = adam(self.critic.parameters(), cfg.critic_lr)
        self.alpha_opt = adam(self.temperature.parameters(), cfg.actor_lr)
        self.weight_opt = adam(self.cql_weight.parameters(), cfg.critic_lr)
        self.actor_step = self.step("actor", self.actor_opt)
        self.critic_step = self.step("critic", self.critic_opt)
        self.alpha_step = self.step("alpha", self.alpha_opt)
        self.weight_step = self.step("cql_weight", self.weight_opt)
        self.modules.update(actor=self.actor, critic=self.critic, critic_target=self.critic_target,
                            temperature=self.temperature, cql_weight=self.cql_weight)
        self.optimizers.update(actor=self.actor_opt, critic=self.critic_opt,
                               alpha=self.alpha_opt, cql_weight=self.weight_opt)

    def eval_actor(self) -> nn.Module:
        return _Deterministic(self.actor)

    def export_actor(self) -> DeterministicActor:
        network = nn.Sequential(self.actor.net, FirstColumns(self.act_dim))
        return DeterministicActor(network, self.obs_dim, self.action_low, self.action_high,
                                  "tanh", self.normalizer if self.cfg.normalize_obs else None)

    def _update_once(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        alpha = self.temperature.value.detach().exp()  # the bootstrap's alpha in both orders
        if self.cfg.update_order == "critic_first":
            metrics = self._update_critic(batch, alpha)
            metrics.update(self._update_actor(batch["obs"]))
        else:
            metrics = self._update_actor(batch["obs"])
            metrics.update(self._update_critic(batch, alpha))
        polyak(self.critic_target, self.critic, self.cfg.tau)
        return metrics

    def _update_actor(self, obs: torch.Tensor) -> dict[str, Any]:
        """SAC's temperature step, then its actor step (critic parameters frozen)."""
        cfg, log_alpha = self.cfg, self.temperature.value
        alpha = log_alpha.detach().exp()
        pi_action, log_prob = self.actor.sample(obs, self.generator)
        temperature = alpha_temperature_loss if cfg.temperature_loss == "alpha" else \
            temperature_loss
        t_loss, metrics = temperature(log_alpha, log_prob, self.target_entropy)
        self.alpha_step(t_loss, check=False)
        if cfg.update_order == "critic_first":
            alpha = log_alpha.detach().exp()
        self.critic.requires_grad_(False)
        p_loss, p_metrics = actor_loss(log_prob, self.critic(obs, pi_action), alpha)
        p_metrics[self.actor_step.metric] = self.actor_step(p_loss, check=False)
        self.critic.requires_grad_(True)
        metrics.update(p_metrics)
        metrics["train/alpha"] = alpha
        return metrics

    def _update_critic(self, batch: dict[str, torch.Tensor],
                       alpha: torch.Tensor) -> dict[str, Any]:
        """TD error plus the conservative term, and the Lagrange weight's step."""
        cfg, obs, action = self.cfg, batch["obs"], batch["action"]
        b, k, a = obs.shape[0], cfg.num_actions, self.act_dim
        with torch.no_grad():
            next_action, next_log_prob = self.actor.sample(batch["next_obs"], self.generator)
            next_q = self.critic_target(batch["next_obs"], next_action).min(0).values
            if cfg.backup_entropy:
                next_q = next_q - alpha * next_log_prob
            target = td_target(batch["reward"], batch["terminated"], next_q, cfg.gamma)
            uniform = torch.rand(b, k, a, device=self.device, dtype=obs.dtype,
                                 generator=self.generator) * 2 - 1
            act_s, logp_s = self.actor.sample(obs, self.generator, k)  # [B, K, A], [B, K]
            act_next, logp_next = self.actor.sample(batch["next_obs"], self.generator, k)
            sampled = torch.cat([uniform, act_next, act_s], 1)  # [B, 3K, A]
            log_density = torch.cat([torch.full((b, k), a * math.log(0.5), device=self.device,
                                                dtype=obs.dtype), logp_next, logp_s], 1)
        q_data = self.critic(obs, action)
        q_sampled = self.critic.sampled(obs, sampled)  # [E, B, 3K]
        mse, metrics = ensemble_mse(q_data, target)
        gap, gap_metrics = cql_penalty(q_sampled, log_density, q_data,
                                       cfg.cql_temperature)
        if cfg.lagrange:
            weight = self.cql_weight.value.exp().clamp(0.0, 1e6) * cfg.cql_alpha
            e = cfg.num_critics
            w_loss = -(weight * (gap.detach() - e * cfg.target_action_gap)) / e
            self.weight_step(w_loss, check=False)
            if cfg.update_order == "critic_first":
                weight = self.cql_weight.value.exp().clamp(0.0, 1e6) * cfg.cql_alpha
            weight = weight.detach()
        else:
            weight = torch.tensor(cfg.cql_alpha, device=self.device)
        loss = mse + weight * gap
        metrics[self.critic_step.metric] = self.critic_step(loss, check=False)
        metrics["loss/critic"] = loss.detach()
        metrics.update(gap_metrics)
        metrics["train/cql_weight"] = weight
        return metrics


class _Scalar(nn.Module):
    """One learnable scalar (a log temperature) as a module, so checkpoints carry it."""

    def __init__(self, init: float) -> None:
        super().__init__()
        self.value = nn.Parameter(torch.tensor(float(init)))


class _Deterministic(nn.Module):
    """tanh(mean) of a ``SquashedGaussianActor``."""

    def __init__(self, actor: SquashedGaussianActor) -> None:
        super().__init__()
        self.actor = actor

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.deterministic(obs)
