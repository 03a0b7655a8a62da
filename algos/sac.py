"""Soft Actor-Critic (Haarnoja et al. 2018, "SAC: Off-Policy Maximum Entropy Deep RL with a
Stochastic Actor"; automatic temperature from "SAC Algorithms and Applications", 2018).

Tanh-squashed Gaussian actor, twin Q critics evaluated as one ensemble (one batched matmul per
layer), Polyak-averaged targets, learned temperature with target entropy -|A|. The off-policy
runner drives it with many worlds per update:

    action = sac.act(obs)                          # under torch.inference_mode(); random
    out = env.step(action)                         # until learning_starts transitions
    sac.process_env_step(out.reward, out.terminated, out.truncated, out.info["final_obs"])
    metrics = sac.update(progress)                 # utd_ratio updates per stored transition
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from robotrl.algos.off_policy_base import OffPolicyConfig, OffPolicyLearner
from robotrl.nn.actor import DeterministicActor, FirstColumns
from robotrl.nn.ensemble import EnsembleQ
from robotrl.nn.squashed_gaussian import SquashedGaussianActor
from robotrl.optim import GradientStep, adam
from robotrl.types import Obs, policy_obs


@dataclass
class SACConfig(OffPolicyConfig):
    """SAC hyperparameters: the off-policy fields (``OffPolicyConfig``) plus the temperature;
    defaults tuned for MuJoCo locomotion on a 2-core CPU.

    Per-task overrides live in ``configs/tuned/sac_<task>.yaml`` (see benchmarks/README.md).
    """

    alpha_lr: float = 3e-4
    """Adam learning rate of log(alpha)."""
    init_alpha: float = 1.0
    """Initial entropy temperature."""
    autotune_alpha: bool = True
    """Learn alpha to hold the policy entropy at ``target_entropy`` (else alpha is fixed)."""
    target_entropy: float | None = None
    """Entropy target of the temperature loss; None: -action_dim (Haarnoja et al. 2018b)."""
    squash_epsilon: float = 0.0
    """log pi's tanh correction: 0 the exact log(1 - tanh(u)^2); > 0 log(1 - tanh(u)^2 + eps)
    (Stable-Baselines3: 1e-6; the reference-equivalence test sets it)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.init_alpha <= 0:
            raise ValueError(f"init_alpha must be > 0, got {self.init_alpha}")
        if self.squash_epsilon < 0:
            raise ValueError(f"squash_epsilon must be >= 0, got {self.squash_epsilon}")


# ---------------------------------------------------------------------------- pure losses
def soft_td_target(
    reward: torch.Tensor,
    terminated: torch.Tensor,
    next_q: torch.Tensor,
    next_log_prob: torch.Tensor,
    alpha: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """r + gamma (1 - terminated) (min_e Q'_e(s', a') - alpha log pi(a'|s')): [B].

    Args:
        reward: [B]; terminated: [B] bool (truncated rows bootstrap: their s' is the final
            observation of the cut episode).
        next_q: [E, B] target critics at (s', a'), a' ~ pi(s').
        next_log_prob: [B] log pi(a'|s').
        alpha: [] temperature.
    """
    soft_value = next_q.min(0).values - alpha * next_log_prob
    return reward + gamma * (~terminated) * soft_value


def critic_loss(q: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Soft Bellman residual of every ensemble member (SAC eq. 5).

    Args:
        q: [E, B] Q_e(s, a) of the stored actions.
        target: [B] r + gamma (1 - terminated) (min_e Q'_e(s', a') - alpha log pi(a'|s')).

    Returns:
        ``(loss [], metrics)``: the sum over members of half the mean squared error.
    """
    loss = 0.5 * (q - target).square().mean(-1).sum()
    return loss, {"loss/critic": loss.detach(), "train/q": q.detach().mean()}


def actor_loss(
    log_prob: torch.Tensor, q: torch.Tensor, alpha: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy loss E[alpha log pi(a|s) - min_e Q_e(s, a)], a ~ pi reparameterized (SAC eq. 12).

    Args:
        log_prob: [B] log pi of the sampled actions.
        q: [E, B] critics at the sampled actions (critic parameters frozen).
        alpha: [] temperature (detached).
    """
    loss = (alpha * log_prob - q.min(0).values).mean()
    return loss, {"loss/actor": loss.detach(), "train/entropy": -log_prob.detach().mean()}


def temperature_loss(
    log_alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-log(alpha) E[log pi + target_entropy]: alpha rises while entropy is below the target.

    Parameterized by log(alpha) as most implementations are (the paper writes alpha); the
    gradient sign, and hence the fixed point entropy = target, is the same.
    """
    loss = -(log_alpha * (log_prob.detach() + target_entropy)).mean()
    return loss, {"loss/alpha": loss.detach()}


METRIC_KEYS: tuple[str, ...] = (
    "loss/critic", "train/grad_norm/critic", "train/q", "loss/actor", "train/grad_norm/actor",
    "train/entropy", "loss/alpha", "train/grad_norm/alpha", "train/alpha",
)
"""Per-update metrics, averaged over the updates of one ``update`` call."""


class SAC(OffPolicyLearner):
    """SAC on flat observations; see the module docstring for the call protocol.

    Attributes:
        actor: ``SquashedGaussianActor`` (actions in (-1, 1), mapped affinely to the bounds).
        critic, critic_target: ``EnsembleQ`` of ``num_critics`` members.
        log_alpha: [] learnable log temperature.
        buffer, generator: ``OffPolicyLearner``'s.
    """

    config_class = SACConfig
    name = "SAC"
    metric_keys = METRIC_KEYS
    betas = (0.9, 0.999)
    """Adam's betas for every optimizer."""
    cfg: SACConfig

    def _networks(self, state_dim: int, act_dim: int) -> tuple[SquashedGaussianActor, EnsembleQ]:
        """(actor, critic ensemble) for replay rows of ``state_dim`` and ``act_dim`` actions."""
        cfg = self.cfg
        return (SquashedGaussianActor(self.obs_dim, act_dim, cfg.actor_hidden, cfg.activation,
                                      squash_epsilon=cfg.squash_epsilon),
                EnsembleQ(state_dim, act_dim, cfg.critic_hidden, cfg.num_critics, cfg.activation))

    def _adam(self, params: Any, lr: float) -> torch.optim.Optimizer:
        return adam(params, lr, self.betas)

    def _learning_state(self, act_dim: int) -> None:
        super()._learning_state(act_dim)
        cfg = self.cfg
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=self.device,
                                      requires_grad=True)
        self.target_entropy = (
            -float(act_dim) if cfg.target_entropy is None else float(cfg.target_entropy)
        )
        self.alpha_opt = self._adam([self.log_alpha], cfg.alpha_lr)
        self.alpha_step = GradientStep(self.name, "alpha", self.alpha_opt)

    # ------------------------------------------------------------------ acting
    @torch.no_grad()
    def act(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """Exploration actions [N, A] in the env's bounds for ``obs`` (its ``policy`` group
        [N, obs_dim]); uniform random until ``learning_starts`` transitions are stored."""
        state = self._state(obs)
        if self._warming_up():
            action = self._random_action(state.shape[0])
        else:
            action, _ = self.actor.sample(self._actor_input(state), self.generator)
        return self._record(state, action)

    @torch.no_grad()
    def act_deterministic(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """Mean action tanh(mu(obs)) mapped to the bounds: [N, A]; records nothing."""
        policy = policy_obs(obs).to(self.device, torch.float32)
        return self._to_env(self.actor.deterministic(policy))

    @torch.no_grad()
    def act_sampled(self, obs: Obs | torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """An action drawn from the policy, tanh(mu + sigma * noise) mapped to the bounds, with
        ``generator``: [N, A]; records nothing (a dataset's behaviour policy: D4RL's recipe)."""
        policy = policy_obs(obs).to(self.device, torch.float32)
        return self._to_env(self.actor.sample(policy, generator)[0])

    def export_actor(self) -> DeterministicActor:
        """Frozen copy of ``act_deterministic`` for sim2real export: mean head, tanh, bounds."""
        network = nn.Sequential(self.actor.net, FirstColumns(self.actor.act_dim))
        return DeterministicActor(network, self.obs_dim, self.action_low, self.action_high,
                                  "tanh")

    # ------------------------------------------------------------------ learning
    def _update_once(self) -> dict[str, torch.Tensor]:
        """One critic update (and actor/alpha on schedule); returns its METRIC_KEYS."""
        cfg = self.cfg
        batch = self.buffer.sample(cfg.batch_size, self.generator)
        alpha = self.log_alpha.detach().exp()
        metrics = self._critic_update(batch, alpha)
        self.num_updates += 1
        if self.num_updates % cfg.actor_update_interval == 0:
            metrics.update(self._actor_update(batch, alpha))
        self._polyak()
        metrics["train/alpha"] = alpha
        return metrics

    def _critic_update(self, batch: dict[str, torch.Tensor], alpha: torch.Tensor
                       ) -> dict[str, torch.Tensor]:
        """One step of the critics on ``batch`` towards the target critics' soft TD target."""
        with torch.no_grad():
            next_action, next_log_prob = self.actor.sample(self._actor_input(batch["next_obs"]),
                                                           self.generator)
            next_q = self.critic_target(batch["next_obs"], next_action)
            target = soft_td_target(batch["reward"], batch["terminated"], next_q, next_log_prob,
                                    alpha, self.cfg.gamma)
        q = self.critic(batch["obs"], batch["action"])
        return self._critic_step(q, target)

    def _critic_step(self, q: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        c_loss, metrics = critic_loss(q, target)
        # no host sync per update: update() checks the critic columns once per call
        metrics[self.critic_step.metric] = self.critic_step(c_loss, check=False)
        return metrics

    def _actor_update(self, batch: dict[str, torch.Tensor], alpha: torch.Tensor
                      ) -> dict[str, torch.Tensor]:
        """One step of the actor (and the temperature) on ``batch``'s states."""
        # frozen critic: the actor's backward pass skips the critics' weight gradients
        self.critic.requires_grad_(False)
        action, log_prob = self.actor.sample(self._actor_input(batch["obs"]), self.generator)
        a_loss, metrics = actor_loss(log_prob, self.critic(batch["obs"], action), alpha)
        metrics[self.actor_step.metric] = self.actor_step(a_loss, check=False)
        self.critic.requires_grad_(True)
        if self.cfg.autotune_alpha:
            t_loss, t_metrics = temperature_loss(self.log_alpha, log_prob, self.target_entropy)
            t_metrics[self.alpha_step.metric] = self.alpha_step(t_loss, check=False)
            metrics.update(t_metrics)
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """``OffPolicyLearner``'s state plus the temperature and its optimizer."""
        return {**super().state_dict(),
                "log_alpha": self.log_alpha.detach().clone(),
                "alpha_opt": self.alpha_opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.alpha_opt.load_state_dict(state["alpha_opt"])
