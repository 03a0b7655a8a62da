"""The shared policy-gradient core: pure loss functions returning ``(loss, metrics)``.

Nothing here knows about PPO, GRPO or TRPO. Tensors are "elements": one per action for control
(``[B]``) or one per token for sequences (``[B, L]`` with a ``[B, L]`` mask). PPO uses
``policy_loss`` + ``value_loss``; GRPO uses ``policy_loss`` on group-relative advantages, with
``kl_k3`` towards a reference policy; TRPO uses ``surrogate_loss`` (unclipped) with the
closed-form ``gaussian_kl`` for its trust region. Metrics are detached tensors, so callers decide when to sync.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributions import Normal, kl_divergence


def clipped_surrogate(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate (Schulman et al. 2017, eq. 7), negated to be minimized.

    The ratio is clipped to ``[1 - clip_low, 1 + clip_high]``; separate bounds allow DAPO's
    "clip-higher" (Yu et al. 2025). ``log_ratio`` may be per action, per token or per sequence
    (GSPO); ``advantages`` broadcasts against it (e.g. [B, 1] against [B, L]).

    Args:
        log_ratio: [...] log pi_new(a|s) - log pi_old(a|s).
        advantages: advantages, broadcastable to ``log_ratio``.
        clip_low: lower clip width (ratio >= 1 - clip_low); ``inf`` disables the lower clip.
        clip_high: upper clip width (ratio <= 1 + clip_high); ``inf`` disables the upper clip.

    Returns:
        ``(loss [...], clipped [...] bool)``: the per-element loss ``-min(r A, clip(r) A)`` and
        where the clipped branch is the smaller one, i.e. where the element's gradient is zero.
    """
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def surrogate(log_ratio: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """The unclipped importance-weighted surrogate, negated to be minimized.

    TRPO's objective (Schulman et al. 2015, eq. 14): ``-r A`` with ``r = exp(log_ratio)``;
    equal to ``clipped_surrogate`` with infinite clip widths. Its gradient at ``r = 1`` is the
    policy gradient.

    Args:
        log_ratio: [...] log pi_new(a|s) - log pi_old(a|s).
        advantages: advantages, broadcastable to ``log_ratio``.

    Returns:
        [...] per-element loss ``-exp(log_ratio) * advantages``.
    """
    return -torch.exp(log_ratio) * advantages


def surrogate_loss(
    logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """TRPO's policy loss: the mean unclipped surrogate ``-mean(r A)`` (Schulman et al. 2015).

    Args:
        logp_new: [B] log-probabilities under the policy being optimized.
        logp_old: [B] under the policy that collected the data (no gradient).
        advantages: [B].

    Returns:
        ``(loss [], metrics)`` with detached ``ratio_mean``.
    """
    log_ratio = logp_new - logp_old.detach()
    loss = surrogate(log_ratio, advantages).mean()
    return loss, {"ratio_mean": torch.exp(log_ratio.detach()).mean()}


def gaussian_kl(old: Normal, new: Normal) -> torch.Tensor:
    """Mean over states of KL(old || new), summed over action dimensions: [].

    Closed form for diagonal Gaussians ``[B, A]``; TRPO's trust-region constraint and, at the old
    parameters, the function whose Hessian is the Fisher matrix.
    """
    return kl_divergence(old, new).sum(-1).mean()


def kl_k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 KL estimator ``exp(d) - 1 - d`` per element (joschu.net/blog/kl-approx).

    With ``log_ratio = log pi_new - log pi_old`` on samples from pi_old it estimates
    KL(pi_old || pi_new) (PPO's approximate KL); with ``log pi_ref - log pi`` on samples from
    pi it estimates KL(pi || pi_ref) (GRPO's reference penalty). Unbiased and never negative.

    Args:
        log_ratio: [...] log-ratio of the two policies on the sampled actions.

    Returns:
        [...] per-element estimate.
    """
    return torch.expm1(log_ratio) - log_ratio


def _require_sequences(x: torch.Tensor, mode: str) -> None:
    if x.dim() < 2:
        raise ValueError(f"aggregation {mode!r} needs x of shape [B, L], got {tuple(x.shape)}")


def _token_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return x.mean()
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def _sum(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return x.sum() if mask is None else (x * mask.to(x.dtype)).sum()


def _seq_mean_token_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    _require_sequences(x, "seq_mean_token_mean")
    if mask is None:
        return x.mean(dim=-1).mean()
    mask = mask.to(x.dtype)
    return ((x * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)).mean()


def _seq_mean_token_sum(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    _require_sequences(x, "seq_mean_token_sum")
    masked = x if mask is None else x * mask.to(x.dtype)
    return masked.sum(dim=-1).mean()


def _seq_mean_token_sum_norm(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    _require_sequences(x, "seq_mean_token_sum_norm")
    masked = x if mask is None else x * mask.to(x.dtype)
    return masked.sum(dim=-1).mean() / x.shape[-1]


AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]] = {
    # every valid element weighs the same (DAPO's token-level loss, Yu et al. 2025)
    "mean": _token_mean,
    "token_mean": _token_mean,
    "sum": _sum,
    # mean over each sequence's valid tokens, then over sequences (the original GRPO)
    "seq_mean_token_mean": _seq_mean_token_mean,
    # sum over each sequence's tokens, then mean over sequences
    "seq_mean_token_sum": _seq_mean_token_sum,
    # token sum divided by the constant L (Dr. GRPO, Liu et al. 2025: no length bias)
    "seq_mean_token_sum_norm": _seq_mean_token_sum_norm,
}
"""Aggregation modes of ``aggregate``: name -> f(x, mask)."""


def aggregate(
    x: torch.Tensor, mask: torch.Tensor | None = None, mode: str = "mean"
) -> torch.Tensor:
    """Reduce per-element losses to a scalar with the aggregation ``mode``.

    Args:
        x: [B] per-element values, or [B, L] per-token values for the ``seq_*`` modes.
        mask: same shape as ``x``, bool or 0/1 float; 1 marks valid elements. None: all valid.
        mode: a key of ``AGGREGATIONS``: ``mean``/``token_mean`` (mean over valid elements),
            ``sum``, ``seq_mean_token_mean``, ``seq_mean_token_sum``, ``seq_mean_token_sum_norm``.

    Returns:
        [] scalar. A fully masked batch gives 0 for the mean modes.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; known modes: {', '.join(AGGREGATIONS)}")
    if mask is not None and mask.shape != x.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} differs from x shape {tuple(x.shape)}")
    return AGGREGATIONS[mode](x, mask)


def policy_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    mask: torch.Tensor | None = None,
    agg: str = "mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped-surrogate policy loss aggregated over elements.

    Args:
        logp_new: [B] or [B, L] log-probabilities under the policy being optimized.
        logp_old: same shape, under the policy that collected the data (no gradient).
        advantages: advantages, broadcastable to ``logp_new`` (e.g. [B, 1] for sequences).
        clip_low: lower clip width of the ratio.
        clip_high: upper clip width of the ratio.
        mask: same shape as ``logp_new``; 1 marks valid elements. None: all valid.
        agg: aggregation mode of the loss (see ``aggregate``).

    Returns:
        ``(loss [], metrics)`` with detached scalars ``clipfrac`` (fraction of valid elements
        whose gradient is clipped) and ``approx_kl`` (k3 estimate of KL(old || new)).
    """
    log_ratio = logp_new - logp_old.detach()
    per_elem, clipped = clipped_surrogate(log_ratio, advantages, clip_low, clip_high)
    loss = aggregate(per_elem, mask, agg)
    with torch.no_grad():
        metrics = {
            "clipfrac": _token_mean(clipped.to(log_ratio.dtype), mask),
            "approx_kl": _token_mean(kl_k3(log_ratio), mask),
        }
    return loss, metrics


def value_loss(
    value: torch.Tensor,
    old_value: torch.Tensor,
    returns: torch.Tensor,
    clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Half mean squared error of the critic, optionally clipped around the old prediction.

    With ``clip`` the prediction may move at most ``clip`` from ``old_value`` and the larger of
    the clipped and unclipped errors is taken (the PPO2 baselines variant; Engstrom et al. 2020
    discuss its effect). The 1/2 makes the gradient ``value - returns``.

    Args:
        value: [B] current predictions.
        old_value: [B] predictions at collection time (no gradient).
        returns: [B] value targets.
        clip: clip width; None disables clipping.

    Returns:
        ``(loss [], metrics)`` with detached ``value_clipfrac`` (fraction where the clipped
        error is the larger one; 0 without clipping).
    """
    error = (value - returns).square()
    if clip is None:
        return 0.5 * error.mean(), {"value_clipfrac": torch.zeros((), device=value.device)}
    if clip <= 0:
        raise ValueError(f"value clip must be positive or None, got {clip}")
    old_value = old_value.detach()
    value_clipped = old_value + torch.clamp(value - old_value, -clip, clip)
    error_clipped = (value_clipped - returns).square()
    loss = 0.5 * torch.maximum(error, error_clipped).mean()
    with torch.no_grad():
        frac = (error_clipped > error).to(value.dtype).mean()
    return loss, {"value_clipfrac": frac}
