"""Soft Actor-Critic (Haarnoja et al. 2018, "SAC: Off-Policy Maximum Entropy Deep RL with a
Stochastic Actor"; automatic temperature from "SAC Algorithms and Applications", 2018).

Tanh-squashed Gaussian actor, twin Q critics evaluated as one ensemble (one batched matmul per
layer), Polyak-averaged targets, learned temperature with target entropy -|A|. The off-policy
runner drives it with many worlds per update:

    action = sac.act(obs)                          # under torch.inference_mode(); random
    out = env.step(action)                         # until learning_starts transitions
    sac.process_env_step(out.reward, out.terminated, out.truncated, out.info["final_obs"])
    metrics = sac.update(progress)                 # utd_ratio updates per stored transition
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from robotrl.algos.optim import GradientStep, adam, run_owed_updates
from robotrl.nn.actor import DeterministicActor, FirstColumns
from robotrl.nn.ensemble import EnsembleQ
from robotrl.nn.mlp import ACTIVATIONS
from robotrl.nn.squashed_gaussian import SquashedGaussianActor
from robotrl.storage.replay import ReplayBuffer
from robotrl.types import Obs, check_groups, policy_obs

if TYPE_CHECKING:
    from robotrl.envs.base import EnvSpec
    from robotrl.types import BuildContext


@dataclass
class SACConfig:
    """SAC hyperparameters; defaults tuned for MuJoCo locomotion on a 2-core CPU.

    Per-task overrides live in ``configs/tuned/sac_<task>.yaml`` (see benchmarks/README.md).
    """

    num_steps: int = 8
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
    alpha_lr: float = 3e-4
    """Adam learning rate of log(alpha)."""
    init_alpha: float = 1.0
    """Initial entropy temperature."""
    autotune_alpha: bool = True
    """Learn alpha to hold the policy entropy at ``target_entropy`` (else alpha is fixed)."""
    target_entropy: float | None = None
    """Entropy target of the temperature loss; None: -action_dim (Haarnoja et al. 2018b)."""
    actor_update_interval: int = 1
    """Update the actor (and alpha) every this many critic updates (TD3-style delay)."""
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

    def __post_init__(self) -> None:
        self.actor_hidden = tuple(int(w) for w in self.actor_hidden)
        self.critic_hidden = tuple(int(w) for w in self.critic_hidden)
        self.critic_obs = check_groups(self.critic_obs, "critic_obs")
        if self.critic_obs[0] != "policy":
            raise ValueError(f"SAC's critic_obs must start with policy (the critic sees what "
                             f"the actor sees, then more), got {list(self.critic_obs)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {self.activation!r}; known: {', '.join(ACTIVATIONS)}"
            )
        positive = ("num_steps", "batch_size", "buffer_size", "actor_update_interval")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_critics < 1:
            raise ValueError(f"num_critics must be >= 1, got {self.num_critics}")
        if self.utd_ratio <= 0:
            raise ValueError(f"utd_ratio must be > 0, got {self.utd_ratio}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.init_alpha <= 0:
            raise ValueError(f"init_alpha must be > 0, got {self.init_alpha}")
        if self.learning_starts < 0:
            raise ValueError(f"learning_starts must be >= 0, got {self.learning_starts}")


# ---------------------------------------------------------------------------- pure losses
def soft_td_target(
    reward: torch.Tensor,
    terminated: torch.Tensor,
    next_q: torch.Tensor,
    next_log_prob: torch.Tensor,
    alpha: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """r + gamma (1 - terminated) (min_e Q'_e(s', a') - alpha log pi(a'|s')): [B].

    Args:
        reward: [B]; terminated: [B] bool (truncated rows bootstrap: their s' is the final
            observation of the cut episode).
        next_q: [E, B] target critics at (s', a'), a' ~ pi(s').
        next_log_prob: [B] log pi(a'|s').
        alpha: [] temperature.
    """
    soft_value = next_q.min(0).values - alpha * next_log_prob
    return reward + gamma * (~terminated) * soft_value


def critic_loss(q: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Soft Bellman residual of every ensemble member (SAC eq. 5).

    Args:
        q: [E, B] Q_e(s, a) of the stored actions.
        target: [B] r + gamma (1 - terminated) (min_e Q'_e(s', a') - alpha log pi(a'|s')).

    Returns:
        ``(loss [], metrics)``: the sum over members of half the mean squared error.
    """
    loss = 0.5 * (q - target).square().mean(-1).sum()
    return loss, {"loss/critic": loss.detach(), "train/q": q.detach().mean()}


def actor_loss(
    log_prob: torch.Tensor, q: torch.Tensor, alpha: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy loss E[alpha log pi(a|s) - min_e Q_e(s, a)], a ~ pi reparameterized (SAC eq. 12).

    Args:
        log_prob: [B] log pi of the sampled actions.
        q: [E, B] critics at the sampled actions (critic parameters frozen).
        alpha: [] temperature (detached).
    """
    loss = (alpha * log_prob - q.min(0).values).mean()
    return loss, {"loss/actor": loss.detach(), "train/entropy": -log_prob.detach().mean()}


def temperature_loss(
    log_alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-log(alpha) E[log pi + target_entropy]: alpha rises while entropy is below the target.

    Parameterized by log(alpha) as most implementations are (the paper writes alpha); the
    gradient sign, and hence the fixed point entropy = target, is the same.
    """
    loss = -(log_alpha * (log_prob.detach() + target_entropy)).mean()
    return loss, {"loss/alpha": loss.detach()}


METRIC_KEYS: tuple[str, ...] = (
    "loss/critic", "train/grad_norm/critic", "train/q", "loss/actor", "train/grad_norm/actor",
    "train/entropy", "loss/alpha", "train/grad_norm/alpha", "train/alpha",
)
"""Per-update metrics, averaged over the updates of one ``update`` call."""


class SAC:
    """SAC on flat observations; see the module docstring for the call protocol.

    Attributes:
        actor: ``SquashedGaussianActor`` (actions in (-1, 1), mapped affinely to the bounds).
        critic, critic_target: ``EnsembleQ`` of ``num_critics`` members.
        log_alpha: [] learnable log temperature.
        buffer: ``ReplayBuffer`` of raw observations and (-1, 1) actions.
        generator: drives exploration noise, random warm-up actions and replay sampling.
    """

    def __init__(
        self,
        obs_dim: int,
        action_low: torch.Tensor,
        action_high: torch.Tensor,
        num_envs: int,
        cfg: SACConfig | None = None,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        group_dims: dict[str, int] | None = None,
    ) -> None:
        """Args: ``action_low``/``action_high`` [A] finite bounds; ``seed`` of the generator
        (None: drawn from torch's global RNG, so ``torch.manual_seed`` fixes it);
        ``group_dims`` the widths of ``cfg.critic_obs`` groups after ``policy``."""
        self.cfg = cfg = cfg if cfg is not None else SACConfig()
        self.device = dev = torch.device(device)
        self.num_envs = num_envs
        low = torch.as_tensor(action_low, dtype=torch.float32).to(dev)
        high = torch.as_tensor(action_high, dtype=torch.float32).to(dev)
        if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
            raise ValueError("SAC needs finite action bounds (it squashes actions with tanh)")
        self.action_low, self.action_high = low, high
        # the same float32 formulas as DeterministicActor's center/half_range: exports match
        self.action_scale = (high - low) / 2
        self.action_bias = (high + low) / 2
        act_dim = low.numel()
        self.obs_dim = obs_dim
        self.extra_groups = cfg.critic_obs[1:]
        """Groups the critics see besides ``policy``; replay rows hold ``policy`` then these."""
        dims = group_dims or {}
        missing = [g for g in self.extra_groups if g not in dims]
        if missing:
            raise ValueError(f"critic_obs names {missing} but no width was given for them")
        state_dim = obs_dim + sum(dims[g] for g in self.extra_groups)
        self.actor, self.critic = (m.to(dev) for m in self._networks(state_dim, act_dim))
        self.critic_target = (copy.deepcopy(self.critic).requires_grad_(False)
                              if self.target_critics else None)
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=dev, requires_grad=True)
        self.target_entropy = (
            -float(act_dim) if cfg.target_entropy is None else float(cfg.target_entropy)
        )
        self.actor_opt = adam(self.actor.parameters(), cfg.actor_lr, self.betas)
        self.critic_opt = adam(self.critic.parameters(), cfg.critic_lr, self.betas)
        self.alpha_opt = adam([self.log_alpha], cfg.alpha_lr, self.betas)
        self.critic_step = GradientStep(self.name, "critic", self.critic_opt)
        self.actor_step = GradientStep(self.name, "actor", self.actor_opt)
        self.alpha_step = GradientStep(self.name, "alpha", self.alpha_opt)
        self.buffer = ReplayBuffer(cfg.buffer_size, state_dim, act_dim, dev)
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

    name = "SAC"
    """The algorithm's name in errors."""
    target_critics = True
    """Polyak-averaged target critics give the TD targets (CrossQ has none)."""
    betas = (0.9, 0.999)
    """Adam's betas for every optimizer."""

    def _networks(self, state_dim: int, act_dim: int) -> tuple[SquashedGaussianActor, EnsembleQ]:
        """(actor, critic ensemble) for replay rows of ``state_dim`` and ``act_dim`` actions."""
        cfg = self.cfg
        return (SquashedGaussianActor(self.obs_dim, act_dim, cfg.actor_hidden, cfg.activation),
                EnsembleQ(state_dim, act_dim, cfg.critic_hidden, cfg.num_critics, cfg.activation))

    @classmethod
    def build(cls, spec: EnvSpec, cfg: Any, ctx: BuildContext) -> SAC:
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

    @torch.no_grad()
    def act(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """Exploration actions [N, A] in the env's bounds for ``obs`` (its ``policy`` group
        [N, obs_dim]); uniform random until ``learning_starts`` transitions are stored."""
        if self._pending is not None:
            raise RuntimeError("act() called twice without process_env_step() in between")
        state = self._state(obs)
        obs = self._actor_input(state)
        if self.transitions < self.cfg.learning_starts:
            action = torch.rand(obs.shape[0], self.action_scale.numel(), generator=self.generator,
                                device=self.device) * 2.0 - 1.0  # fmt: skip
        else:
            action, _ = self.actor.sample(obs, self.generator)
        # cloned: the env may overwrite the tensor it passed as obs during step()
        self._pending = (state.clone(), action)
        return self._to_env(action)

    @torch.no_grad()
    def act_deterministic(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """Mean action tanh(mu(obs)) mapped to the bounds: [N, A]; records nothing."""
        policy = policy_obs(obs).to(self.device, torch.float32)
        return self._to_env(self.actor.deterministic(policy))

    def export_actor(self) -> DeterministicActor:
        """Frozen copy of ``act_deterministic`` for sim2real export: mean head, tanh, bounds."""
        network = nn.Sequential(self.actor.net, FirstColumns(self.actor.act_dim))
        return DeterministicActor(network, self.obs_dim, self.action_low, self.action_high,
                                  "tanh")

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
    def _update_once(self) -> torch.Tensor:
        """One critic update (and actor/alpha on schedule); returns METRIC_KEYS values [K]."""
        cfg = self.cfg
        batch = self.buffer.sample(cfg.batch_size, self.generator)
        alpha = self.log_alpha.detach().exp()
        metrics = self._critic_update(batch, alpha)
        self.num_updates += 1
        if self.num_updates % cfg.actor_update_interval == 0:
            metrics.update(self._actor_update(batch, alpha))
        if self.critic_target is not None:
            with torch.no_grad():
                target_params = list(self.critic_target.parameters())
                torch._foreach_lerp_(target_params, list(self.critic.parameters()), cfg.tau)
        metrics["train/alpha"] = alpha
        nan = torch.full((), math.nan, device=self.device)
        return torch.stack([metrics.get(key, nan) for key in METRIC_KEYS])

    def _critic_update(self, batch: dict[str, torch.Tensor], alpha: torch.Tensor
                       ) -> dict[str, torch.Tensor]:
        """One step of the critics on ``batch`` towards the target critics' soft TD target."""
        with torch.no_grad():
            next_action, next_log_prob = self.actor.sample(self._actor_input(batch["next_obs"]),
                                                           self.generator)
            next_q = self.critic_target(batch["next_obs"], next_action)
            target = soft_td_target(batch["reward"], batch["terminated"], next_q, next_log_prob,
                                    alpha, self.cfg.gamma)
        q = self.critic(batch["obs"], batch["action"])
        return self._critic_step(q, target)

    def _critic_step(self, q: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        c_loss, metrics = critic_loss(q, target)
        # no host sync per update: update() checks the critic columns once per call
        metrics[self.critic_step.metric] = self.critic_step(c_loss, check=False)
        return metrics

    def _actor_update(self, batch: dict[str, torch.Tensor], alpha: torch.Tensor
                      ) -> dict[str, torch.Tensor]:
        """One step of the actor (and the temperature) on ``batch``'s states."""
        # frozen critic: the actor's backward pass skips the critics' weight gradients
        self.critic.requires_grad_(False)
        action, log_prob = self.actor.sample(self._actor_input(batch["obs"]), self.generator)
        a_loss, metrics = actor_loss(log_prob, self.critic(batch["obs"], action), alpha)
        metrics[self.actor_step.metric] = self.actor_step(a_loss, check=False)
        self.critic.requires_grad_(True)
        if self.cfg.autotune_alpha:
            t_loss, t_metrics = temperature_loss(self.log_alpha, log_prob, self.target_entropy)
            t_metrics[self.alpha_step.metric] = self.alpha_step(t_loss, check=False)
            metrics.update(t_metrics)
        return metrics

    def update(self, progress: float = 0.0) -> dict[str, float]:
        """Do the updates earned since the last call (``utd_ratio`` per stored transition).

        Returns the metrics of METRIC_KEYS averaged over those updates (actor/alpha metrics
        over the updates that touched them) plus ``train/updates``; an empty dict while
        warming up.

        Raises:
            NonFiniteError: the critic loss or gradient became NaN/Inf (the caller keeps its
                last checkpoint).
        """
        if int(self.owed_updates) == 0 or len(self.buffer) < self.cfg.batch_size:
            return {}
        return run_owed_updates(self, self._update_once, METRIC_KEYS, self.name)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizers, temperature, generator, counters (and replay if configured)."""
        state = {
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(),
            "actor_opt": self.actor_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "alpha_opt": self.alpha_opt.state_dict(),
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
        if self.critic_target is not None:
            self.critic_target.load_state_dict(state["critic_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.alpha_opt.load_state_dict(state["alpha_opt"])
        self.generator.set_state(state["generator"].cpu())
        self.transitions, self.num_updates, self.owed_updates = state["counters"]
        if "replay" in state:
            self.buffer.load_state_dict(state["replay"])
        self._pending = None

