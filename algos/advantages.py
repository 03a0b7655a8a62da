"""Advantage estimators shared by the policy-gradient algorithms (pure functions, no state).

``gae`` is the critic-based estimator of PPO and TRPO. The group-relative estimators of
``GROUP_ADVANTAGES`` are GRPO's critic-free ones: each prompt or initial state is rolled out K
times and every outcome is compared with the others of its group.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016, eq. 16) over a rollout.

    Two flags keep termination and truncation apart (Pardo et al. 2018, "Time Limits in RL"):
    ``terminated`` cuts the bootstrap (the next state has value 0), ``done`` = terminated or
    truncated cuts the recursion (the next row belongs to a new episode). On truncation the
    caller puts V(final_obs_t) in ``next_value[t]``, so the TD error still bootstraps.

    Args:
        reward: [T, N] reward of step t.
        value: [T, N] V(obs_t).
        next_value: [T, N] value used to bootstrap step t: V(obs_{t+1}) when the episode goes
            on, V(final_obs_t) when it was truncated at t (ignored where terminated).
        terminated: [T, N] bool (or 0/1 float), episode reached a terminal state at step t.
        done: [T, N] bool (or 0/1 float), episode ended at step t (terminated or truncated).
        gamma: discount factor.
        lam: GAE lambda (0: one-step TD error, 1: Monte-Carlo return minus baseline).

    Returns:
        ``(advantages [T, N], returns [T, N])`` with ``returns = advantages + value`` (the
        TD(lambda) value targets), in the dtype of ``reward``.
    """
    dtype = reward.dtype
    not_terminated = 1.0 - terminated.to(dtype)
    not_done = 1.0 - done.to(dtype)
    delta = reward + gamma * next_value * not_terminated - value
    advantages = torch.empty_like(delta)
    running = torch.zeros_like(delta[0])
    for t in range(reward.shape[0] - 1, -1, -1):
        running = delta[t] + (gamma * lam) * not_done[t] * running
        advantages[t] = running
    return advantages, advantages + value


def group_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative normalization of GRPO (Shao et al. 2024, "DeepSeekMath", sec. 4.1.2).

    Each row is one group of K outcomes from the same start; every entry is centred on its
    group mean and divided by the group's standard deviation plus ``eps``. The population
    standard deviation (divide by K) is used, so a group of one, or of equal outcomes, gives
    zero advantages instead of NaN.

    Args:
        x: [G, K] outcomes (returns or rewards), G groups of K samples.
        eps: added to the standard deviation.

    Returns:
        [G, K] normalized outcomes.
    """
    _check_groups(x, "group_normalize")
    mean = x.mean(dim=1, keepdim=True)
    std = x.std(dim=1, unbiased=False, keepdim=True)
    return (x - mean) / (std + eps)


def group_center(x: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO's advantage (Liu et al. 2025, "Understanding R1-Zero-Like Training", sec. 3.1):
    the outcome minus its group mean, without dividing by the group's standard deviation
    (which up-weights groups whose outcomes barely differ: a question-difficulty bias).

    Args:
        x: [G, K] outcomes, G groups of K samples.

    Returns:
        [G, K] centred outcomes.
    """
    _check_groups(x, "group_center")
    return x - x.mean(dim=1, keepdim=True)


def leave_one_out(x: torch.Tensor) -> torch.Tensor:
    """RLOO's advantage (Kool et al. 2019; Ahmadian et al. 2024): each outcome minus the mean of
    the *other* K - 1 outcomes of its group, an unbiased baseline since it does not depend on
    the sample itself. Equals ``K / (K - 1) * group_center(x)``.

    Args:
        x: [G, K] outcomes, G groups of K >= 2 samples.

    Returns:
        [G, K] advantages.
    """
    _check_groups(x, "leave_one_out")
    k = x.shape[1]
    if k < 2:
        raise ValueError("leave_one_out needs groups of at least 2 samples, got K = 1")
    return (x - (x.sum(dim=1, keepdim=True) - x) / (k - 1))


def _check_groups(x: torch.Tensor, name: str) -> None:
    if x.dim() != 2:
        raise ValueError(f"{name} expects x of shape [G, K], got {tuple(x.shape)}")


GROUP_ADVANTAGES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "grpo": group_normalize,
    "dr_grpo": group_center,
    "rloo": leave_one_out,
}
"""Group-relative advantage estimators by name: f(outcomes [G, K]) -> advantages [G, K]."""


def group_advantages(x: torch.Tensor, estimator: str) -> torch.Tensor:
    """Advantages [G, K] of outcomes ``x`` [G, K] with the estimator named ``estimator`` (a key
    of ``GROUP_ADVANTAGES``); an unknown name fails listing the known ones."""
    if estimator not in GROUP_ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {estimator!r}; known: "
                         f"{', '.join(GROUP_ADVANTAGES)}")
    return GROUP_ADVANTAGES[estimator](x)
