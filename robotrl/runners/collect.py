"""Recording datasets on a batched simulator: many worlds at once, deterministic for a seed.

    data = collect(env, policy, steps=1_000_000, card=card, seed=0, action_noise=0.1)

Every world runs its own episodes; rows are grouped per world and episode, so each episode is
contiguous. The episode a world is in when the budget ends is kept and marked truncated (its
last next observation is real, so it bootstraps correctly). ``RecordTransitions`` does the
recording, here and around a training run's worlds (``medium-replay``).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from robotrl.data.dataset import Dataset, DatasetCard
from robotrl.envs.wrappers import Wrapper
from robotrl.logging import ProgressBar
from robotrl.runners.evaluation import PolicyFn
from robotrl.stats import mean_interval
from robotrl.types import BatchedEnv, Obs, StepOut, flatten_groups, policy_obs


def uniform_policy(env: BatchedEnv, generator: torch.Generator) -> PolicyFn:
    """Uniformly random actions in the env's bounds (the random datasets, and ref_min_score)."""
    low, high = env.spec.action_low, env.spec.action_high

    def policy(obs: Obs) -> torch.Tensor:
        n = policy_obs(obs).shape[0]
        return low + (high - low) * torch.rand(n, low.numel(), generator=generator)

    return policy


class RecordTransitions(Wrapper):
    """Records every transition stepped through it (the ``policy`` group, the action as the
    simulator applies it, clipped to the bounds), for ``dataset``; used by ``collect`` and to
    record what a training run sees (``medium-replay``).

    Args:
        env: the worlds to record.
        obs: the observation the worlds are at, when they were reset before wrapping.
        groups: observation groups recorded, flattened and concatenated in this order
            (``flatten_groups``; e.g. ``("policy", "tokens", "image")`` for a VLA's data).
    """

    def __init__(self, env: BatchedEnv, obs: Obs | None = None,
                 groups: tuple[str, ...] = ("policy",)) -> None:
        super().__init__(env)
        self.groups = groups
        self._obs = None if obs is None else self._flat(obs)
        self._rows: dict[str, list[torch.Tensor]] = {k: [] for k in (
            "obs", "action", "reward", "next_obs", "terminated", "truncated")}

    def reset(self, seed: int | None = None) -> Obs:
        obs = self.env.reset(seed)
        self._obs = self._flat(obs)
        return obs

    def _flat(self, obs: Obs) -> torch.Tensor:
        if self.groups == ("policy",):
            return policy_obs(obs).cpu().float().clone()
        return flatten_groups({g: obs[g].cpu() for g in self.groups}, self.groups)

    def step(self, action: torch.Tensor) -> StepOut:
        if self._obs is None:
            raise RuntimeError("RecordTransitions: step() before reset() (or pass obs=)")
        out = self.env.step(action)
        spec = self.env.spec
        rows = self._rows
        rows["obs"].append(self._obs)
        rows["action"].append(torch.maximum(torch.minimum(action.detach().cpu().float(),
                                                          spec.action_high), spec.action_low))
        rows["reward"].append(out.reward.cpu().float())
        rows["next_obs"].append(self._flat(out.info["final_obs"]))
        rows["terminated"].append(out.terminated.cpu())
        rows["truncated"].append(out.truncated.cpu())
        self._obs = self._flat(out.obs)
        return out

    @property
    def steps(self) -> int:
        """Transitions recorded (summed over worlds)."""
        return len(self._rows["reward"]) * self.num_envs

    def dataset(self, card: DatasetCard) -> Dataset:
        """The recorded transitions, world by world so each episode is contiguous; the episode
        each world is in at the end is kept, marked truncated (its next observation is real).
        Completes ``card.policy_return`` (mean return of the episodes that ended by
        themselves, all episodes if none did) and its 95% interval."""
        n, t = self.num_envs, len(self._rows["reward"])
        if t == 0:
            raise ValueError("no transitions recorded")

        def rows(key: str) -> torch.Tensor:
            x = torch.stack(self._rows[key], 1)  # [N, T, ...]
            return x.reshape(n * t, *x.shape[2:])

        term, trunc = rows("terminated").clone(), rows("truncated").clone()
        cut = torch.zeros(n, t, dtype=torch.bool)
        cut[:, -1] = True
        cut = cut.flatten() & ~term & ~trunc  # the budget, not the episode, ended these
        trunc |= cut
        ends = (term | trunc).numpy()
        starts = np.flatnonzero(np.concatenate([[True], ends[:-1]]))
        data = Dataset(rows("obs"), rows("action"), rows("reward"), rows("next_obs"), term,
                       trunc, torch.from_numpy(starts), card, where="recording")
        finished = ~cut[data.episode_ends() - 1]
        returns = data.episode_returns()
        ended = returns[finished] if finished.any() else returns
        card.policy_return, low, high = mean_interval(np.asarray(ended, dtype=np.float64))
        card.policy_return_low, card.policy_return_high = (low, high) if len(ended) > 1 else (
            None, None)
        return data


def collect(env: BatchedEnv, policy: PolicyFn, steps: int, card: DatasetCard, seed: int,
            action_noise: float = 0.0, progress: bool = True,
            groups: tuple[str, ...] = ("policy",)) -> Dataset:
    """Record ``steps`` transitions (rounded up to whole batches of ``env.num_envs``).

    Args:
        policy: acts for all worlds; called under ``torch.inference_mode()``.
        action_noise: std of Gaussian noise added to the policy's actions, as a fraction of
            the action half-range; the result is clipped to the bounds.
        seed: seeds the env reset and the noise.
        groups: observation groups recorded (``RecordTransitions``); the card lists them.
    Returns the dataset with ``card`` completed (``policy_return``, ``seed``, ``action_noise``).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    n = env.num_envs
    per_world = -(-steps // n)
    low, high = env.spec.action_low, env.spec.action_high
    half = (high - low) / 2
    generator = torch.Generator().manual_seed(seed)
    recorder = RecordTransitions(env, groups=groups)
    obs = recorder.reset(seed=seed)
    start = time.perf_counter()
    with torch.inference_mode(), ProgressBar(per_world * n, progress, label="collect") as bar:
        for t in range(per_world):
            action = policy(obs).cpu().float()
            if action_noise > 0:
                noise = torch.randn(action.shape, generator=generator) * action_noise * half
                action = torch.maximum(torch.minimum(action + noise, high), low)
            obs = recorder.step(action).obs
            if t % 50 == 0 or t == per_world - 1:
                done = (t + 1) * n
                bar.update(done, done / (time.perf_counter() - start), float("nan"))
    data = recorder.dataset(card)
    card.seed, card.action_noise = seed, float(action_noise)
    card.observations = list(groups)
    return data
