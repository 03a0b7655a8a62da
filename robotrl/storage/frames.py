"""Replay of frame-stacked image observations that stores each frame once.

A pixel learner acts on stacks of the last k frames (``robotrl.envs.wrappers.FrameStack``):
[N, k * C, H, W] uint8. Storing both stacks of every transition would hold each frame 2k times
(cheetah at 84 x 84, k = 3: 127 kB a transition, 12.7 GB for 100k); this ring keeps, per step
and world, the newest frame of the observation and of the next observation (42 kB) and the
observation's age in its episode, and rebuilds both stacks when sampling, exactly as the wrapper
built them (a young episode's stack repeats its first frame). Written a step of N worlds at a
time, as the batched envs step.
"""

from __future__ import annotations

from typing import Any

import torch

FIELDS: tuple[str, ...] = ("frame", "next_frame", "age", "action", "reward", "terminated",
                           "truncated")
"""What each (step, world) slot stores."""


class FrameReplay:
    """A ring of the last ``capacity // num_envs`` steps of ``num_envs`` worlds; ``sample``
    returns the ``ReplayBuffer`` fields, ``obs`` and ``next_obs`` as the stacks [B, k*C, H, W]
    uint8.

    Attributes (on ``device``, [steps, N, ...], allocated at the first ``add``, so a learner
    built to evaluate holds none): ``frame``/``next_frame`` [C, H, W] uint8 (the newest frame
    of the observation and of the next one), ``age`` (steps since the episode's first
    observation, as this ring saw it), ``action``, ``reward``, ``terminated``, ``truncated``.
    """

    def __init__(self, capacity: int, num_envs: int, stack_shape: tuple[int, ...], k: int,
                 act_dim: int, device: str | torch.device = "cpu") -> None:
        if num_envs < 1 or k < 1 or stack_shape[0] % k:
            raise ValueError(f"frame replay: need num_envs >= 1 and k >= 1 dividing the stack's "
                             f"channels, got num_envs={num_envs}, k={k}, shape {stack_shape}")
        self.num_envs, self.k, self.act_dim = num_envs, k, act_dim
        self.stack_shape = tuple(stack_shape)
        self.channels = stack_shape[0] // k
        self.steps = max(capacity // num_envs, k + 1)
        self.capacity = self.steps * num_envs
        self.device = dev = torch.device(device)
        self.frame = self.next_frame = self.age = self.action = self.reward = torch.empty(0)
        self.terminated = self.truncated = torch.empty(0, dtype=torch.bool)
        self._allocated = False  # at the first add: a learner built to evaluate stores nothing
        self.pos = 0
        """Step slot the next add goes to."""
        self.filled = 0
        """Step slots holding data (<= steps)."""
        self._age = torch.zeros(num_envs, dtype=torch.long, device=dev)
        """Each world's current observation's age."""

    def __len__(self) -> int:
        return self.filled * self.num_envs

    def _allocate(self) -> None:
        """The storage, [steps, N, ...] (gigabytes at DrQ's sizes)."""
        if self._allocated:
            return
        dev, n, s = self.device, self.num_envs, self.steps
        self.frame = torch.zeros(s, n, self.channels, *self.stack_shape[1:], dtype=torch.uint8,
                                 device=dev)
        self.next_frame = torch.zeros_like(self.frame)
        self.age = torch.zeros(s, n, dtype=torch.long, device=dev)
        self.action = torch.zeros(s, n, self.act_dim, device=dev)
        self.reward = torch.zeros(s, n, device=dev)
        self.terminated = torch.zeros(s, n, dtype=torch.bool, device=dev)
        self.truncated = torch.zeros_like(self.terminated)
        self._allocated = True

    def nbytes(self) -> int:
        return sum(getattr(self, f).nbytes for f in FIELDS)

    @torch.no_grad()
    def add(self, obs: torch.Tensor, action: torch.Tensor, reward: torch.Tensor,
            next_obs: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor) -> None:
        """One step of every world: ``obs``/``next_obs`` [N, k*C, H, W] uint8 stacks (the next
        one before any auto-reset: ``info["final_obs"]``), ``action`` [N, A], ``reward`` [N],
        ``terminated``/``truncated`` [N] bool."""
        n = self.num_envs
        for name, value, shape in (("obs", obs, (n, *self.stack_shape)),
                                   ("next_obs", next_obs, (n, *self.stack_shape)),
                                   ("action", action, (n, self.act_dim)), ("reward", reward, (n,)),
                                   ("terminated", terminated, (n,)),
                                   ("truncated", truncated, (n,))):
            if tuple(value.shape) != shape:
                raise ValueError(f"frame replay add: {name} has shape {tuple(value.shape)}, "
                                 f"expected {shape}")
        self._allocate()
        t, c = self.pos, self.channels
        self.frame[t] = obs[:, -c:]
        self.next_frame[t] = next_obs[:, -c:]
        self.age[t] = self._age
        self.action[t] = action
        self.reward[t] = reward
        self.terminated[t] = terminated
        self.truncated[t] = truncated
        self._age = torch.where(terminated | truncated, 0, self._age + 1)
        self.pos = (t + 1) % self.steps
        self.filled = min(self.filled + 1, self.steps)

    def stacks(self, t: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(observation stack, next observation stack) [B, k*C, H, W] of slots (``t``, ``w``):
        frame j back is the one min(j, age) steps back, as ``FrameStack`` stacked it."""
        age = self.age[t, w]
        back = [self.frame[(t - torch.minimum(age, torch.full_like(age, j))) % self.steps, w]
                for j in range(self.k - 1, -1, -1)]
        obs = torch.cat(back, dim=1)
        nxt = torch.cat([*back[1:], self.next_frame[t, w]], dim=1)
        return obs, nxt

    def sample(self, batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """``batch_size`` transitions drawn uniformly with replacement over the slots whose
        frames are all stored (a full ring leaves out its oldest k - 1 steps, whose stacks
        reach past it)."""
        if self.filled == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        full = self.filled == self.steps
        low = self.k - 1 if full else 0
        oldest = self.pos if full else 0
        offset = torch.randint(low, self.filled, (batch_size,), generator=generator,
                               device=self.device)
        t = (oldest + offset) % self.steps
        w = torch.randint(0, self.num_envs, (batch_size,), generator=generator,
                          device=self.device)
        obs, nxt = self.stacks(t, w)
        return {"obs": obs, "action": self.action[t, w], "reward": self.reward[t, w],
                "next_obs": nxt, "terminated": self.terminated[t, w],
                "truncated": self.truncated[t, w]}

    def state_dict(self) -> dict[str, Any]:
        """The filled slots, the ring position and the worlds' current ages."""
        state: dict[str, Any] = {name: getattr(self, name)[: self.filled] for name in FIELDS}
        state.update(pos=self.pos, filled=self.filled, steps=self.steps, current_age=self._age)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["steps"]) != self.steps:
            raise ValueError(f"frame replay in the checkpoint holds {state['steps']} steps, this "
                             f"config {self.steps}")
        filled = int(state["filled"])
        self._allocate()
        for name in FIELDS:
            getattr(self, name)[:filled].copy_(state[name])
        self.pos, self.filled = int(state["pos"]), filled
        self._age.copy_(state["current_age"])
