"""Losses of the offline algorithms: pure functions returning ``(loss, metrics)`` (STYLE 2).

Shapes: B the batch, E the critic ensemble, A the action width. Actions live in [-1, 1]^A
(the learners map them to the env's bounds). ``terminated`` masks the bootstrap; truncated
rows bootstrap from their next observation like any other row.
"""

from __future__ import annotations

import torch

Metrics = dict[str, torch.Tensor]


def ensemble_mse(q: torch.Tensor, target: torch.Tensor,
                 name: str = "loss/critic") -> tuple[torch.Tensor, Metrics]:
    """Sum over members of the mean squared TD error: q [E, B], target [B] -> []."""
    loss = (q - target).square().mean(-1).sum()
    return loss, {name: loss.detach(), "train/q": q.detach().mean()}


def bc_loss(action: torch.Tensor, data_action: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
    """Behaviour cloning by mean squared error over batch and action dims: [B, A] -> []."""
    loss = (action - data_action).square().mean()
    return loss, {"loss/actor": loss.detach()}


def auxiliary_mse(prediction: torch.Tensor, target: torch.Tensor
                  ) -> tuple[torch.Tensor, Metrics]:
    """An auxiliary head's mean squared error over batch and features: [B, F] -> []
    (``loss/aux``)."""
    loss = (prediction - target).square().mean()
    return loss, {"loss/aux": loss.detach()}


def td3bc_actor_loss(q: torch.Tensor, action: torch.Tensor, data_action: torch.Tensor,
                     alpha: float) -> tuple[torch.Tensor, Metrics]:
    """TD3+BC's policy loss (Fujimoto & Gu 2021, eq. 3): -lambda Q(s, pi(s)) + (pi(s) - a)^2.

    lambda = alpha / mean|Q| (detached) makes the trade-off independent of the reward scale.

    Args:
        q: [B] the first critic at (s, pi(s)).
        action, data_action: [B, A] pi(s) and the dataset's action.
    """
    lmbda = alpha / q.abs().mean().detach()
    bc = (action - data_action).square().mean()
    loss = -lmbda * q.mean() + bc
    return loss, {"loss/actor": loss.detach(), "train/bc_mse": bc.detach(),
                  "train/lambda": lmbda}


def rebrac_actor_loss(q: torch.Tensor, action: torch.Tensor, data_action: torch.Tensor,
                      beta: float, normalize_q: bool = True) -> tuple[torch.Tensor, Metrics]:
    """ReBRAC's policy loss (Tarasov et al. 2023, eq. 2): mean(beta ||pi(s) - a||^2 - lambda Q).

    Args:
        q: [B] minimum over the critics at (s, pi(s)).
        action, data_action: [B, A].
        beta: the actor's BC coefficient.
        normalize_q: lambda = 1 / mean|Q| (detached), else 1.

    ``train/bc_mse`` is the mean over rows and action dimensions, as TD3+BC's (the penalty
    sums over dimensions: it is ``beta * A * bc_mse``), so the two learners' curves compare.
    """
    lmbda = 1.0 / q.abs().mean().detach() if normalize_q else torch.ones((), device=q.device)
    squared = (action - data_action).square()
    loss = (beta * squared.sum(-1) - lmbda * q).mean()
    return loss, {"loss/actor": loss.detach(), "train/bc_mse": squared.detach().mean(),
                  "train/lambda": lmbda}


def rebrac_next_value(next_q: torch.Tensor, next_action: torch.Tensor,
                      data_next_action: torch.Tensor, beta: float) -> torch.Tensor:
    """ReBRAC's penalized bootstrap value: min_e Q'_e(s', a') - beta ||a' - a'_data||^2: [B].

    Args:
        next_q: [E, B] target critics at (s', a'), a' the target actor's smoothed action.
        next_action, data_next_action: [B, A] a' and the dataset's action at s'.
    """
    return next_q.min(0).values - beta * (next_action - data_next_action).square().sum(-1)


def expectile_loss(diff: torch.Tensor, expectile: float) -> tuple[torch.Tensor, Metrics]:
    """IQL's value loss (Kostrikov et al. 2022, eq. 5): mean |tau - 1(u < 0)| u^2, u = Q - V.

    With tau > 0.5, V(s) tracks an upper expectile of Q(s, a) over the dataset's actions.
    """
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    loss = (weight * diff.square()).mean()
    return loss, {"loss/value": loss.detach(), "train/v_gap": diff.detach().mean()}


def advantage_weighted_loss(log_prob: torch.Tensor, advantage: torch.Tensor, temperature: float,
                            max_weight: float = 100.0) -> tuple[torch.Tensor, Metrics]:
    """Advantage-weighted regression: -mean(min(exp(adv / temperature), max_weight) log pi(a|s)).

    IQL's policy extraction (Kostrikov et al. 2022, eq. 7, with beta = 1 / temperature) and
    AWAC's actor loss (Nair et al. 2020, eq. 8, lambda = temperature).

    Args:
        log_prob: [B] log pi of the dataset's actions.
        advantage: [B] (detached) Q(s, a) - V(s).
    """
    weight = torch.exp(advantage.detach() / temperature).clamp(max=max_weight)
    loss = -(weight * log_prob).mean()
    return loss, {"loss/actor": loss.detach(), "train/weight": weight.mean()}


def softmax_weighted_loss(log_prob: torch.Tensor, advantage: torch.Tensor,
                          temperature: float) -> tuple[torch.Tensor, Metrics]:
    """AWAC's weights normalized over the batch (d3rlpy's ``AWACImpl``):
    -sum_i w_i log pi(a_i|s_i), w = B softmax_batch(adv / temperature), unclipped.

    The weights average 1 over the batch; the loss is their batch sum, B times the mean form
    (with Adam the scale reaches the step only through its epsilon).

    Args:
        log_prob: [B] log pi of the dataset's actions.
        advantage: [B] (detached) Q(s, a) - V(s).
    """
    weight = torch.softmax(advantage.detach() / temperature, dim=0) * advantage.numel()
    loss = -(log_prob * weight).sum()
    return loss, {"loss/actor": loss.detach(), "train/weight": weight.mean()}


def alpha_temperature_loss(log_alpha: torch.Tensor, log_prob: torch.Tensor,
                           target_entropy: float) -> tuple[torch.Tensor, Metrics]:
    """SAC's temperature loss on alpha itself: -alpha E[log pi + target_entropy], alpha =
    exp(log_alpha) (d3rlpy's ``SACImpl.update_temp``). The fixed point is SAC's; the gradient
    with respect to log alpha is the log-alpha form's scaled by alpha.

    Args:
        log_alpha: [] the learnable log temperature.
        log_prob: [B] log pi of actions sampled at the batch's states (detached here).
    """
    loss = -(log_alpha.exp() * (log_prob.detach() + target_entropy)).mean()
    return loss, {"loss/alpha": loss.detach()}


def cql_penalty(q_sampled: torch.Tensor, log_density: torch.Tensor, q_data: torch.Tensor,
                temperature: float = 1.0) -> tuple[torch.Tensor, Metrics]:
    """CQL(H)'s conservative term per critic (Kumar et al. 2020, eq. 4, importance-sampled as
    in its appendix F): T logsumexp_k((Q(s, a_k) - log mu(a_k)) / T) - Q(s, a_data).

    Args:
        q_sampled: [E, B, K] critics at K sampled actions (uniform, pi(s), pi(s')).
        log_density: [B, K] log density of each sampled action under what drew it.
        q_data: [E, B] critics at the dataset's actions.
    Returns the penalty summed over critics, averaged over the batch ([]).
    """
    weighted = (q_sampled - log_density) / temperature
    # no -log K: the reference implementation omits it (a constant: same gradients), and the
    # Lagrange threshold target_action_gap is calibrated without it
    lse = temperature * torch.logsumexp(weighted, dim=-1)
    gap = (lse - q_data).mean(-1)  # [E]
    return gap.sum(), {"train/cql_gap": gap.detach().mean()}
