"""On-policy rollout storage: preallocated ``[T, N, ...]`` tensors on the learner's device."""

from __future__ import annotations

from collections.abc import Iterator

import torch

MINIBATCH_KEYS: tuple[str, ...] = ("obs", "action", "log_prob", "value", "advantages", "returns")
"""Fields that ``RolloutBuffer.minibatches`` yields, each flattened to [B, ...]."""


class RolloutBuffer:
    """T steps of N parallel environments, written one step at a time by ``add``.

    Terminated and truncated are stored separately; ``next_value[t]`` is the value that step t
    bootstraps from: V(final_obs_t) for truncated rows (given to ``add``), V(obs_{t+1})
    otherwise (filled by ``fill_next_value`` once the rollout is complete). The ``advantages``
    and ``returns`` fields are written by the algorithm (e.g. with ``robotrl.algos.advantages.gae``).

    Attributes (all preallocated on ``device``):
        obs: [T, N, obs_dim] observations the policy saw (already normalized, if it normalizes).
        critic_obs: [T, N, critic_obs_dim] the critic's own input (asymmetric actor-critic), or
            None when the critic sees ``obs``.
        action: [T, N, act_dim] sampled actions, before any clipping to the action bounds.
        log_prob: [T, N] log pi(action | obs) at collection time.
        value: [T, N] V(obs) at collection time.
        reward: [T, N] rewards (after any reward scaling).
        terminated: [T, N] bool.
        truncated: [T, N] bool.
        next_value: [T, N] bootstrap values (see above).
        advantages: [T, N].
        returns: [T, N] value targets.
    """

    def __init__(
        self,
        num_steps: int,
        num_envs: int,
        obs_dim: int,
        act_dim: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        critic_obs_dim: int | None = None,
    ) -> None:
        if num_steps < 1 or num_envs < 1:
            raise ValueError(f"need num_steps >= 1 and num_envs >= 1, got {num_steps}, {num_envs}")
        self.num_steps = num_steps
        self.num_envs = num_envs
        self.device = torch.device(device)
        shape = (num_steps, num_envs)

        def zeros(*extra: int, kind: torch.dtype = dtype) -> torch.Tensor:
            return torch.zeros(*shape, *extra, dtype=kind, device=self.device)

        self.obs = zeros(obs_dim)
        self.critic_obs = None if critic_obs_dim is None else zeros(critic_obs_dim)
        self.action = zeros(act_dim)
        self.log_prob = zeros()
        self.value = zeros()
        self.reward = zeros()
        self.terminated = zeros(kind=torch.bool)
        self.truncated = zeros(kind=torch.bool)
        self.next_value = zeros()
        self.advantages = zeros()
        self.returns = zeros()
        self.step = 0

    @property
    def full(self) -> bool:
        """Whether all ``num_steps`` steps have been added."""
        return self.step == self.num_steps

    def add(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        log_prob: torch.Tensor,
        value: torch.Tensor,
        reward: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        truncation_value: torch.Tensor | None = None,
    ) -> None:
        """Write one step for every environment (``add_policy`` then ``add_env``).

        Args:
            obs: [N, obs_dim].
            action: [N, act_dim].
            log_prob: [N].
            value: [N].
            reward: [N].
            terminated: [N] bool.
            truncated: [N] bool.
            truncation_value: [N] V(final_obs), used where ``truncated``; None: no truncation
                bootstrap (treated as 0).
        """
        self.add_policy(obs, action, log_prob, value)
        self.add_env(reward, terminated, truncated, truncation_value)

    def add_policy(
        self, obs: torch.Tensor, action: torch.Tensor, log_prob: torch.Tensor, value: torch.Tensor,
        critic_obs: torch.Tensor | None = None,
    ) -> None:
        """Write the policy half of the current step (copies, so callers may reuse ``obs``).

        Args: ``obs`` [N, obs_dim], ``action`` [N, act_dim], ``log_prob`` [N], ``value`` [N],
        ``critic_obs`` [N, critic_obs_dim] (exactly when the buffer has ``critic_obs``).
        """
        if (critic_obs is None) != (self.critic_obs is None):
            raise ValueError("critic_obs must be given exactly when the buffer was made with "
                             "critic_obs_dim")
        if self.full:
            raise RuntimeError(
                f"rollout buffer is full ({self.num_steps} steps); consume it and call clear()"
            )
        t = self.step
        self.obs[t].copy_(obs)
        if self.critic_obs is not None:
            self.critic_obs[t].copy_(critic_obs)
        self.action[t].copy_(action)
        self.log_prob[t].copy_(log_prob)
        self.value[t].copy_(value)

    def add_env(
        self,
        reward: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        truncation_value: torch.Tensor | None = None,
    ) -> None:
        """Write the environment half of the current step and advance to the next one.

        Args: ``reward`` [N], ``terminated`` [N] bool, ``truncated`` [N] bool,
        ``truncation_value`` [N] (see ``add``).
        """
        if self.full:
            raise RuntimeError(
                f"rollout buffer is full ({self.num_steps} steps); consume it and call clear()"
            )
        t = self.step
        self.reward[t].copy_(reward)
        self.terminated[t].copy_(terminated)
        self.truncated[t].copy_(truncated)
        if truncation_value is None:
            self.next_value[t].zero_()
        else:
            self.next_value[t].copy_(torch.where(truncated, truncation_value, 0.0))
        self.step = t + 1

    def fill_next_value(self, last_value: torch.Tensor) -> None:
        """Set ``next_value`` to V(obs_{t+1}) on every row not truncated; needs a full buffer.

        Args:
            last_value: [N] V of the observation that follows the last stored step.
        """
        if not self.full:
            raise RuntimeError(f"rollout incomplete: {self.step} of {self.num_steps} steps added")
        following = torch.cat([self.value[1:], last_value.reshape(1, -1).to(self.value)])
        self.next_value.copy_(torch.where(self.truncated, self.next_value, following))

    def minibatches(
        self, num_minibatches: int, generator: torch.Generator | None = None
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Shuffle the T * N samples and split them into ``num_minibatches`` minibatches.

        Sizes differ by at most one when T * N is not a multiple of ``num_minibatches``.

        Args:
            num_minibatches: number of minibatches per pass.
            generator: drives the shuffle (on the buffer's device or on CPU); None: global RNG.

        Yields:
            dicts with keys ``MINIBATCH_KEYS``: ``obs`` [B, obs_dim], ``action`` [B, act_dim],
            and [B] for the others; plus ``critic_obs`` [B, critic_obs_dim] when stored.
        """
        total = self.num_steps * self.num_envs
        if not 1 <= num_minibatches <= total:
            raise ValueError(f"num_minibatches must be in [1, {total}], got {num_minibatches}")
        gen_device = generator.device if generator is not None else self.device
        perm = torch.randperm(total, generator=generator, device=gen_device).to(self.device)
        flat = {key: getattr(self, key).flatten(0, 1) for key in MINIBATCH_KEYS}
        if self.critic_obs is not None:
            flat["critic_obs"] = self.critic_obs.flatten(0, 1)
        for idx in perm.tensor_split(num_minibatches):
            yield {key: value[idx] for key, value in flat.items()}

    def clear(self) -> None:
        """Start writing from step 0 again (contents are overwritten, not zeroed)."""
        self.step = 0
