"""Off-policy storage: a preallocated ring of transitions on the learner's device."""

from __future__ import annotations

from typing import Any

import torch

FIELDS: tuple[str, ...] = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
"""Fields of a transition, as stored and as ``sample`` returns them."""


class ReplayBuffer:
    """A ring of the last ``capacity`` transitions, written a batch of N worlds at a time.

    Fed straight from the batched env's tensors (no NumPy). ``next_obs`` of a row that ended
    its episode is the env's ``final_obs`` (the observation before the auto-reset), so a
    truncated transition bootstraps from where the episode really was; ``terminated`` and
    ``truncated`` are kept apart (only termination stops the bootstrap).

    Attributes (preallocated on ``device``):
        obs, next_obs: [capacity, obs_dim] float32.
        action: [capacity, act_dim] float32.
        reward: [capacity] float32.
        terminated, truncated: [capacity] bool.
    """

    def __init__(
        self, capacity: int, obs_dim: int, act_dim: int, device: str | torch.device = "cpu"
    ) -> None:
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.device = torch.device(device)

        def zeros(*extra: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros(capacity, *extra, dtype=dtype, device=self.device)

        self.obs = zeros(obs_dim)
        self.action = zeros(act_dim)
        self.reward = zeros()
        self.next_obs = zeros(obs_dim)
        self.terminated = zeros(dtype=torch.bool)
        self.truncated = zeros(dtype=torch.bool)
        self.pos = 0
        """Row the next transition goes to."""
        self.size = 0
        """Rows holding data (<= capacity)."""

    def __len__(self) -> int:
        return self.size

    def nbytes(self) -> int:
        """Bytes of preallocated storage."""
        return sum(getattr(self, f).nbytes for f in FIELDS)

    @torch.no_grad()
    def add(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
    ) -> None:
        """Append one step of N worlds.

        Args:
            obs: [N, obs_dim] observations the actions were taken in.
            action: [N, act_dim].
            reward: [N].
            next_obs: [N, obs_dim] the observation after the step; for rows that ended an
                episode, the final observation (``info["final_obs"]``), not the reset one.
            terminated: [N] bool.
            truncated: [N] bool.
        """
        n = obs.shape[0]
        if n > self.capacity:
            raise ValueError(f"cannot add {n} transitions to a replay buffer of {self.capacity}")
        for name, value, shape in (
            ("obs", obs, (n, self.obs_dim)),
            ("action", action, (n, self.act_dim)),
            ("reward", reward, (n,)),
            ("next_obs", next_obs, (n, self.obs_dim)),
            ("terminated", terminated, (n,)),
            ("truncated", truncated, (n,)),
        ):
            if tuple(value.shape) != shape:
                raise ValueError(f"replay add: {name} has shape {tuple(value.shape)}, expected {shape}")
        end = self.pos + n
        first = min(end, self.capacity) - self.pos  # rows before the ring wraps
        values = (obs, action, reward, next_obs, terminated, truncated)
        for name, value in zip(FIELDS, values, strict=True):
            store = getattr(self, name)
            store[self.pos : self.pos + first].copy_(value[:first])
            if first < n:
                store[: n - first].copy_(value[first:])
        self.pos = end % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """``batch_size`` transitions drawn uniformly with replacement: each field [B, ...]."""
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        idx = torch.randint(
            0, self.size, (batch_size,), generator=generator, device=self.device
        )
        return {name: getattr(self, name)[idx] for name in FIELDS}

    def state_dict(self) -> dict[str, Any]:
        """The filled rows and the ring position (rows past ``size`` are never read)."""
        state: dict[str, Any] = {name: getattr(self, name)[: self.size] for name in FIELDS}
        state.update(pos=self.pos, size=self.size, capacity=self.capacity)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ValueError(
                f"replay buffer in the checkpoint has capacity {state['capacity']}, "
                f"this config has {self.capacity}"
            )
        size = int(state["size"])
        for name in FIELDS:
            getattr(self, name)[:size].copy_(state[name])
        self.pos, self.size = int(state["pos"]), size
