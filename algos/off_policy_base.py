"""What the replay-based off-policy learners share (SAC, CrossQ, FastTD3).

``OffPolicyLearner`` owns the action bounds, the replay buffer of raw states, the sampling
generator, the counters of stored transitions and owed updates, and the off-policy protocol's
collection half (``robotrl.types.OffPolicyAlgorithm``): ``process_env_step`` stores the last
``act``'s transitions, ``update`` runs the gradient updates they earned (``utd_ratio`` per
transition) through the subclass's ``_update_once``, and owns the actor's and the critics'
optimizers and gradient steps. Subclasses build their networks (``_networks``), choose the
optimizer (``_adam``), add any other learned state (``_learning_state``), and act.

Replay rows hold the ``policy`` group then the groups ``cfg.critic_obs`` adds (an asymmetric
critic); actions are stored in (-1, 1) and mapped affinely to the env's bounds.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from robotrl.nn.linear import PRECISIONS, check_precision, precision_autocast
from robotrl.nn.mlp import ACTIVATIONS
from robotrl.optim import GradientStep, adam, run_owed_updates
from robotrl.storage.replay import ReplayBuffer
from robotrl.types import Obs, check_groups, policy_obs

if TYPE_CHECKING:
    from robotrl.types import BuildContext, EnvSpec


@dataclass
class OffPolicyConfig:
    """The replay, schedule and network fields every off-policy learner has."""

    collect_steps: int = 8
    """Env steps per world between update phases (one runner iteration: the checkpoint and
    eval intervals count these). 8 x 16 worlds = 128 transitions, then 128 updates."""
    utd_ratio: float = 1.0
    """Gradient updates per stored transition (summed over worlds); fractions carry over."""
    batch_size: int = 256
    """Transitions per gradient update."""
    buffer_size: int = 1_000_000
    """Replay capacity in transitions (~4 bytes x (2 obs_dim + act_dim + 3) each)."""
    save_replay: bool = True
    """Store the replay buffer in checkpoints: resume is then exact, but a full buffer adds
    ~capacity x row bytes (HalfCheetah, 1M rows: ~170 MB) to every checkpoint write."""
    learning_starts: int = 10_000
    """Transitions collected with uniform random actions before the first update."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak rate of the target critics: target <- (1 - tau) target + tau critic."""
    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""
    critic_lr: float = 3e-4
    """Adam learning rate of the critics."""
    actor_update_interval: int = 1
    """Update the actor every this many critic updates (TD3-style delay)."""
    num_critics: int = 2
    """Q ensemble size; targets take the minimum over members (clipped double Q)."""
    actor_hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of the actor."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of each critic."""
    activation: str = "relu"
    """Hidden activation: relu, tanh, elu, silu or gelu."""

    critic_obs: tuple[str, ...] = ("policy",)
    """Observation groups the critics see, concatenated in order, ``policy`` first;
    ``[policy, privileged]`` makes an asymmetric actor-critic (the actor sees ``policy``)."""
    precision: str = "float32"
    """float32, or bf16: each gradient update runs under autocast to bfloat16 (hidden layers'
    products in bfloat16; heads of at most ``robotrl.nn.linear.HEAD_MAX_OUT`` outputs,
    parameters, gradients and Adam's state in float32), as FastTD3's reference trains (its
    ``amp`` with bfloat16); acting and evaluation stay float32. Refused on a CPU without
    bfloat16 products (``robotrl.nn.linear.check_precision``)."""

    def __post_init__(self) -> None:
        self.actor_hidden = tuple(int(w) for w in self.actor_hidden)
        self.critic_hidden = tuple(int(w) for w in self.critic_hidden)
        self.critic_obs = check_groups(self.critic_obs, "critic_obs")
        if self.critic_obs[0] != "policy":
            raise ValueError(f"critic_obs must start with policy (the critic sees what the "
                             f"actor sees, then more), got {list(self.critic_obs)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {self.activation!r}; known: {', '.join(ACTIVATIONS)}"
            )
        positive = ("collect_steps", "batch_size", "buffer_size", "actor_update_interval")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_critics < 1:
            raise ValueError(f"num_critics must be >= 1, got {self.num_critics}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; known: "
                             f"{', '.join(PRECISIONS)}")
        if self.utd_ratio <= 0:
            raise ValueError(f"utd_ratio must be > 0, got {self.utd_ratio}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.learning_starts < 0:
            raise ValueError(f"learning_starts must be >= 0, got {self.learning_starts}")


class OffPolicyLearner:
    """Replay, generator, counters and the store/update protocol; see the module docstring.

    Attributes:
        actor, critic, critic_target: from ``_networks`` (no target: None).
        buffer: ``ReplayBuffer`` of raw states and (-1, 1) actions.
        generator: drives exploration noise, random warm-up actions and replay sampling.
    """

    config_class: type[OffPolicyConfig] = OffPolicyConfig
    """The config a learner built without one gets."""
    name = "off-policy"
    """The algorithm's name in errors."""
    target_critics = True
    """Polyak-averaged target critics give the TD targets (CrossQ has none)."""
    metric_keys: tuple[str, ...] = ()
    """What ``_update_once`` returns, in order; columns 0 and 1 are the critic loss and its
    gradient norm (checked once per ``update`` call)."""

    def __init__(
        self,
        obs_dim: int,
        action_low: torch.Tensor,
        action_high: torch.Tensor,
        num_envs: int,
        cfg: OffPolicyConfig | None = None,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        group_dims: dict[str, int] | None = None,
    ) -> None:
        """Args: ``action_low``/``action_high`` [A] finite bounds; ``seed`` of the generator
        (None: drawn from torch's global RNG after the network init, so ``torch.manual_seed``
        fixes it); ``group_dims`` the widths of ``cfg.critic_obs`` groups after ``policy``."""
        self.cfg = cfg = cfg if cfg is not None else self.config_class()
        self.device = dev = torch.device(device)
        check_precision(dev, cfg.precision)
        self.num_envs = num_envs
        low = torch.as_tensor(action_low, dtype=torch.float32).to(dev)
        high = torch.as_tensor(action_high, dtype=torch.float32).to(dev)
        if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
            raise ValueError(f"{self.name} needs finite action bounds (it squashes actions "
                             "with tanh)")
        self.action_low, self.action_high = low, high
        # the same float32 formulas as DeterministicActor's center/half_range: exports match
        self.action_scale = (high - low) / 2
        self.action_bias = (high + low) / 2
        self.act_dim = act_dim = low.numel()
        self.obs_dim = obs_dim
        self.extra_groups = cfg.critic_obs[1:]
        """Groups the critics see besides ``policy``; replay rows hold ``policy`` then these."""
        dims = group_dims or {}
        missing = [g for g in self.extra_groups if g not in dims]
        if missing:
            raise ValueError(f"critic_obs names {missing} but no width was given for them")
        self.state_dim = state_dim = obs_dim + sum(dims[g] for g in self.extra_groups)
        self.actor, self.critic = (m.to(dev) for m in self._networks(state_dim, act_dim))
        self.critic_target = (copy.deepcopy(self.critic).requires_grad_(False)
                              if self.target_critics else None)
        self._learning_state(act_dim)
        self.buffer = self._make_buffer(state_dim, act_dim)
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        self.generator = torch.Generator(device=dev)
        self.generator.manual_seed(seed)
        self.transitions = 0
        """Transitions stored so far (summed over worlds)."""
        self.num_updates = 0
        """Gradient updates of the critics so far."""
        self.owed_updates = 0.0
        """Updates earned by stored transitions (utd_ratio each) but not yet done."""
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None

    def _networks(self, state_dim: int, act_dim: int) -> tuple[nn.Module, nn.Module]:
        """(actor, critic) for replay rows of ``state_dim`` and ``act_dim`` actions."""
        raise NotImplementedError

    def _make_buffer(self, state_dim: int, act_dim: int) -> Any:
        """The replay: a ``ReplayBuffer`` of ``buffer_size`` rows of ``state_dim`` (pixel
        learners keep frames instead, ``robotrl.storage.frames``)."""
        return ReplayBuffer(self.cfg.buffer_size, state_dim, act_dim, self.device)

    def _adam(self, params: Any, lr: float) -> torch.optim.Optimizer:
        """The optimizer of one part (actor, critics, temperature); subclasses choose Adam's
        betas or weight decay."""
        return adam(params, lr)

    def _learning_state(self, act_dim: int) -> None:
        """The actor's and the critics' optimizers and gradient steps; subclasses add any
        other learned state (a temperature, a normalizer)."""
        cfg = self.cfg
        self.actor_opt = self._adam(self.actor.parameters(), cfg.actor_lr)
        self.critic_opt = self._adam(self.critic.parameters(), cfg.critic_lr)
        self.critic_step = GradientStep(self.name, "critic", self.critic_opt)
        self.actor_step = GradientStep(self.name, "actor", self.actor_opt)

    def _update_once(self) -> dict[str, torch.Tensor]:
        """One gradient update; returns the ``metric_keys`` it measured (a delayed actor
        update's keys are missing on the updates that skip it)."""
        raise NotImplementedError

    def _metric_row(self) -> torch.Tensor:
        """``_update_once`` as one row [K] of ``metric_keys``, NaN where it skipped a key."""
        with precision_autocast(self.device, self.cfg.precision):
            metrics = self._update_once()
        nan = torch.full((), math.nan, device=self.device)
        return torch.stack([metrics.get(key, nan) for key in self.metric_keys])

    @classmethod
    def build(cls, spec: EnvSpec, cfg: Any, ctx: BuildContext) -> OffPolicyLearner:
        """The learner for an env with ``spec`` (observation size, action bounds), ``cfg`` its
        config, on ``ctx.device`` for ``ctx.num_envs`` worlds (``robotrl.registry``)."""
        return cls(spec.obs_dim, spec.action_low, spec.action_high, ctx.num_envs, cfg, ctx.device,
                   group_dims={g: spec.group_dim([g]) for g in cfg.critic_obs[1:]})

    @classmethod
    def observations(cls, cfg: Any) -> tuple[str, ...]:
        """The groups of ``cfg.critic_obs`` (``policy`` first)."""
        return tuple(cfg.critic_obs)

    # ------------------------------------------------------------------ acting
    def _to_env(self, action: torch.Tensor) -> torch.Tensor:
        return action * self.action_scale + self.action_bias

    def _state(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """A replay row: the ``policy`` group then ``extra_groups``, [N, state_dim] float32."""
        policy = policy_obs(obs).to(self.device, torch.float32)
        if not self.extra_groups:
            return policy
        extra = [obs[g].to(self.device, torch.float32) for g in self.extra_groups]
        return torch.cat([policy, *extra], dim=-1)

    def _actor_input(self, state: torch.Tensor) -> torch.Tensor:
        """The ``policy`` columns of replay rows [B, state_dim]: [B, obs_dim]."""
        return state[:, : self.obs_dim] if self.extra_groups else state

    def _warming_up(self) -> bool:
        """Still collecting with uniform random actions (``learning_starts``)."""
        return self.transitions < self.cfg.learning_starts

    def _random_action(self, n: int) -> torch.Tensor:
        """[n, A] uniform in (-1, 1) from the generator."""
        return torch.rand(n, self.act_dim, generator=self.generator,
                          device=self.device) * 2.0 - 1.0

    def _record(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Keep ``act``'s (state, action in (-1, 1)) for ``process_env_step``; returns the
        action in the env's bounds."""
        if self._pending is not None:
            raise RuntimeError("act() called twice without process_env_step() in between")
        # cloned: the env may overwrite the tensor it passed as obs during step()
        self._pending = (state.clone(), action)
        return self._to_env(action)

    @torch.no_grad()
    def process_env_step(
        self,
        reward: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        final_obs: Obs | torch.Tensor,
    ) -> None:
        """Store the last ``act``'s transitions.

        Args:
            reward: [N].
            terminated, truncated: [N] bool.
            final_obs: the observation after the step, before any auto-reset
                (``info["final_obs"]``): the next state of every transition, so truncated
                episodes bootstrap from their true last state.
        """
        if self._pending is None:
            raise RuntimeError("process_env_step() called without a preceding act()")
        obs, action = self._pending
        self._pending = None
        dev = self.device
        self.buffer.add(obs, action, reward.to(dev, torch.float32), self._state(final_obs),
                        terminated.to(dev, torch.bool), truncated.to(dev, torch.bool))  # fmt: skip
        self.transitions += obs.shape[0]
        if self.transitions >= self.cfg.learning_starts:
            self.owed_updates += self.cfg.utd_ratio * obs.shape[0]

    # ------------------------------------------------------------------ learning
    def _polyak(self) -> None:
        """target critics <- (1 - tau) target + tau critics, in one foreach kernel."""
        if self.critic_target is not None:
            with torch.no_grad():
                torch._foreach_lerp_(list(self.critic_target.parameters()),
                                     list(self.critic.parameters()), self.cfg.tau)

    def update(self, progress: float = 0.0) -> dict[str, float]:
        """Do the updates earned since the last call (``utd_ratio`` per stored transition).

        Returns the metrics of ``metric_keys`` averaged over those updates (metrics of delayed
        actor updates over the updates that touched them) plus ``train/updates``; an empty
        dict while warming up.

        Raises:
            NonFiniteError: the critic loss or gradient became NaN/Inf (the caller keeps its
                last checkpoint).
        """
        if int(self.owed_updates) == 0 or len(self.buffer) < self.cfg.batch_size:
            return {}
        return run_owed_updates(self, self._metric_row, self.metric_keys, self.name)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizers, generator, counters (and replay if configured); subclasses
        add their other learned state."""
        state: dict[str, Any] = {
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "actor_opt": self.actor_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "generator": self.generator.get_state(),
            "counters": (self.transitions, self.num_updates, self.owed_updates),
        }
        if self.critic_target is not None:
            state["critic_target"] = self.critic_target.state_dict()
        if self.cfg.save_replay:
            state["replay"] = self.buffer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``; without a stored replay the buffer starts empty (and the
        run is then no longer an exact continuation)."""
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        if self.critic_target is not None:
            self.critic_target.load_state_dict(state["critic_target"])
        self.generator.set_state(state["generator"].cpu())
        self.transitions, self.num_updates, self.owed_updates = state["counters"]
        if "replay" in state:
            self.buffer.load_state_dict(state["replay"])
        self._pending = None
