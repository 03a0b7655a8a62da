"""Recording datasets on a batched simulator: many worlds at once, deterministic for a seed.

    data = collect(env, policy, steps=1_000_000, card=card, seed=0, action_noise=0.1)

Every world runs its own episodes; rows are grouped per world and episode, so each episode is
contiguous. The episode a world is in when the budget ends is kept and marked truncated (its
last next observation is real, so it bootstraps correctly).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from robotrl.data.dataset import Dataset, DatasetCard
from robotrl.envs.base import BatchedEnv, Obs
from robotrl.logging import ProgressBar
from robotrl.types import policy_obs

PolicyFn = Callable[[Obs], torch.Tensor]
"""Observation (every group, [N, ...]) -> action [N, A] in the env's bounds."""


def uniform_policy(env: BatchedEnv, generator: torch.Generator) -> PolicyFn:
    """Uniformly random actions in the env's bounds (the random datasets, and ref_min_score)."""
    low, high = env.spec.action_low, env.spec.action_high

    def policy(obs: Obs) -> torch.Tensor:
        n = policy_obs(obs).shape[0]
        return low + (high - low) * torch.rand(n, low.numel(), generator=generator)

    return policy


def collect(env: BatchedEnv, policy: PolicyFn, steps: int, card: DatasetCard, seed: int,
            action_noise: float = 0.0, progress: bool = True) -> Dataset:
    """Record ``steps`` transitions (rounded up to whole batches of ``env.num_envs``).

    Args:
        policy: acts for all worlds; called under ``torch.inference_mode()``.
        action_noise: std of Gaussian noise added to the policy's actions, as a fraction of
            the action half-range; the result is clipped to the bounds.
        seed: seeds the env reset and the noise.
    Returns the dataset with ``card`` completed (``policy_return``, ``seed``, ``action_noise``).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    n = env.num_envs
    per_world = -(-steps // n)
    low, high = env.spec.action_low, env.spec.action_high
    half = (high - low) / 2
    generator = torch.Generator().manual_seed(seed)
    obs_l, act_l, rew_l, nxt_l, term_l, trunc_l = [], [], [], [], [], []
    obs = env.reset(seed=seed)
    start = time.perf_counter()
    with torch.inference_mode(), ProgressBar(per_world * n, progress, label="collect") as bar:
        for t in range(per_world):
            action = policy(obs).cpu().float()
            if action_noise > 0:
                noise = torch.randn(action.shape, generator=generator) * action_noise * half
                action = torch.maximum(torch.minimum(action + noise, high), low)
            out = env.step(action)
            obs_l.append(policy_obs(obs).cpu().float().clone())
            act_l.append(action)
            rew_l.append(out.reward.cpu().float())
            nxt_l.append(policy_obs(out.info["final_obs"]).cpu().float().clone())
            term_l.append(out.terminated.cpu())
            trunc_l.append(out.truncated.cpu())
            obs = out.obs
            if t % 50 == 0 or t == per_world - 1:
                done = (t + 1) * n
                bar.update(done, done / (time.perf_counter() - start), float("nan"))
    # [T, N, ...] -> world-major rows, so each world's episodes are contiguous
    def rows(parts: list[torch.Tensor]) -> torch.Tensor:
        x = torch.stack(parts, 1)  # [N, T, ...]
        return x.reshape(n * per_world, *x.shape[2:])

    term, trunc = rows(term_l).clone(), rows(trunc_l).clone()
    world_end = torch.zeros(n, per_world, dtype=torch.bool)
    world_end[:, -1] = True
    trunc |= world_end.flatten() & ~term  # the budget cut the running episodes
    ends = (term | trunc).numpy()
    starts = np.flatnonzero(np.concatenate([[True], ends[:-1]]))
    data = Dataset(rows(obs_l), rows(act_l), rows(rew_l), rows(nxt_l), term, trunc,
                   torch.from_numpy(starts), card, where="collection")
    complete = data.episode_returns()[~world_end.flatten()[data.episode_ends() - 1]
                                      | data.terminations[data.episode_ends() - 1]]
    returns = complete if complete.numel() else data.episode_returns()
    card.policy_return = float(returns.mean())
    card.seed, card.action_noise = seed, float(action_noise)
    return data
