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
        self.stride: int | None = None
        """Rows of every ``add`` (the worlds), while they were all the same (0 once they
        differed): a world's next step is ``stride`` rows on (``n_step``)."""
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
        self.stride = n if self.stride in (None, n) else 0
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

    @torch.no_grad()
    def n_step(self, idx: torch.Tensor, n: int, gamma: float) -> dict[str, torch.Tensor]:
        """The ``n``-step transitions starting at rows ``idx`` [B]: each world's next ``n``
        steps (``stride`` rows apart), cut after the step that ends the episode (terminated or
        truncated) and at the newest step stored.

        Returns ``obs`` and ``action`` of the first step; ``reward`` the discounted sum of the m
        rewards used; ``next_obs`` and ``terminated`` of the m-th step (a truncated last step
        bootstraps from its final observation, as in one-step replay); ``discount``
        gamma^m, 0 where the m-th step terminated. n = 1 gives the rows as stored with
        ``discount`` gamma (1 - terminated).
        """
        if n < 1:
            raise ValueError(f"n-step returns need n >= 1, got {n}")
        if n > 1 and not self.stride:
            raise RuntimeError("n-step returns need every add() to store the same worlds "
                               f"(got {'no add yet' if self.stride is None else 'varying sizes'})")
        stride = self.stride or 1
        k = torch.arange(n, device=self.device)
        rows = (idx[:, None] + k * stride) % self.capacity  # [B, n]
        ahead = ((self.pos - 1 - idx) % self.capacity) // stride  # newer steps stored
        stored = k <= ahead[:, None]
        done = (self.terminated[rows] | self.truncated[rows]) & stored
        ended = (done.cumsum(1) - done.long()) > 0  # an earlier step ended the episode
        used = stored & ~ended
        m = used.sum(1)  # >= 1: the first step is always used
        reward = (self.reward[rows] * used * gamma ** k.to(self.reward.dtype)).sum(1)
        last = rows.gather(1, (m - 1)[:, None]).squeeze(1)
        terminated = self.terminated[last]
        discount = gamma ** m.to(self.reward.dtype) * (~terminated).to(self.reward.dtype)
        return {"obs": self.obs[idx], "action": self.action[idx], "reward": reward,
                "next_obs": self.next_obs[last], "terminated": terminated, "discount": discount}

    def state_dict(self) -> dict[str, Any]:
        """The filled rows and the ring position (rows past ``size`` are never read)."""
        state: dict[str, Any] = {name: getattr(self, name)[: self.size] for name in FIELDS}
        state.update(pos=self.pos, size=self.size, capacity=self.capacity,
                     stride=self.stride or 0)
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
        self.stride = int(state.get("stride", 0)) or None  # 0: unknown, set by the next add
