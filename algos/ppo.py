"""Proximal Policy Optimization (Schulman et al. 2017) on batched environments.

PPO = GAE (``advantages.gae``) + the clipped surrogate and value losses of ``pg_core`` + an
entropy bonus, optimized with Adam over minibatch epochs. The on-policy runner drives it:

    action = ppo.act(obs)                          # under torch.inference_mode()
    out = env.step(action)
    ppo.process_env_step(out.reward, out.terminated, out.truncated, out.info["final_obs"])
    ...                                            # rollout_steps times
    ppo.compute_returns(out.obs)
    metrics = ppo.update(progress)                 # outside inference mode
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributions import Normal

from robotrl.algos.on_policy_base import GaussianOnPolicy
from robotrl.algos.pg_core import gaussian_kl
from robotrl.nn.mlp import ACTIVATIONS
from robotrl.nn.policy import GaussianActorCritic
from robotrl.optim import FlatParameters, GradientStep, NonFiniteError, adam
from robotrl.types import check_groups

MIN_ADAPTIVE_LR = 1e-5
"""Floor of the KL-adaptive learning rate."""
MAX_ADAPTIVE_LR = 1e-2
"""Ceiling of the KL-adaptive learning rate."""


@dataclass
class PPOConfig:
    """PPO hyperparameters; defaults tuned for MuJoCo locomotion on CPU with 128 worlds.

    Per-task overrides live in ``configs/tuned/ppo_<task>.yaml`` (see benchmarks/README.md).
    """

    rollout_steps: int = 16
    """Rollout length per environment per update (batch = rollout_steps * num_envs)."""
    num_epochs: int = 10
    """Passes over each rollout."""
    num_minibatches: int = 4
    """Minibatches per pass (minibatch = rollout_steps * num_envs / num_minibatches)."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda (Schulman et al. 2016)."""
    clip_low: float = 0.2
    """Lower clip width of the probability ratio (ratio >= 1 - clip_low)."""
    clip_high: float = 0.2
    """Upper clip width of the probability ratio (ratio <= 1 + clip_high)."""
    value_clip: float = 0.0
    """Clip width of the value prediction around its rollout value; 0 disables."""
    value_coef: float = 1.0
    """Weight of the value loss (half squared error) in the total loss."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (entropy summed over action dimensions)."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip; 0 disables clipping (the norm is still reported)."""
    learning_rate: float = 3e-4
    """Adam learning rate (initial value for the adaptive and linear schedules)."""
    lr_schedule: str = "adaptive"
    """"fixed", "adaptive" (KL-adaptive, as RSL-RL) or "linear" (anneal to 0 over training)."""
    desired_kl: float = 0.01
    """Target KL(old || new) of the adaptive schedule (k3 estimate on each minibatch)."""
    actor_hidden: tuple[int, ...] = (64, 64)
    """Hidden widths of the policy network (of the trunk with shared_backbone)."""
    critic_hidden: tuple[int, ...] = (128, 128)
    """Hidden widths of the value network (unused with shared_backbone)."""
    activation: str = "relu"
    """Hidden activation: relu, tanh, elu, silu or gelu."""
    shared_backbone: bool = False
    """One trunk for policy and value, with two linear heads."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy."""
    min_action_std: float = 0.0
    """Floor of the policy's std as a fraction of each action dimension's half-range
    ``(high - low) / 2``; 0: only the numeric floor exp(-5). Off for PPO: on InvertedPendulum its
    std shrank more slowly than TRPO's (0.010-0.030 at 2M steps, seeds 0-2, all at 1000), and
    where PPO did collapse (seed 9: 198 at the end) the floor did not prevent it (57);
    TRPO needs it (TRPOConfig.min_action_std)."""
    state_dependent_std: bool = False
    """Predict the log std from the observation instead of a free parameter per dimension."""
    normalize_obs: bool = True
    """Normalize observations by running mean and variance (updated while acting)."""
    normalize_advantages: bool = True
    """Standardize advantages over each rollout before the epochs."""
    normalize_advantages_per_minibatch: bool = False
    """With ``normalize_advantages``, standardize within each minibatch instead (SB3's PPO;
    RSL-RL's ``normalize_advantage_per_mini_batch``); a minibatch of one is left as it is.
    Needs ``normalize_advantages`` (refused without it)."""
    kl_estimator: str = "k3"
    """KL(old || new) behind ``train/kl`` and the adaptive lr: "k3" (Schulman's estimator on the
    rollout's actions, from the stored log-probabilities) or "gaussian" (the closed form between
    the diagonal Gaussians of the update's start and of now, RSL-RL's)."""
    clip_grad_per_network: bool = False
    """Clip the actor's and the critic's gradient norms separately, each to ``max_grad_norm``
    (RSL-RL), instead of their joint norm; needs separate networks (no shared_backbone)."""
    clipfrac_outside_range: bool = False
    """``train/clipfrac`` counts ratios outside the clip range (SB3's ``clip_fraction``) instead
    of samples whose clipped term is the smaller (their surrogate gradient is zero)."""
    adam_eps: float = 1e-5
    """Adam's epsilon: 1e-5 as in the PPO reference implementation (Andrychowicz et al. 2021,
    C.8) and SB3; RSL-RL keeps torch's 1e-8."""
    reward_scaling: bool = True
    """Divide rewards by the running std of the discounted return, clip to +-10 (Engstrom et al. 2020)."""
    critic_obs: tuple[str, ...] = ("policy",)
    """Observation groups the critic sees, concatenated in order; ``[policy, privileged]`` makes
    an asymmetric actor-critic (the actor, and so the export, sees ``policy`` only)."""

    def __post_init__(self) -> None:
        self.actor_hidden = tuple(int(w) for w in self.actor_hidden)
        self.critic_hidden = tuple(int(w) for w in self.critic_hidden)
        self.critic_obs = check_groups(self.critic_obs, "critic_obs")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"unknown kl_estimator {self.kl_estimator!r}; known: {', '.join(KL_ESTIMATORS)}"
            )
        if self.adam_eps <= 0:
            raise ValueError(f"adam_eps must be > 0, got {self.adam_eps}")
        if self.normalize_advantages_per_minibatch and not self.normalize_advantages:
            raise ValueError("normalize_advantages_per_minibatch needs normalize_advantages")
        if self.clip_grad_per_network and self.shared_backbone:
            raise ValueError("clip_grad_per_network needs separate networks: a shared backbone "
                             "belongs to both")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(
                f"unknown lr_schedule {self.lr_schedule!r}; known: {', '.join(LR_SCHEDULES)}"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {self.activation!r}; known: {', '.join(ACTIVATIONS)}"
            )
        for name in ("rollout_steps", "num_epochs", "num_minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.min_action_std < 1:
            raise ValueError(f"min_action_std must be in [0, 1), got {self.min_action_std}")
        if self.value_clip < 0 or self.max_grad_norm < 0:
            raise ValueError("value_clip and max_grad_norm must be >= 0 (0 disables)")


KL_ESTIMATORS: tuple[str, ...] = ("k3", "gaussian")
"""Values of ``PPOConfig.kl_estimator``."""

LR_SCHEDULES: dict[str, Callable[[float, float, PPOConfig], float]] = {
    "fixed": lambda lr, progress, cfg: cfg.learning_rate,
    "linear": lambda lr, progress, cfg: cfg.learning_rate * max(0.0, 1.0 - progress),
    # moved by adaptive_lr after every minibatch; carried over between updates
    "adaptive": lambda lr, progress, cfg: lr,
}
"""Learning rate at the start of an update: f(current lr, progress in [0, 1], cfg) -> lr."""


def adaptive_lr(lr: float, kl: float, desired_kl: float) -> float:
    """RSL-RL's KL-adaptive rule (Rudin et al. 2022): /1.5 above 2x target, x1.5 below 1/2.

    ``update`` applies it before every optimizer step, with the k3 estimate of KL(old || new)
    on that minibatch (RSL-RL uses the closed-form Gaussian KL; both estimate the same thing).
    """
    if kl > 2.0 * desired_kl:
        return max(MIN_ADAPTIVE_LR, lr / 1.5)
    if KL_ROUNDING < kl < 0.5 * desired_kl:
        return min(MAX_ADAPTIVE_LR, lr * 1.5)
    return lr


KL_ROUNDING = 1e-12
"""A KL at or below this is rounding, not a policy change: ``adaptive_lr`` leaves the rate as it
is (RSL-RL's rule tests ``kl > 0`` for the unchanged policy of an update's first minibatch; in
float64 that minibatch can read 2.5e-32 instead of 0, in float32 ~1e-15, from the rows' products
rounding differently in acting and in the update, which raised the rate by 1.5 by accident)."""


_HALF_LOG_2PI = math.log(math.sqrt(2 * math.pi))  # as torch.distributions.Normal computes it

LOSS_METRIC_KEYS: tuple[str, ...] = (
    "loss/policy",
    "loss/value",
    "loss/entropy",
    "loss/total",
    "train/kl",
    "train/clipfrac",
    "train/entropy",
    "train/action_std",
)
"""The metrics ``ppo_loss`` returns, in order; ``update`` adds train/grad_norm/policy, train/lr
and train/explained_variance."""
_KL = LOSS_METRIC_KEYS.index("train/kl")


class _PPOHead(torch.autograd.Function):
    """PPO's loss from the policy's raw outputs, with its gradient written out by hand.

    The composed version (``Normal.log_prob`` and ``entropy``, then ``pg_core.policy_loss`` and
    ``value_loss``) records ~40 autograd nodes per minibatch; on CPU, with PPO's small networks,
    their bookkeeping costs about as much as the matmuls. Here the forward computes the loss, the
    metrics and the gradients of the loss with respect to ``mean``, ``log_std`` and ``value``
    in one pass without recording, and the backward scales them. tests/algos/test_ppo.py checks loss,
    metrics and gradients against the composition of ``pg_core``'s functions.

    Per sample, with z = (a - mean) / std: d log_prob / d mean = z / std and
    d log_prob / d log_std = z^2 - 1; the clipped surrogate's gradient with respect to
    log_prob is -ratio * A where the unclipped branch is the minimum (where both are equal,
    torch.minimum splits the gradient, and the halves add up to the same), 0 where clipped.
    """

    @staticmethod
    def forward(ctx: Any, mean: torch.Tensor, log_std: torch.Tensor, value: torch.Tensor,
                batch: dict[str, torch.Tensor], cfg: PPOConfig
                ) -> tuple[torch.Tensor, torch.Tensor]:
        b, dims = mean.shape
        # the log-probability exactly as acting computed it (Normal.log_prob's operations), so
        # an update's first minibatch has log ratio 0 bit for bit where the products round
        # alike: the adaptive lr's rule (x1.5 where 0 < KL < desired / 2, as RSL-RL's) must
        # read KL = 0 there, not 1e-13 (KL_ROUNDING covers the rows that round apart)
        std = torch.exp(log_std)
        diff = batch["action"] - mean
        log_prob = (-(diff**2) / (2 * std**2) - std.log() - _HALF_LOG_2PI).sum(-1)
        inv_std = std.reciprocal()
        z = diff * inv_std
        log_std_sum = log_std.sum(-1)  # [] for a free log std, [B] for a state-dependent one
        log_ratio = log_prob - batch["log_prob"]
        ratio = torch.exp(log_ratio)
        advantages = batch["advantages"]
        unclipped = ratio * advantages
        clipped = torch.clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * advantages
        is_clipped = clipped < unclipped
        if cfg.clipfrac_outside_range:  # SB3's |ratio - 1| > clip, per side
            moved_ratio = ratio - 1.0
            counted = (moved_ratio > cfg.clip_high) | (-moved_ratio > cfg.clip_low)
        else:
            counted = is_clipped
        pg_loss = -torch.minimum(unclipped, clipped).mean()
        grad_log_prob = unclipped.masked_fill(is_clipped, 0.0).mul_(-1.0 / b)[:, None]
        grad_mean = grad_log_prob * z
        grad_log_std = grad_mean * z - grad_log_prob
        grad_mean.mul_(inv_std)
        error = value - batch["returns"]
        if cfg.value_clip > 0:
            moved = value - batch["value"]
            error_clipped = error + (moved.clamp(-cfg.value_clip, cfg.value_clip) - moved)
            use_clipped = error_clipped.square() > error.square()
            v_loss = 0.5 * torch.maximum(error.square(), error_clipped.square()).mean()
            error = torch.where(use_clipped, error_clipped * (moved.abs() <= cfg.value_clip),
                                error)
        else:
            v_loss = 0.5 * error.square().mean()
        grad_value = error * (cfg.value_coef / b)
        entropy = log_std_sum.mean() + dims * (0.5 + _HALF_LOG_2PI)
        grad_log_std = (grad_log_std.sum(0) - cfg.entropy_coef if log_std.dim() == 1
                        else grad_log_std - cfg.entropy_coef / b)
        loss = pg_loss + cfg.value_coef * v_loss - cfg.entropy_coef * entropy
        metrics = torch.stack([
            pg_loss, v_loss, -entropy, loss, (torch.expm1(log_ratio) - log_ratio).mean(),
            counted.to(loss.dtype).mean(), entropy, std.mean()])
        ctx.save_for_backward(grad_mean, grad_log_std, grad_value)
        ctx.mark_non_differentiable(metrics)
        return loss, metrics

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, _: torch.Tensor) -> tuple[Any, ...]:
        grad_mean, grad_log_std, grad_value = ctx.saved_tensors
        return grad_mean * grad_loss, grad_log_std * grad_loss, grad_value * grad_loss, None, None


def ppo_loss(
    policy: GaussianActorCritic, batch: dict[str, torch.Tensor], cfg: PPOConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's total loss on one minibatch: clipped surrogate + value + entropy bonus.

    The clipped surrogate and value loss are ``pg_core.policy_loss`` and ``value_loss`` (mean
    aggregation), the log-probability and entropy those of the diagonal Gaussian, fused into
    one autograd function (``_PPOHead``).

    Args:
        policy: the actor-critic being optimized.
        batch: ``obs`` [B, obs_dim], ``action`` [B, A], ``log_prob``, ``value``,
            ``advantages``, ``returns`` [B] (a ``RolloutBuffer`` minibatch); ``critic_obs``
            [B, critic_obs_dim] for an asymmetric critic; ``old_mean``, ``old_std`` [B, A]
            (the policy that collected the rollout) with ``cfg.kl_estimator == "gaussian"``.
        cfg: clip widths and loss weights.

    Returns:
        ``(loss [], metrics [8])``: detached metrics in the order of ``LOSS_METRIC_KEYS``
        (``loss/value`` unweighted, ``loss/entropy`` = -entropy, ``train/kl`` KL(old || new)
        by ``cfg.kl_estimator``).
    """
    mean, log_std, value = policy.heads(batch["obs"], batch.get("critic_obs"))
    loss, metrics = _PPOHead.apply(mean, log_std, value, batch, cfg)
    if cfg.kl_estimator == "gaussian":
        with torch.no_grad():
            old = Normal(batch["old_mean"], batch["old_std"], validate_args=False)
            new = Normal(mean, log_std.exp().expand_as(mean), validate_args=False)
            kl = gaussian_kl(old, new)
        metrics = torch.cat([metrics[:_KL], kl[None], metrics[_KL + 1:]])
    return loss, metrics


def _network_parts(policy: GaussianActorCritic) -> tuple[slice, slice]:
    """The actor's (log std, mean head) and the critic's (value head, last) slices of the flat
    vector of ``policy.parameters()``."""
    params, critic = list(policy.parameters()), list(policy.critic_head.parameters())
    if [id(p) for p in params[-len(critic):]] != [id(p) for p in critic]:
        raise ValueError("the critic's parameters must come last in the flat vector")
    split = sum(p.numel() for p in params) - sum(p.numel() for p in critic)
    return slice(0, split), slice(split, None)


class PPO(GaussianOnPolicy):
    """PPO with a Gaussian actor-critic; see the module docstring for the call protocol.

    Acting, GAE and the normalizers come from ``GaussianOnPolicy`` (shared with TRPO).

    Attributes:
        policy: the ``GaussianActorCritic``; it takes normalized observations.
        obs_normalizer: ``RunningNormalizer`` applied before the policy, or None.
        buffer: the ``RolloutBuffer`` [rollout_steps, num_envs, ...]; it stores normalized obs.
        generator: drives action sampling and minibatch shuffling.
    """

    def __init__(
        self,
        obs_dim: int,
        action_low: torch.Tensor,
        action_high: torch.Tensor,
        num_envs: int,
        cfg: PPOConfig | None = None,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        group_dims: dict[str, int] | None = None,
    ) -> None:
        """Args: ``action_low``/``action_high`` [A] bounds; ``seed`` of the sampling generator
        (None: drawn from torch's global RNG, so ``torch.manual_seed`` fixes it)."""
        self.cfg = cfg = cfg if cfg is not None else PPOConfig()
        super().__init__(
            obs_dim, action_low, action_high, num_envs, cfg, device, seed,
            cfg.shared_backbone, cfg.state_dependent_std, group_dims,
        )  # fmt: skip
        self.lr = cfg.learning_rate
        # one flat tensor for Adam and the gradient clip: the policy's small tensors (13 for
        # separate networks) cost ~0.1 ms of Python per minibatch on CPU
        self.flat = FlatParameters(self.policy.parameters())
        self.optimizer = adam([self.flat.flat], self.lr, eps=cfg.adam_eps)
        # per network: the step only measures the joint norm, update() clips each part
        self.step = GradientStep("PPO", "policy", self.optimizer, flat=self.flat,
                                 max_grad_norm=0.0 if cfg.clip_grad_per_network
                                 else cfg.max_grad_norm)
        self._clip_parts = (_network_parts(self.policy) if cfg.clip_grad_per_network
                            and cfg.max_grad_norm > 0 else ())
        """Slices of ``flat`` clipped separately (actor, critic), or none."""
        self._old_policy = (copy.deepcopy(self.policy).requires_grad_(False)
                            if cfg.kl_estimator == "gaussian" else None)
        """The policy as the update started (the one that collected the rollout), for the
        closed-form KL; refreshed by each ``update``."""

    def _set_lr(self, lr: float) -> None:
        self.lr = lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def update(self, progress: float = 0.0) -> dict[str, float]:
        """Minibatch epochs on the stored rollout, then clear it.

        Args:
            progress: fraction of training done, in [0, 1] (drives the linear schedule).

        Returns:
            Flat metrics averaged over minibatches: ``loss/{policy,value,entropy,total}``
            (unweighted terms; ``loss/entropy`` is minus the entropy) and ``train/{kl,
            clipfrac, entropy, lr, action_std, explained_variance, grad_norm/policy}``.

        Raises:
            NonFiniteError: a loss or gradient is NaN/Inf; raised before that optimizer
                step, so the parameters stay finite.
        """
        cfg, buf = self.cfg, self.buffer
        per_minibatch = cfg.normalize_advantages and cfg.normalize_advantages_per_minibatch
        explained_variance = self._explained_variance_and_normalize(
            cfg.normalize_advantages and not per_minibatch)
        if self._old_policy is not None:
            self._old_policy.load_state_dict(self.policy.state_dict())
        self._set_lr(LR_SCHEDULES[cfg.lr_schedule](self.lr, progress, cfg))
        params = self.step.params
        keys = (*LOSS_METRIC_KEYS, self.step.metric)
        kl_index = keys.index("train/kl")
        totals = torch.zeros(len(keys), device=self.device)
        num_updates = 0
        for epoch in range(cfg.num_epochs):
            for i, batch in enumerate(buf.minibatches(cfg.num_minibatches, self.generator)):
                if per_minibatch and batch["advantages"].numel() > 1:
                    adv = batch["advantages"]
                    batch["advantages"] = (adv - adv.mean()) / (adv.std() + 1e-8)
                if self._old_policy is not None:
                    with torch.no_grad():
                        # the same rows in the same shape as the loss's forward: on the first
                        # minibatch both round alike and the KL is exactly 0
                        old = self._old_policy.dist(batch["obs"])
                    batch["old_mean"], batch["old_std"] = old.loc, old.scale
                loss, metrics = ppo_loss(self.policy, batch, cfg)
                # the loss metrics ride with the gradients: averaged over ranks in the same
                # all-reduce of a data-parallel run, so every rank sets the same adaptive lr
                grad_norm, riders = self.step.backward(loss, metrics)
                for part in self._clip_parts:  # as nn.utils.clip_grad_norm_, per network
                    grad = self.flat.flat.grad[part]
                    norm = torch.linalg.vector_norm(grad)
                    grad.mul_((cfg.max_grad_norm / (norm + 1e-6)).clamp_max(1.0))
                # one host sync per minibatch: the finiteness guard and the adaptive lr need it
                step = torch.cat([riders, grad_norm[None].to(riders)])
                finite, kl = torch.stack(
                    [torch.isfinite(step).all().to(step), step[kl_index]]
                ).tolist()
                if not finite:
                    values = ", ".join(
                        f"{k} {v:.4g}" for k, v in zip(keys, step.tolist(), strict=True)
                    )
                    self.step.fail(f"epoch {epoch}, minibatch {i}", values)
                if cfg.lr_schedule == "adaptive":
                    self._set_lr(adaptive_lr(self.lr, kl, cfg.desired_kl))
                self.step.apply()
                totals += step
                num_updates += 1
        buf.clear()
        with torch.no_grad():
            params_finite = torch.stack([torch.isfinite(p).all() for p in params]).all()
            values = torch.cat(
                [totals / num_updates, explained_variance[None], params_finite[None]]
            )
        *means, explained, finite = values.tolist()
        if not finite:
            raise NonFiniteError("PPO parameters became NaN/Inf during the update")
        metrics = dict(zip(keys, means, strict=True))
        metrics["train/lr"] = self.lr
        metrics["train/explained_variance"] = explained
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs between updates (tensors are shared, not copied)."""
        return {
            **self._collection_state(),
            "optimizer": self.optimizer.state_dict(),
            "lr": self.lr,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned; the rollout buffer starts empty."""
        self._load_collection_state(state)
        # a checkpoint of an earlier version holds Adam's state per parameter
        self.optimizer.load_state_dict(self.flat.flat_optimizer_state(state["optimizer"]))
        self._set_lr(float(state["lr"]))
