"""Trajectory replay: every world's recent steps in time order, for hindsight goal sampling.

Goal-conditioned contrastive RL (Eysenbach et al. 2022) learns from triples (s_t, a_t, s_{t+k})
of one episode, with the offset k drawn from a geometric distribution with the discount, i.e.
a future state of the discounted state-occupancy measure. That needs each world's steps in
order with their episode, which a flat transition ring loses; this buffer keeps them:

    obs     [T, N, obs_dim]  float32     the observation before each action
    action  [T, N, act_dim]  float32
    episode [T, N]           long        a run-wide episode id (-1: never written)

Row ``t`` of all N worlds is written at once (``add``), so the whole batch of worlds fills the
buffer in one tensor write on the learner's device.
"""

from __future__ import annotations

import math
from typing import Any

import torch

FIELDS: tuple[str, ...] = ("obs", "action", "episode")
"""Stored tensors (and ``state_dict`` keys)."""


def truncated_geometric(u: torch.Tensor, length: torch.Tensor, gamma: float) -> torch.Tensor:
    """Offsets k in 1..length with P(k) proportional to gamma^(k-1), by inverting the CDF
    F(k) = (1 - gamma^k) / (1 - gamma^length) at ``u`` in [0, 1).

    Args:
        u: [B] uniform draws; length: [B] long >= 1 (future steps available); gamma in (0, 1].
    Returns:
        [B] long offsets.
    """
    length_f = length.to(torch.float64)
    if gamma >= 1.0:
        k = torch.floor(u.double() * length_f) + 1
    else:
        log_gamma = math.log(gamma)
        tail = torch.exp(length_f * log_gamma)  # gamma^length
        k = torch.ceil(torch.log1p(-u.double() * (1 - tail)) / log_gamma)
    return torch.minimum(k.clamp(min=1), length_f).long()


class TrajectoryReplay:
    """A ring of the last ``steps`` steps of ``num_envs`` worlds; see the module docstring.

    ``horizon`` bounds how far ahead a future state is looked for (the episode limit): the
    same-episode test reads at most that many rows per sample.
    """

    def __init__(self, steps: int, num_envs: int, obs_dim: int, act_dim: int, horizon: int,
                 device: str | torch.device = "cpu") -> None:
        if steps < 2 or num_envs < 1 or horizon < 1:
            raise ValueError(f"trajectory replay needs steps >= 2, num_envs >= 1 and horizon "
                             f">= 1, got {steps}, {num_envs}, {horizon}")
        self.steps, self.num_envs, self.horizon = steps, num_envs, horizon
        self.device = torch.device(device)
        self.obs = torch.zeros(steps, num_envs, obs_dim, device=self.device)
        self.action = torch.zeros(steps, num_envs, act_dim, device=self.device)
        self.episode = torch.full((steps, num_envs), -1, dtype=torch.long, device=self.device)
        self.pos = 0
        """Time row written next."""
        self.size = 0
        """Time rows holding data (<= steps)."""

    def __len__(self) -> int:
        """Stored transitions, summed over worlds."""
        return self.size * self.num_envs

    def nbytes(self) -> int:
        return sum(getattr(self, f).nbytes for f in FIELDS)

    @torch.no_grad()
    def add(self, obs: torch.Tensor, action: torch.Tensor, episode: torch.Tensor) -> None:
        """Append one step of every world: ``obs`` [N, obs_dim], ``action`` [N, act_dim],
        ``episode`` [N] long (the id of the episode each world is in)."""
        self.obs[self.pos] = obs
        self.action[self.pos] = action
        self.episode[self.pos] = episode
        self.pos = (self.pos + 1) % self.steps
        self.size = min(self.size + 1, self.steps)

    def future_steps(self, t: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        """[B] long: how many stored steps after row ``t`` [B] of world ``n`` [B] belong to
        the same episode (0 for an episode's newest stored step)."""
        ahead = torch.arange(1, min(self.horizon, self.steps - 1) + 1, device=self.device)
        rows = (t[:, None] + ahead) % self.steps                          # [B, H]
        newest = (self.pos - 1 - t) % self.steps                          # [B] rows written after t
        same = (self.episode[rows, n[:, None]] == self.episode[t, n][:, None])
        same &= ahead[None] <= newest[:, None]
        return same.long().cumprod(1).sum(1)

    def _rows(self, batch: int, generator: torch.Generator | None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``batch`` uniform (row, world) pairs that have a future step: (t, n, future steps)."""
        dev = self.device
        t = torch.empty(batch, dtype=torch.long, device=dev)
        n = torch.empty_like(t)
        length = torch.zeros_like(t)
        todo = torch.arange(batch, device=dev)
        for _ in range(100):  # an episode's last stored step is the only reject
            k = todo.numel()
            # oldest stored row is pos - size
            t_new = (self.pos - self.size + torch.randint(self.size, (k,), generator=generator,
                                                          device=dev)) % self.steps
            n_new = torch.randint(self.num_envs, (k,), generator=generator, device=dev)
            len_new = self.future_steps(t_new, n_new)
            t[todo], n[todo], length[todo] = t_new, n_new, len_new
            todo = todo[len_new == 0]
            if todo.numel() == 0:
                return t, n, length
        raise RuntimeError("trajectory replay holds no step with a later step of its episode "
                           "(episodes of one step?)")

    def sample(self, batch: int, gamma: float, generator: torch.Generator | None = None
               ) -> dict[str, torch.Tensor]:
        """``batch`` steps drawn uniformly with one future observation of the same episode
        each, k steps ahead with P(k) proportional to gamma^(k-1) over the stored future.

        Returns ``obs`` [B, obs_dim], ``action`` [B, act_dim], ``future_obs`` [B, obs_dim],
        ``offset`` [B] long (k >= 1).
        """
        if self.size < 2:
            raise RuntimeError("trajectory replay needs at least 2 stored steps to sample")
        t, n, length = self._rows(batch, generator)
        u = torch.rand(batch, generator=generator, device=self.device)
        k = truncated_geometric(u, length, gamma)
        future = (t + k) % self.steps
        return {"obs": self.obs[t, n], "action": self.action[t, n],
                "future_obs": self.obs[future, n], "offset": k}

    def state_dict(self) -> dict[str, Any]:
        """The stored rows in time order (oldest first) and the size."""
        order = (self.pos - self.size + torch.arange(self.size, device=self.device)) % self.steps
        return {**{f: getattr(self, f)[order].cpu() for f in FIELDS}, "size": self.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        size = int(state["size"])
        if size > self.steps or state["obs"].shape[1:] != self.obs.shape[1:]:
            raise ValueError(f"trajectory replay state of {size} rows x "
                             f"{tuple(state['obs'].shape[1:])} does not fit this buffer "
                             f"({self.steps} rows x {tuple(self.obs.shape[1:])})")
        for f in FIELDS:
            getattr(self, f)[:size] = state[f].to(self.device)
        self.episode[size:] = -1
        self.size, self.pos = size, size % self.steps
