"""Aggregate statistics for comparing algorithms over few runs (Agarwal et al., "Deep RL at the
Edge of the Statistical Precipice", NeurIPS 2021), on numpy and scipy.

Scores are arrays ``[runs, tasks]`` (here: seeds x datasets, normalized so 1 = the reference
expert). Every aggregate takes such an array and returns a float; ``interval_estimates`` adds
stratified-bootstrap confidence intervals (runs are resampled with replacement within each
task, tasks are kept). The estimators follow rliable 1.2.0 exactly (its definitions, not its
code); ``tests/base/test_stats.py`` pins them against numbers rliable itself printed. rliable is not
a dependency: it needs ``arch`` 7.2, which breaks on pandas 3.

Bootstrap functions are vectorized: they take ``[reps, runs, tasks]`` and return ``[reps]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats as sstats

Aggregate = Callable[[np.ndarray], np.ndarray]
"""``[..., runs, tasks]`` -> ``[...]``: an aggregate over the last two axes."""


def _check(scores: np.ndarray, name: str = "scores") -> np.ndarray:
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2 or 0 in scores.shape:
        raise ValueError(f"{name} must be a non-empty [runs, tasks] array, got shape "
                         f"{scores.shape}")
    if not np.isfinite(scores).all():
        raise ValueError(f"{name} has NaN or Inf entries (a failed run?): "
                         f"{np.argwhere(~np.isfinite(scores)).tolist()} [run, task]")
    return scores


# ---------------------------------------------------------------------------- aggregates
def mean(scores: np.ndarray) -> np.ndarray:
    """Mean over tasks of the per-task mean over runs."""
    return scores.mean(axis=(-2, -1))


def median(scores: np.ndarray) -> np.ndarray:
    """Median over tasks of the per-task mean over runs."""
    return np.median(scores.mean(axis=-2), axis=-1)


def iqm(scores: np.ndarray) -> np.ndarray:
    """Interquartile mean: the mean of the middle 50% of all runs' scores, pooled over tasks
    (``scipy.stats.trim_mean`` cutting 25% at each end)."""
    flat = scores.reshape(*scores.shape[:-2], -1)
    return sstats.trim_mean(flat, 0.25, axis=-1)


def optimality_gap(scores: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """How far runs fall short of ``gamma`` (the expert): ``gamma - mean(min(score, gamma))``;
    lower is better, and scores above the expert earn nothing."""
    return gamma - np.minimum(scores, gamma).mean(axis=(-2, -1))


AGGREGATES: dict[str, Aggregate] = {"IQM": iqm, "Mean": mean, "Median": median,
                                    "Optimality gap": optimality_gap}
"""The four aggregates the paper recommends reporting together."""


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y): the chance that a run of X beats a run of Y on a task drawn at random (ties
    count half), averaged over tasks; the Mann-Whitney U statistic over ``m x n`` per task.

    ``x``: ``[..., m, tasks]``, ``y``: ``[..., n, tasks]`` (leading axes broadcast).
    """
    diff = x[..., :, None, :] - y[..., None, :, :]  # [..., m, n, tasks]
    wins = (diff > 0).astype(np.float64) + 0.5 * (diff == 0)
    return wins.mean(axis=(-3, -2)).mean(axis=-1)


def score_distribution(scores: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """Performance profile: the fraction of all runs (pooled over tasks) scoring above each
    ``tau``; ``[..., runs, tasks]`` -> ``[..., len(taus)]``."""
    flat = scores.reshape(*scores.shape[:-2], -1)
    return (flat[..., None, :] > np.asarray(taus)[:, None]).mean(axis=-1)


# ---------------------------------------------------------------------------- bootstrap
def stratified_resample(scores: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    """``reps`` stratified-bootstrap copies of ``[runs, tasks]``: in each task, its runs drawn
    with replacement; returns ``[reps, runs, tasks]``."""
    runs, tasks = scores.shape
    idx = rng.integers(0, runs, size=(reps, runs, tasks))
    return scores[idx, np.arange(tasks)]


def percentile_interval(samples: np.ndarray, size: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval over the first axis (lower, upper)."""
    alpha = (1.0 - size) / 2
    lo, hi = np.percentile(samples, [100 * alpha, 100 * (1 - alpha)], axis=0)
    return lo, hi


def interval_estimates(scores: dict[str, np.ndarray], aggregate: Aggregate,
                       reps: int = 50_000, size: float = 0.95, seed: int = 0,
                       ) -> dict[str, tuple[float, float, float]]:
    """Per algorithm: (point estimate, CI lower, CI upper) of ``aggregate`` over its
    ``[runs, tasks]`` scores, the interval from ``reps`` stratified-bootstrap resamples.

    Resamples are drawn in chunks, so ``reps`` = rliable's default 50,000 fits in memory.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, s in scores.items():
        s = _check(s, name)
        samples = np.concatenate([aggregate(stratified_resample(s, n, rng))
                                  for n in _chunks(reps, s.size)])
        lo, hi = percentile_interval(samples, size)
        out[name] = (float(aggregate(s)), float(lo), float(hi))
    return out


def improvement_estimates(scores: dict[str, np.ndarray], pairs: Sequence[tuple[str, str]],
                          reps: int = 2_000, size: float = 0.95, seed: int = 0,
                          ) -> dict[tuple[str, str], tuple[float, float, float]]:
    """P(X > Y) for each ``(X, Y)`` in ``pairs`` with a bootstrap CI: both algorithms' runs are
    resampled independently within each task (rliable's default, 2,000 resamples)."""
    rng = np.random.default_rng(seed)
    out = {}
    for a, b in pairs:
        x, y = _check(scores[a], a), _check(scores[b], b)
        if x.shape[1] != y.shape[1]:
            raise ValueError(f"{a} and {b} are scored on different task counts: "
                             f"{x.shape[1]} vs {y.shape[1]}")
        samples = np.concatenate([
            probability_of_improvement(stratified_resample(x, n, rng),
                                       stratified_resample(y, n, rng))
            for n in _chunks(reps, x.size * y.shape[0])])
        lo, hi = percentile_interval(samples, size)
        out[(a, b)] = (float(probability_of_improvement(x, y)), float(lo), float(hi))
    return out


def performance_profiles(scores: dict[str, np.ndarray], taus: np.ndarray, reps: int = 2_000,
                         size: float = 0.95, seed: int = 0,
                         ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per algorithm: the run-score distribution at ``taus`` and its bootstrap CI bands."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, s in scores.items():
        s = _check(s, name)
        samples = np.concatenate([score_distribution(stratified_resample(s, n, rng), taus)
                                  for n in _chunks(reps, s.size * len(taus))])
        lo, hi = percentile_interval(samples, size)
        out[name] = (score_distribution(s, taus), lo, hi)
    return out


def mean_interval(values: Sequence[float], size: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``values`` (e.g. one dataset's seeds) with a Student-t interval; with one value
    the interval is that value (nothing to estimate a spread from)."""
    v = np.asarray(values, dtype=np.float64)
    m = float(v.mean())
    if len(v) < 2:
        return m, m, m
    half = float(sstats.t.ppf(0.5 + size / 2, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))
    return m, m - half, m + half


def _chunks(reps: int, cost: int, budget: int = 4_000_000) -> list[int]:
    """Split ``reps`` so that a chunk holds about ``budget`` numbers (``cost`` per resample)."""
    per = max(1, budget // max(cost, 1))
    return [min(per, reps - i) for i in range(0, reps, per)]
