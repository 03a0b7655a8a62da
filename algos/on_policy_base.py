"""What PPO and TRPO share: a Gaussian actor-critic acting in batched worlds into a rollout.

``GaussianOnPolicy`` owns the policy, the observation and return normalizers, the rollout
buffer and the sampling generator, and implements the collection half of the on-policy
protocol (``robotrl.types.OnPolicyAlgorithm``): ``act``, ``act_deterministic``,
``process_env_step`` and ``compute_returns`` (GAE), the state they need to resume, and
``export_actor`` (the export contract of ``robotrl.nn.actor``).
Subclasses add their optimizers and ``update``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from robotrl.algos.advantages import gae
from robotrl.nn.actor import DeterministicActor, FirstColumns
from robotrl.nn.normalizer import RunningNormalizer
from robotrl.nn.policy import GaussianActorCritic
from robotrl.storage.rollout import RolloutBuffer
from robotrl.types import Obs, policy_obs

if TYPE_CHECKING:
    from robotrl.types import BuildContext, EnvSpec


class GaussianOnPolicyConfig(Protocol):
    """Config fields ``GaussianOnPolicy`` reads (PPOConfig and TRPOConfig have them)."""

    rollout_steps: int
    gamma: float
    gae_lambda: float
    actor_hidden: tuple[int, ...]
    critic_hidden: tuple[int, ...]
    activation: str
    init_log_std: float
    min_action_std: float
    normalize_obs: bool
    reward_scaling: bool
    critic_obs: tuple[str, ...]


class GaussianOnPolicy:
    """Collection side of a GAE-based on-policy algorithm with a Gaussian actor-critic.

    Attributes:
        policy: the ``GaussianActorCritic``; it takes normalized observations.
        obs_normalizer: ``RunningNormalizer`` applied before the policy, or None.
        return_normalizer: running statistics of the discounted return (reward scaling), or None.
        discounted_return: [N] running discounted return of each world (reward scaling).
        buffer: the ``RolloutBuffer`` [rollout_steps, num_envs, ...]; it stores normalized obs.
        generator: drives action sampling (and the subclass's minibatch shuffling).
    """

    def __init__(
        self,
        obs_dim: int,
        action_low: torch.Tensor,
        action_high: torch.Tensor,
        num_envs: int,
        cfg: GaussianOnPolicyConfig,
        device: str | torch.device,
        seed: int | None,
        shared_backbone: bool = False,
        state_dependent_std: bool = False,
        group_dims: dict[str, int] | None = None,
    ) -> None:
        """Args: ``action_low``/``action_high`` [A] bounds; ``seed`` of the sampling generator
        (None: drawn from torch's global RNG after the network init, so ``torch.manual_seed``
        fixes it); ``group_dims`` the widths of the groups in ``cfg.critic_obs`` other than
        ``policy`` (an asymmetric critic)."""
        self.device = torch.device(device)
        self.num_envs = num_envs
        self.dtype = torch.get_default_dtype()
        """Floating dtype of the networks, the rollout and the bounds: torch's default when built
        (float32 unless the caller changed it; the reference tests build in float64)."""
        self.action_low = torch.as_tensor(action_low, dtype=self.dtype).to(self.device)
        self.action_high = torch.as_tensor(action_high, dtype=self.dtype).to(self.device)
        act_dim = self.action_low.numel()
        self.critic_groups = tuple(cfg.critic_obs)
        """Observation groups the critic sees, concatenated in this order."""
        self.asymmetric = self.critic_groups != ("policy",)
        dims = {"policy": obs_dim, **(group_dims or {})}
        missing = [g for g in self.critic_groups if g not in dims]
        if missing:
            raise ValueError(f"critic_obs names {missing} but no width was given for them "
                             f"(known: {list(dims)})")
        critic_dim = sum(dims[g] for g in self.critic_groups) if self.asymmetric else None
        half_range = (self.action_high - self.action_low) / 2
        half_range = torch.where(torch.isfinite(half_range), half_range, 0.0)  # unbounded: none
        min_std = cfg.min_action_std * half_range if cfg.min_action_std > 0 else None
        self.policy = GaussianActorCritic(
            obs_dim, act_dim, cfg.actor_hidden, cfg.critic_hidden, cfg.activation,
            shared_backbone, cfg.init_log_std, state_dependent_std, critic_obs_dim=critic_dim,
            min_std=min_std,
        ).to(self.device)  # fmt: skip
        norm = RunningNormalizer
        self.obs_normalizer = norm(obs_dim).to(self.device) if cfg.normalize_obs else None
        self.group_normalizers = nn.ModuleDict({
            g: norm(dims[g]) for g in self.critic_groups if g != "policy" and cfg.normalize_obs
        }).to(self.device)
        """One running normalizer per other group the critic sees (the same class as the
        policy's, whose statistics the critic shares)."""
        self.return_normalizer = norm(1).to(self.device) if cfg.reward_scaling else None
        self.discounted_return = torch.zeros(num_envs, device=self.device)
        self.buffer = RolloutBuffer(cfg.rollout_steps, num_envs, obs_dim, act_dim, self.device,
                                    self.dtype, critic_obs_dim=critic_dim)
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self._gamma, self._gae_lambda = cfg.gamma, cfg.gae_lambda
        self._pending = False  # act() recorded a step that process_env_step() has not closed

    @classmethod
    def build(cls, spec: EnvSpec, cfg: Any, ctx: BuildContext) -> GaussianOnPolicy:
        """The learner for an env with ``spec`` (observation size, action bounds), ``cfg`` its
        config, on ``ctx.device`` for ``ctx.num_envs`` worlds (``robotrl.registry``)."""
        groups = [g for g in cfg.critic_obs if g != "policy"]
        return cls(spec.obs_dim, spec.action_low, spec.action_high, ctx.num_envs, cfg, ctx.device,
                   group_dims={g: spec.group_dim([g]) for g in groups})

    @classmethod
    def observations(cls, cfg: Any) -> tuple[str, ...]:
        """``policy`` and the other groups of ``cfg.critic_obs``."""
        return ("policy", *(g for g in cfg.critic_obs if g != "policy"))

    def _normalize(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """The normalized ``policy`` group, [N, obs_dim] in ``dtype``."""
        obs = policy_obs(obs).to(self.device, self.dtype)
        return obs if self.obs_normalizer is None else self.obs_normalizer(obs)

    def _critic_input(self, obs: Obs | torch.Tensor, policy: torch.Tensor) -> torch.Tensor:
        """The critic's input: ``policy`` (the normalized policy group) when symmetric, else the
        ``critic_groups`` normalized and concatenated, [N, critic_obs_dim]."""
        if not self.asymmetric:
            return policy
        parts = []
        for group in self.critic_groups:
            if group == "policy":
                parts.append(policy)
                continue
            if not isinstance(obs, dict) or group not in obs:
                raise ValueError(f"the critic sees observation group {group!r}, but the "
                                 f"observation has {list(obs) if isinstance(obs, dict) else 'a bare tensor'}")
            x = obs[group].to(self.device, self.dtype)
            parts.append(self.group_normalizers[group](x) if group in self.group_normalizers
                         else x)
        return torch.cat(parts, dim=-1)

    @torch.no_grad()
    def act(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """Sample actions for ``obs`` (its ``policy`` group [N, obs_dim], and the critic's
        groups) and record the step; returns [N, A] clipped."""
        if self._pending:
            raise RuntimeError("act() called twice without process_env_step() in between")
        policy = policy_obs(obs).to(self.device, self.dtype)
        if self.obs_normalizer is not None:
            self.obs_normalizer.update(policy)
        for group, normalizer in self.group_normalizers.items():
            normalizer.update(obs[group].to(self.device, self.dtype))
        policy = self._normalize(policy)
        critic = self._critic_input(obs, policy) if self.asymmetric else None
        dist, value = self.policy(policy, critic)
        noise = torch.randn(
            dist.loc.shape, generator=self.generator, device=self.device, dtype=dist.loc.dtype
        )
        action = dist.loc + dist.scale * noise
        # written now: the env may overwrite the tensor it passed as obs during step()
        self.buffer.add_policy(policy, action, dist.log_prob(action).sum(-1), value, critic)
        self._pending = True
        return torch.clamp(action, self.action_low, self.action_high)

    def _value(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """V(obs) [N] from the critic's groups."""
        return self.policy.value(self._critic_input(obs, self._normalize(obs)))

    @torch.no_grad()
    def act_deterministic(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """Clipped mean action for ``obs`` (its ``policy`` group): [N, A]; records nothing."""
        action = self.policy.deterministic(self._normalize(obs))
        return torch.clamp(action, self.action_low, self.action_high)

    def export_actor(self) -> DeterministicActor:
        """Frozen copy of ``act_deterministic`` for sim2real export: normalizer, mean head, clip."""
        p = self.policy
        network = nn.Sequential(p.trunk, p.actor_head, FirstColumns(p.act_dim))
        return DeterministicActor(network, p.obs_dim, self.action_low, self.action_high,
                                  "clip", self.obs_normalizer)

    @torch.no_grad()
    def process_env_step(
        self,
        reward: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        final_obs: Obs | torch.Tensor,
    ) -> None:
        """Record the outcome of the last ``act``.

        Args:
            reward: [N].
            terminated: [N] bool.
            truncated: [N] bool.
            final_obs: last observation of each episode (before auto-reset); its value
                bootstraps the truncated rows.
        """
        if not self._pending:
            raise RuntimeError("process_env_step() called without a preceding act()")
        reward = reward.to(self.device, self.dtype)
        terminated = terminated.to(self.device, torch.bool)
        truncated = truncated.to(self.device, torch.bool)
        if self.return_normalizer is not None:
            self.discounted_return.mul_(self._gamma).add_(reward)
            self.return_normalizer.update(self.discounted_return)
            std = torch.sqrt(self.return_normalizer.var + 1e-8).to(reward.dtype)
            # clipped as in SB3's VecNormalize: the first steps' return variance can be ~0
            clip = self.return_normalizer.clip
            reward = torch.clamp(reward / std, -clip, clip)
            self.discounted_return.masked_fill_(terminated | truncated, 0.0)
        # V(final_obs) bootstraps the truncated rows. On a GPU every row is evaluated (a branch
        # on truncated.any() would sync with the host); on the CPU the branch is free and spares
        # a critic forward on most steps.
        truncation_value = None
        if truncated.device.type != "cpu" or bool(truncated.any()):
            truncation_value = self._value(final_obs)
        self.buffer.add_env(reward, terminated, truncated, truncation_value)
        self._pending = False

    @torch.no_grad()
    def compute_returns(self, last_obs: Obs | torch.Tensor) -> None:
        """Fill the buffer's next_value, advantages and returns from ``last_obs``."""
        buf = self.buffer
        buf.fill_next_value(self._value(last_obs))
        advantages, returns = gae(
            buf.reward,
            buf.value,
            buf.next_value,
            buf.terminated,
            buf.terminated | buf.truncated,
            self._gamma,
            self._gae_lambda,
        )
        buf.advantages.copy_(advantages)
        buf.returns.copy_(returns)

    def _explained_variance_and_normalize(self, normalize_advantages: bool) -> torch.Tensor:
        """[] explained variance of the rollout's values; standardizes advantages in place."""
        buf = self.buffer
        if not buf.full:
            raise RuntimeError(
                f"update() needs a full rollout: {buf.step} of {buf.num_steps} steps"
            )
        with torch.no_grad():
            returns_var = buf.returns.var()
            explained_variance = 1.0 - (buf.returns - buf.value).var() / returns_var
            explained_variance = torch.where(returns_var > 0, explained_variance, 0.0)
            if normalize_advantages:
                adv = buf.advantages
                adv.copy_((adv - adv.mean()) / (adv.std() + 1e-8))
        return explained_variance

    def _collection_state(self) -> dict[str, Any]:
        """Policy, normalizers, reward-scaling state and generator (tensors shared, not copied)."""
        return {
            "policy": self.policy.state_dict(),
            "obs_normalizer": _module_state(self.obs_normalizer),
            "group_normalizers": self.group_normalizers.state_dict(),
            "return_normalizer": _module_state(self.return_normalizer),
            "discounted_return": self.discounted_return,
            "generator": self.generator.get_state(),
        }

    def _load_collection_state(self, state: dict[str, Any]) -> None:
        """Restore what ``_collection_state`` returned; the rollout buffer starts empty."""
        self.policy.load_state_dict(state["policy"])
        for name in ("obs_normalizer", "return_normalizer"):
            module = getattr(self, name)
            if (module is None) != (state[name] is None):
                raise ValueError(f"{name} in the checkpoint does not match this config")
            if module is not None:
                module.load_state_dict(state[name])
        self.group_normalizers.load_state_dict(state.get("group_normalizers", {}))
        self.discounted_return.copy_(state["discounted_return"])
        self.generator.set_state(state["generator"].cpu())
        self.buffer.clear()
        self._pending = False


def _module_state(module: nn.Module | None) -> dict[str, Any] | None:
    return None if module is None else module.state_dict()
