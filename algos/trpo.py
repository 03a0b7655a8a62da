"""Trust Region Policy Optimization (Schulman et al. 2015) on batched environments.

TRPO = GAE (``advantages.gae``) + the unclipped surrogate of ``pg_core`` maximized under a bound
on the mean KL divergence between the old and the new policy:

1. ``g``: gradient of the surrogate at the old parameters.
2. natural gradient ``s = F^-1 g`` by conjugate gradient, where ``F v`` is the Hessian of the
   mean KL times ``v``, computed by double backpropagation (no Fisher matrix is ever formed;
   Schulman et al. 2015, appendix C) on a random ``fvp_fraction`` of the rollout.
3. the largest step along ``s`` allowed by the quadratic model of the KL:
   ``sqrt(2 max_kl / s^T F s) s``, shrunk by ``backtrack`` until the exact mean KL is within
   ``max_kl`` and the surrogate improves; if no step passes, the policy is left unchanged.
4. the value function is fitted by minibatch regression (Adam) on the GAE returns.

**The std floor.** TRPO has no entropy term and spends its whole KL budget every update. The
KL cost of moving log std is the same at any std (its Fisher information is 2), so once a task is
solved and the advantages carry only the critic's small errors (on InvertedPendulum: raw
advantage std ~1e-4 of the return scale once every episode reaches the time limit, unit scale
after standardization), log std keeps falling at a steady rate until it hits the numeric floor
exp(-5) = 0.0067, 0.1% of InvertedPendulum's action range. Exploration is then gone, the states
the KL constraint covers shrink to a sliver, and a drift of the mean the policy never recovers
from ends the run (measured, 2M steps, seeds 0-2: eval 432/492/1000 with the per-dimension KL
bound, 4.5/519/111 reported with 0.06). ``min_action_std`` puts the floor at a fraction of the
action range instead (1000/1000/1000; in one further run of seed 1 the return dipped to 325 at
1.6M steps and was back at 1000 by 2M: with exploration left, the policy recovers). Two other
remedies were measured and rejected: scaling each step by the gradient's signal fraction
estimated from two halves of the rollout stopped the drift on InvertedPendulum only partly
(1000/532/1000) and slowed HalfCheetah to half (eval at 1M steps 955/246/784 vs
1716/3609/1645); more value regression (20 epochs) destabilized learning.

The on-policy runner drives it exactly like PPO (``act``, ``process_env_step``,
``compute_returns`` come from ``GaussianOnPolicy``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributions import Normal

from robotrl import distributed
from robotrl.algos.on_policy_base import GaussianOnPolicy
from robotrl.algos.pg_core import gaussian_kl, surrogate_loss, value_loss
from robotrl.nn.mlp import ACTIVATIONS
from robotrl.optim import GradientStep, NonFiniteError, adam, nonfinite_message
from robotrl.types import check_groups

KL_PER_ACTION_DIM = 0.01
"""The default trust-region radius per action dimension (``TRPOConfig.max_kl`` None)."""


KL_SCHEDULES: dict[str, Callable[[float], float]] = {
    "fixed": lambda progress: 1.0,
    "linear": lambda progress: max(0.0, 1.0 - progress),
}
"""``TRPOConfig.kl_schedule``: the fraction of ``max_kl`` in use, given the fraction of
training done."""


@dataclass
class TRPOConfig:
    """TRPO hyperparameters; defaults for MuJoCo locomotion with 32 worlds
    (``configs/algo/trpo.yaml``: 4096 samples per update)."""

    rollout_steps: int = 128
    """Rollout length per environment per update (batch = rollout_steps * num_envs)."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda (Schulman et al. 2016)."""
    max_kl: float | None = None
    """Trust-region radius: bound on the mean over states of KL(old || new), summed over action
    dimensions. None: 0.01 per action dimension, sb3-contrib's target_kl 0.01 (which averages
    over dimensions): 0.06 on HalfCheetah, 0.01 on InvertedPendulum. Measured on HalfCheetah,
    200k steps, seeds 0-2: eval 1651/1035/606 with 0.06, 702/485/-163 with the paper's 0.01
    (Schulman et al. 2015): a 6-D task wants a wider region than a 1-D one."""
    kl_schedule: str = "fixed"
    """"fixed": the radius ``max_kl`` on every update; "linear": ``max_kl`` x (1 - fraction of
    training done), down to 0 at the end (as PPO's linear learning rate). TRPO spends its whole
    radius on every update, so a solved task keeps moving; the linear schedule freezes it
    toward the end. Measured on InvertedDoublePendulum, 1M steps: ``configs/tuned/``."""
    cg_iters: int = 10
    """Conjugate-gradient iterations for the natural gradient."""
    cg_damping: float = 0.1
    """Added to the Fisher-vector product (F + damping I): keeps CG well-conditioned. F is the
    Hessian of the KL summed over action dimensions; sb3-contrib's is of the KL averaged over
    them, so its cg_damping d is ours d * action_dim (with max_kl its target_kl * action_dim)."""
    reverse_kl: bool = False
    """Bound the mean KL(new || old) (sb3-contrib's order) instead of KL(old || new) (Schulman et
    al. 2015). Both have the Fisher matrix as Hessian at the old policy: only the exact KL the
    line search checks differs."""
    fvp_fraction: float = 0.25
    """Fraction of the rollout (drawn at random) on which the Fisher-vector products are computed;
    the gradient and the line search use all of it (rllab's subsample_factor, Duan et al. 2016)."""
    line_search_steps: int = 10
    """Step sizes tried by the backtracking line search (full step first)."""
    backtrack: float = 0.8
    """Shrink factor of the step between line-search trials, in (0, 1)."""
    critic_lr: float = 1e-3
    """Adam learning rate of the value function."""
    critic_epochs: int = 5
    """Passes of value regression over each rollout."""
    critic_minibatches: int = 16
    """Minibatches per value pass (minibatch = rollout_steps * num_envs / critic_minibatches)."""
    value_coef: float = 1.0
    """Weight of the value loss (half squared error) Adam minimizes; 2: sb3-contrib's plain mean
    squared error, whose gradient is twice ours (under Adam only its eps tells them apart)."""
    normalize_advantages: bool = True
    """Standardize advantages over each rollout before the policy step."""
    actor_hidden: tuple[int, ...] = (64, 64)
    """Hidden widths of the policy network."""
    critic_hidden: tuple[int, ...] = (64, 64)
    """Hidden widths of the value network."""
    activation: str = "tanh"
    """Hidden activation: relu, tanh, elu, silu or gelu."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy."""
    min_action_std: float = 1 / 30
    """Floor of the policy's std as a fraction of each action dimension's half-range
    ``(high - low) / 2`` (0.1 on InvertedPendulum's [-3, 3]); 0: only the numeric floor exp(-5).
    Without it TRPO drives the std to that floor once a task is solved and then collapses
    (module docstring); measured on InvertedPendulum, 2M steps, seeds 0-2: final eval
    1000/1000/1000 with a floor of 0.1, 1000/926/1000 with 0.03, 432/492/1000 without."""
    state_dependent_std: bool = False
    """Predict the log std from the observation instead of a free parameter per dimension."""
    normalize_obs: bool = True
    """Normalize observations by running mean and variance (updated while acting)."""
    reward_scaling: bool = True
    """Divide rewards by the running std of the discounted return, clip to +-10 (Engstrom et al. 2020)."""
    critic_obs: tuple[str, ...] = ("policy",)
    """Observation groups the critic sees, concatenated in order; ``[policy, privileged]`` makes
    an asymmetric actor-critic (the actor, and so the export, sees ``policy`` only)."""

    def __post_init__(self) -> None:
        self.actor_hidden = tuple(int(w) for w in self.actor_hidden)
        self.critic_hidden = tuple(int(w) for w in self.critic_hidden)
        self.critic_obs = check_groups(self.critic_obs, "critic_obs")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {self.activation!r}; known: {', '.join(ACTIVATIONS)}"
            )
        for name in ("rollout_steps", "cg_iters", "line_search_steps", "critic_epochs",
                     "critic_minibatches"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_kl is not None and not self.max_kl > 0:
            raise ValueError(f"max_kl must be > 0 (or null: {KL_PER_ACTION_DIM} per action "
                             f"dimension), got {self.max_kl}")
        if self.kl_schedule not in KL_SCHEDULES:
            raise ValueError(f"unknown kl_schedule {self.kl_schedule!r}; known: "
                             f"{', '.join(KL_SCHEDULES)}")
        if not 0 <= self.min_action_std < 1:
            raise ValueError(f"min_action_std must be in [0, 1), got {self.min_action_std}")
        if not self.critic_lr > 0:
            raise ValueError(f"critic_lr must be > 0, got {self.critic_lr}")
        if not self.value_coef > 0:
            raise ValueError(f"value_coef must be > 0, got {self.value_coef}")
        if not 0 < self.fvp_fraction <= 1:
            raise ValueError(f"fvp_fraction must be in (0, 1], got {self.fvp_fraction}")
        if not self.cg_damping >= 0:
            raise ValueError(f"cg_damping must be >= 0, got {self.cg_damping}")
        if not 0 < self.backtrack < 1:
            raise ValueError(f"backtrack must be in (0, 1), got {self.backtrack}")
        for name in ("gamma", "gae_lambda"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")

    def kl_bound(self, act_dim: int) -> float:
        """The trust-region radius for ``act_dim`` action dimensions: ``max_kl``, or
        ``KL_PER_ACTION_DIM`` per dimension."""
        return KL_PER_ACTION_DIM * act_dim if self.max_kl is None else self.max_kl


def conjugate_gradient(
    mvp: Callable[[torch.Tensor], torch.Tensor],
    b: torch.Tensor,
    iters: int,
    residual_tol: float = 1e-10,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Solve ``A x = b`` for symmetric positive-definite ``A`` given only ``v -> A v``.

    Conjugate gradient (Hestenes & Stiefel 1952; Nocedal & Wright 2006, alg. 5.2) from x = 0.
    No host synchronization: once the squared residual falls below ``residual_tol`` the search
    direction is zeroed instead of breaking out of the loop.

    Args:
        mvp: matrix-vector product, [D] -> [D].
        b: [D] right-hand side.
        iters: iterations (matrix-vector products); exact after D in exact arithmetic.
        residual_tol: squared residual norm below which the iteration stops moving.

    Returns:
        ``(x [D], residual [])``: the solution and ``||b - A x|| / ||b||`` (the recursive
        residual; 0 when ``b`` is 0).
    """
    x = torch.zeros_like(b)
    r = b.clone()
    p = b.clone()
    rr = r @ r
    b_norm = rr.sqrt()
    for _ in range(iters):
        active = rr > residual_tol
        ap = mvp(p)
        p_ap = p @ ap
        alpha = torch.where(active & (p_ap > 0), rr / p_ap, 0.0)
        x = x + alpha * p
        r = r - alpha * ap
        rr_new = r @ r
        beta = torch.where(active, rr_new / rr, 0.0)
        p = torch.where(active, r + beta * p, 0.0)
        rr = torch.where(active, rr_new, rr)
    return x, torch.where(b_norm > 0, rr.sqrt() / b_norm, 0.0)


def _flat(tensors: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def fisher_vector_product(
    kl: torch.Tensor, params: list[torch.Tensor], damping: float = 0.0
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``v -> (F + damping I) v`` by double backpropagation of the mean KL (Pearlmutter 1994).

    At the old parameters the mean KL(old || new) has zero gradient and its Hessian is the
    Fisher information matrix F of the policy, averaged over states (Schulman et al. 2015,
    appendix C.1), so ``F v = d/dtheta (grad KL . v)``.

    Args:
        kl: [] mean KL(pi_old || pi_theta), with a graph to ``params``, evaluated at theta_old.
        params: the P parameter tensors theta.
        damping: added multiple of ``v``.

    Returns:
        A function [P_total] -> [P_total]; it may be called any number of times.
    """
    grad_kl = _flat(torch.autograd.grad(kl, params, create_graph=True))

    def fvp(v: torch.Tensor) -> torch.Tensor:
        hv = torch.autograd.grad(grad_kl @ v, params, retain_graph=True)
        return distributed.mean(_flat(hv)) + damping * v  # F of every rank's states

    return fvp


@torch.no_grad()
def _assign(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    offset = 0
    for p in params:
        n = p.numel()
        p.copy_(flat[offset : offset + n].view_as(p))
        offset += n


class TRPO(GaussianOnPolicy):
    """TRPO with a Gaussian actor-critic (separate networks); see the module docstring.

    Attributes:
        policy: the ``GaussianActorCritic``; it takes normalized observations.
        actor_params: the policy's parameters (mean network, log std) moved by the TRPO step.
        critic_optimizer: Adam on the value network only.
        buffer: the ``RolloutBuffer`` [rollout_steps, num_envs, ...]; it stores normalized obs.
        generator: drives action sampling and the critic's minibatch shuffling.
    """

    def __init__(
        self,
        obs_dim: int,
        action_low: torch.Tensor,
        action_high: torch.Tensor,
        num_envs: int,
        cfg: TRPOConfig | None = None,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        group_dims: dict[str, int] | None = None,
    ) -> None:
        """Args: ``action_low``/``action_high`` [A] bounds; ``seed`` of the sampling generator
        (None: drawn from torch's global RNG, so ``torch.manual_seed`` fixes it)."""
        self.cfg = cfg = cfg if cfg is not None else TRPOConfig()
        super().__init__(
            obs_dim, action_low, action_high, num_envs, cfg, device, seed,
            shared_backbone=False, state_dependent_std=cfg.state_dependent_std,
            group_dims=group_dims,
        )  # fmt: skip
        self.actor_params = [
            p for name, p in self.policy.named_parameters() if not name.startswith("critic_head.")
        ]
        self.critic_params = list(self.policy.critic_head.parameters())
        self.critic_optimizer = adam(self.critic_params, cfg.critic_lr, eps=1e-5)
        self.critic_step = GradientStep("TRPO", "critic", self.critic_optimizer)
        self.max_kl = cfg.kl_bound(self.action_low.numel())
        """The trust-region radius (``TRPOConfig.kl_bound``)."""
        self.radius = self.max_kl
        """This update's radius: ``max_kl`` scaled by ``TRPOConfig.kl_schedule``."""

    def _surrogate_and_kl(
        self, old: Normal, obs: torch.Tensor, action: torch.Tensor, old_log_prob: torch.Tensor,
        advantages: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, Normal]:  # fmt: skip
        """Surrogate loss [], the bounded mean KL [] (``_kl``) and the new distribution on [B]
        samples."""
        dist = self.policy.dist(obs)
        loss, _ = surrogate_loss(dist.log_prob(action).sum(-1), old_log_prob, advantages)
        return loss, self._kl(old, dist), dist

    def _kl(self, old: Normal, new: Normal) -> torch.Tensor:
        """[] the mean KL the trust region bounds (``TRPOConfig.reverse_kl`` picks the order)."""
        return gaussian_kl(new, old) if self.cfg.reverse_kl else gaussian_kl(old, new)

    def _policy_step(self) -> dict[str, torch.Tensor]:
        """The natural-gradient step with line search on the whole rollout."""
        cfg, buf, params = self.cfg, self.buffer, self.actor_params
        obs, action = buf.obs.flatten(0, 1), buf.action.flatten(0, 1)
        old_log_prob, adv = buf.log_prob.flatten(), buf.advantages.flatten()
        with torch.no_grad():
            old_dist = self.policy.dist(obs)
            old = Normal(old_dist.loc, old_dist.scale, validate_args=False)
            old_params = _flat([p.detach() for p in params])  # a new tensor (cat)
        loss, kl, _ = self._surrogate_and_kl(old, obs, action, old_log_prob, adv)
        if cfg.fvp_fraction < 1.0:
            # the products dominate the step's cost; a random subset estimates F well enough,
            # and the line search still checks the exact KL on the whole rollout
            g = -distributed.mean(_flat(torch.autograd.grad(loss, params)))
            total = obs.shape[0]
            gen_device = self.generator.device
            idx = torch.randperm(total, generator=self.generator, device=gen_device)
            idx = idx[: max(1, round(cfg.fvp_fraction * total))].to(self.device)
            sub = Normal(old.loc[idx], old.scale[idx], validate_args=False)
            kl = self._kl(sub, self.policy.dist(obs[idx]))
        else:
            g = -distributed.mean(_flat(torch.autograd.grad(loss, params, retain_graph=True)))
        fvp = fisher_vector_product(kl, params, cfg.cg_damping)
        step_dir, cg_residual = conjugate_gradient(fvp, g, cfg.cg_iters)
        shs = step_dir @ fvp(step_dir)
        # quadratic model: 1/2 (b s)^T F (b s) = radius  =>  b = sqrt(2 radius / s^T F s)
        scale = torch.where(shs > 0, torch.sqrt(2.0 * self.radius / shs), 0.0)
        full_step = (scale * step_dir).detach()
        old_loss = distributed.mean(loss.detach())
        check = torch.stack([old_loss, g.abs().sum(), full_step.abs().sum()])
        if not bool(torch.isfinite(check).all()):
            surrogate_value, g_norm, step_norm = check.tolist()
            raise NonFiniteError(nonfinite_message(
                "TRPO", "surrogate", "the natural-gradient step",
                f"surrogate {surrogate_value:.4g}, |g|_1 {g_norm:.4g}, |step|_1 {step_norm:.4g}"))
        zero = torch.zeros((), device=self.device)
        result = {"loss": old_loss, "kl": zero, "fraction": zero, "accepted": zero,
                  "improvement": zero, "cg_residual": cg_residual.detach()}  # fmt: skip
        with torch.no_grad():
            for k in range(cfg.line_search_steps):
                fraction = cfg.backtrack**k
                _assign(params, old_params + fraction * full_step)
                new_loss, new_kl, dist = self._surrogate_and_kl(
                    old, obs, action, old_log_prob, adv
                )
                new_loss, new_kl = distributed.mean(torch.stack([new_loss, new_kl]))
                improvement = old_loss - new_loss
                kl_value, improvement_value = torch.stack([new_kl, improvement]).tolist()
                # NaN fails both comparisons, so a non-finite trial is never accepted
                if kl_value <= self.radius and improvement_value > 0:
                    result.update(loss=new_loss, kl=new_kl, accepted=zero + 1.0,
                                  fraction=zero + fraction, improvement=improvement)  # fmt: skip
                    break
            else:
                _assign(params, old_params)
                dist = old
            result["entropy"] = dist.entropy().sum(-1).mean()
            result["action_std"] = dist.stddev.mean()
        return result

    def _fit_critic(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Minibatch regression of V on the returns; ([] mean half squared error, [] mean
        gradient norm)."""
        cfg = self.cfg
        total = torch.zeros(2, device=self.device)
        count = 0
        for epoch in range(cfg.critic_epochs):
            for i, batch in enumerate(
                self.buffer.minibatches(cfg.critic_minibatches, self.generator)
            ):
                critic_in = batch.get("critic_obs", batch["obs"])
                loss, _ = value_loss(self.policy.value(critic_in), batch["value"],
                                     batch["returns"])  # fmt: skip
                weighted = loss if cfg.value_coef == 1.0 else cfg.value_coef * loss
                grad_norm = self.critic_step(weighted, f"value epoch {epoch}, minibatch {i}")
                total += torch.stack([loss.detach(), grad_norm])
                count += 1
        value, grad_norm = total / count
        return value, grad_norm

    def update(self, progress: float = 0.0) -> dict[str, float]:
        """One TRPO policy step and the value regression on the stored rollout; then clear it.

        Args:
            progress: fraction of training done, in [0, 1] (drives ``kl_schedule``).

        Returns:
            Flat metrics: ``loss/policy`` (surrogate loss after the step), ``loss/value`` (mean
            half squared error over the critic minibatches), ``train/kl`` (exact mean
            KL of the accepted step, 0 if none: KL(old || new), or KL(new || old) with
            ``reverse_kl``), ``train/step_fraction`` (accepted fraction of the full step, 0 if
            none), ``train/line_search_accepted`` (1 or 0),
            ``train/improvement`` (surrogate gain), ``train/entropy``, ``train/action_std``,
            ``train/explained_variance`` (of the rollout's values), ``train/cg_residual``
            (relative CG residual) and ``train/grad_norm/critic`` (mean over the value steps).

        Raises:
            NonFiniteError: a surrogate, gradient, step or value loss is NaN/Inf; raised
                before the parameters it would corrupt are changed.
        """
        self.radius = self.max_kl * KL_SCHEDULES[self.cfg.kl_schedule](progress)
        explained_variance = self._explained_variance_and_normalize(self.cfg.normalize_advantages)
        step = self._policy_step()
        value, critic_grad_norm = self._fit_critic()
        self.buffer.clear()
        with torch.no_grad():
            finite = torch.stack([torch.isfinite(p).all() for p in self.policy.parameters()]).all()
            keys = ("loss", "kl", "fraction", "accepted", "improvement", "entropy",
                    "action_std", "cg_residual")  # fmt: skip
            values = torch.stack([*(step[k] for k in keys), value, critic_grad_norm,
                                  explained_variance, finite.to(value)]).tolist()  # fmt: skip
        *policy_values, value_loss_mean, grad_norm, explained, is_finite = values
        if not is_finite:
            raise NonFiniteError("TRPO parameters became NaN/Inf during the update")
        s = dict(zip(keys, policy_values, strict=True))
        return {
            "loss/policy": s["loss"],
            "loss/value": value_loss_mean,
            "train/kl": s["kl"],
            "train/step_fraction": s["fraction"],
            "train/line_search_accepted": s["accepted"],
            "train/improvement": s["improvement"],
            "train/entropy": s["entropy"],
            "train/action_std": s["action_std"],
            "train/explained_variance": explained,
            "train/cg_residual": s["cg_residual"],
            self.critic_step.metric: grad_norm,
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs between updates (tensors are shared, not copied)."""
        return {**self._collection_state(), "critic_optimizer": self.critic_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned; the rollout buffer starts empty."""
        self._load_collection_state(state)
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
