"""FastTD3 (Seo et al. 2025, "FastTD3: Simple, Fast, and Capable Reinforcement Learning for
Humanoid Control").

TD3 made for many parallel worlds: large batches fed by every world at once and few updates
per transition; twin **distributional** critics (C51: a categorical return distribution on K
fixed atoms, trained by cross-entropy against the projected target distribution; Bellemare et
al. 2017) with clipped double Q (the target takes, per sample, the member whose distribution
has the lower mean); target policy smoothing; the actor every second critic update, from the
live actor (no target actor); fast target critics (tau 0.1); AdamW; running observation
normalization; exploration noise whose scale is drawn per world, uniform in
[std_min, std_max], and redrawn when the world's episode ends (so the worlds explore at
different scales at once). Replay, runner, checkpoints and export are the off-policy ones
(``OffPolicyLearner``):

    action = td3.act(obs)                          # normalizer updated; random until
    out = env.step(action)                         # learning_starts transitions
    td3.process_env_step(out.reward, out.terminated, out.truncated, out.info["final_obs"])
    metrics = td3.update(progress)

n-step returns (``num_steps``, the reference's ``num_steps``) follow each world through the
replay (``ReplayBuffer.n_step``); ``precision=bf16`` runs the updates under bfloat16 autocast
as the reference's ``amp`` does. Left out of the reference recipe: torch.compile/CUDA graphs,
reward normalization, SimbaV2 networks (levers of GPU runs; see benchmarks/README.md), the
cosine learning-rate schedule (constant here). Observations are normalized by the project's
``RunningNormalizer`` ((x - mean) / sqrt(var + 1e-8), clipped at +-10), where the reference
divides by std + 0.01 without a clip. The update itself is the reference's, checked against a
float64 re-derivation of it (tests/reference/test_sb3.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from robotrl.algos.off_policy_base import OffPolicyConfig, OffPolicyLearner
from robotrl.nn.actor import DeterministicActor
from robotrl.nn.ensemble import EnsembleQ
from robotrl.nn.mlp import mlp
from robotrl.nn.normalizer import RunningNormalizer
from robotrl.optim import adam
from robotrl.types import Obs, policy_obs


@dataclass
class FastTD3Config(OffPolicyConfig):
    """FastTD3 hyperparameters: the off-policy fields with the paper's recipe, sized for a
    2-core CPU (the reference's GPU sizes in brackets; per-task files in ``configs/tuned/``).

    The reference runs 128-4096 worlds, batch 32768 and critics 1024-512-256 on a GPU. On 2
    CPU cores the number of gradient steps per second bounds learning, so the batch is small
    and the updates per transition higher: batch 512 at 1/8 reached 4453 on HalfCheetah in 3
    minutes, batch 4096 at 1/64 stayed near 0, batch 1024 at 1/16 3164, 256 at 1/4 4011
    (benchmarks/README.md at commit 757c2c7, "FastTD3"). On a GPU, go back towards the reference sizes.
    """

    collect_steps: int = 4
    """Env steps per world between update phases (64 worlds x 4 = 256 transitions, then 32
    updates)."""
    utd_ratio: float = 1 / 8
    """Updates per transition [2 per step of 128-1024 worlds: 1/64-1/512]."""
    batch_size: int = 512
    """Transitions per update [32768]."""
    learning_starts: int = 4096
    """Uniform random transitions before learning [10 steps of every world]."""
    tau: float = 0.1
    """Polyak rate of the target critics [0.1]."""
    actor_update_interval: int = 2
    """Critic updates per actor update [2]."""
    actor_hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of the actor [512, 256, 128]."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of each critic [1024, 512, 256]."""
    num_atoms: int = 101
    """Atoms of the categorical return distribution [101]."""
    v_min: float = -250.0
    """Lowest atom: returns below it are clipped to it [-250; tasks set their range]."""
    v_max: float = 250.0
    """Highest atom; set it above the discounted return of a good policy (HalfCheetah's
    tuned file: 1500)."""
    std_min: float = 0.001
    """Smallest per-world exploration noise scale (actions in [-1, 1]) [0.001]."""
    std_max: float = 0.4
    """Largest per-world exploration noise scale [0.4]."""
    policy_noise: float = 0.001
    """Std of the target policy smoothing noise [0.001]."""
    noise_clip: float = 0.5
    """Clip of the smoothing noise [0.5]."""
    weight_decay: float = 0.1
    """AdamW's decoupled weight decay for both networks [0.1]."""
    normalize_obs: bool = True
    """Normalize observations by running statistics (folded into exports) [on]."""
    init_scale: float = 0.01
    """Std of the actor's output layer weights at init (biases 0) [0.01]."""
    num_steps: int = 1
    """n-step returns: the critics' target sums each world's next ``num_steps`` rewards
    (fewer where its episode ends or the newest step is reached) and bootstraps with
    gamma^m [1; 3 on DMC cheetah-run, 8 on Isaac Lab's velocity tasks]."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_atoms < 2:
            raise ValueError(f"num_atoms must be >= 2, got {self.num_atoms}")
        if not self.v_min < self.v_max:
            raise ValueError(f"v_min must be < v_max, got {self.v_min} and {self.v_max}")
        if not 0.0 <= self.std_min <= self.std_max:
            raise ValueError(f"need 0 <= std_min <= std_max, got {self.std_min}, {self.std_max}")
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        for name in ("policy_noise", "noise_clip", "weight_decay", "init_scale"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


# ---------------------------------------------------------------------------- pure functions
def categorical_projection(probs: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor,
                           support: torch.Tensor) -> torch.Tensor:
    """The distribution of r + discount Z on the fixed atoms (C51's projection, Bellemare et
    al. 2017, algorithm 1): each shifted atom's mass goes to its two neighbouring atoms in
    proportion to closeness; mass beyond the support goes to its end atom.

    Args:
        probs: [..., B, K] probabilities of Z on ``support``.
        reward: [B]; discount: [B] (gamma, or 0 where the episode terminated).
        support: [K] evenly spaced atoms v_min..v_max.
    Returns [..., B, K] probabilities (rows sum to the rows of ``probs``).
    """
    k = support.numel()
    v_min, v_max = support[0], support[-1]
    shifted = (reward[:, None] + discount[:, None] * support).clamp(v_min, v_max)  # [B, K]
    b = (shifted - v_min) / ((v_max - v_min) / (k - 1))  # fractional atom index in [0, K-1]
    lower = b.floor().clamp(0, k - 1)
    upper_weight = b - lower  # 0 where b is an atom (its upper neighbour then gets nothing)
    lower_idx = lower.long().expand_as(probs)
    upper_idx = (lower + 1).clamp(max=k - 1).long().expand_as(probs)
    out = torch.zeros_like(probs)
    out.scatter_add_(-1, lower_idx, probs * (1.0 - upper_weight))
    return out.scatter_add_(-1, upper_idx, probs * upper_weight)


def expected_value(probs: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """The mean E[Z], shape ``[...]``, of categorical probabilities ``[..., K]`` on ``support``
    ``[K]``, in their dtype (under ``precision=bf16`` too: the clipped double target picks its
    member by these means and the actor climbs them)."""
    with torch.autocast(probs.device.type, enabled=False):
        return probs @ support


def clipped_double_target(projected: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """Per sample, the member's projected target distribution with the lowest mean (clipped
    double Q on distributions, as FastTD3): [E, B, K] -> [B, K]."""
    pick = expected_value(projected, support).argmin(0)  # [B]
    return projected.gather(0, pick[None, :, None].expand(1, *projected.shape[1:]))[0]


def distributional_critic_loss(logits: torch.Tensor, target: torch.Tensor
                               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cross-entropy of every member's predicted distribution against the target one.

    Args:
        logits: [E, B, K] the critics at the stored (s, a).
        target: [B, K] the projected target distribution (no gradient).
    Returns ``(loss [], metrics)``: the sum over members of the batch-mean cross-entropy.
    """
    loss = -(target * logits.log_softmax(-1)).sum(-1).mean(-1).sum()
    return loss, {"loss/critic": loss.detach()}


def deterministic_actor_loss(q: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-E[min_e Q_e(s, pi(s))] for q [E, B] (critic parameters frozen)."""
    loss = -q.min(0).values.mean()
    return loss, {"loss/actor": loss.detach(), "train/q": q.detach().mean()}


METRIC_KEYS: tuple[str, ...] = (
    "loss/critic", "train/grad_norm/critic", "train/q", "loss/actor", "train/grad_norm/actor",
)
"""Per-update metrics, averaged over the updates of one ``update`` call."""


class FastTD3(OffPolicyLearner):
    """FastTD3 on flat observations; see the module docstring.

    Attributes:
        actor: MLP [B, obs_dim] -> pre-tanh actions [B, A] (the action is tanh of it).
        critic, critic_target: ``EnsembleQ`` with ``num_atoms`` logits per member.
        support: [K] the atoms.
        normalizer: ``RunningNormalizer`` over replay rows (state_dim), or None.
        noise_scale: [N, 1] each world's exploration noise std.
    """

    config_class = FastTD3Config
    name = "FastTD3"
    metric_keys = METRIC_KEYS
    cfg: FastTD3Config

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """``OffPolicyLearner``'s arguments."""
        super().__init__(*args, **kwargs)
        self.noise_scale = self._draw_scales()

    def _networks(self, state_dim: int, act_dim: int) -> tuple[nn.Module, EnsembleQ]:
        cfg = self.cfg
        actor = mlp(self.obs_dim, cfg.actor_hidden, act_dim, cfg.activation, ortho_init=False)
        nn.init.normal_(actor[-1].weight, 0.0, cfg.init_scale)
        nn.init.zeros_(actor[-1].bias)
        critic = EnsembleQ(state_dim, act_dim, cfg.critic_hidden, cfg.num_critics,
                           cfg.activation, out_dim=cfg.num_atoms)
        return actor, critic

    def _adam(self, params: Any, lr: float) -> torch.optim.Optimizer:
        return adam(params, lr, weight_decay=self.cfg.weight_decay)  # AdamW

    def _learning_state(self, act_dim: int) -> None:
        super()._learning_state(act_dim)
        cfg, dev = self.cfg, self.device
        self.support = torch.linspace(cfg.v_min, cfg.v_max, cfg.num_atoms, device=dev)
        self.normalizer = RunningNormalizer(self.state_dim).to(dev) if cfg.normalize_obs else None

    def _draw_scales(self) -> torch.Tensor:
        """[N, 1] noise scales uniform in [std_min, std_max], from the generator."""
        cfg = self.cfg
        u = torch.rand(self.num_envs, 1, generator=self.generator, device=self.device)
        return cfg.std_min + (cfg.std_max - cfg.std_min) * u

    def _norm(self, state: torch.Tensor) -> torch.Tensor:
        return state if self.normalizer is None else self.normalizer(state)

    def _policy(self, obs: torch.Tensor) -> torch.Tensor:
        """tanh(actor(obs)) for normalized ``policy`` columns [B, obs_dim]: [B, A]."""
        return torch.tanh(self.actor(obs))

    # ------------------------------------------------------------------ acting
    @torch.no_grad()
    def act(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """Exploration actions [N, A] in the env's bounds: the policy plus Gaussian noise of
        each world's scale, clipped; uniform random until ``learning_starts`` transitions."""
        state = self._state(obs)
        if self.normalizer is not None:
            self.normalizer.update(state)
        if self._warming_up():
            action = self._random_action(state.shape[0])
        else:
            mean = self._policy(self._actor_input(self._norm(state)))
            noise = torch.randn(mean.shape, generator=self.generator, device=self.device)
            action = (mean + noise * self.noise_scale).clamp(-1.0, 1.0)
        return self._record(state, action)

    @torch.no_grad()
    def process_env_step(self, reward: torch.Tensor, terminated: torch.Tensor,
                         truncated: torch.Tensor, final_obs: Obs | torch.Tensor) -> None:
        """Store the transitions (``OffPolicyLearner.process_env_step``); worlds whose episode
        ended draw a new noise scale."""
        done = (terminated | truncated).to(self.device, torch.bool)[:, None]
        self.noise_scale = torch.where(done, self._draw_scales(), self.noise_scale)
        super().process_env_step(reward, terminated, truncated, final_obs)

    @torch.no_grad()
    def act_deterministic(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """tanh(actor(normalized obs)) mapped to the bounds: [N, A]; records nothing."""
        policy = policy_obs(obs).to(self.device, torch.float32)
        if self.normalizer is not None:
            policy = self._policy_normalizer()(policy)
        return self._to_env(self._policy(policy))

    def _policy_normalizer(self) -> RunningNormalizer:
        """The normalizer's ``policy`` columns alone (replay rows may hold more groups)."""
        assert self.normalizer is not None
        if not self.extra_groups:
            return self.normalizer
        out = RunningNormalizer(self.obs_dim, self.normalizer.eps, self.normalizer.clip)
        out.mean.copy_(self.normalizer.mean[: self.obs_dim])
        out.var.copy_(self.normalizer.var[: self.obs_dim])
        out.count.copy_(self.normalizer.count)
        return out.to(self.device)

    def export_actor(self) -> DeterministicActor:
        """Frozen copy of ``act_deterministic``: normalizer, actor, tanh, bounds."""
        normalizer = None if self.normalizer is None else self._policy_normalizer()
        return DeterministicActor(self.actor, self.obs_dim, self.action_low, self.action_high,
                                  "tanh", normalizer)

    # ------------------------------------------------------------------ learning
    def _update_once(self) -> dict[str, torch.Tensor]:
        """One critic update (the actor on schedule) and the target critics' Polyak step;
        returns its METRIC_KEYS."""
        cfg = self.cfg
        if cfg.num_steps == 1:
            batch = self.buffer.sample(cfg.batch_size, self.generator)
            discount = cfg.gamma * (~batch["terminated"]).to(batch["reward"].dtype)
        else:
            idx = torch.randint(0, len(self.buffer), (cfg.batch_size,), generator=self.generator,
                                device=self.device)
            batch = self.buffer.n_step(idx, cfg.num_steps, cfg.gamma)
            discount = batch["discount"]
        state, next_state = self._norm(batch["obs"]), self._norm(batch["next_obs"])
        metrics = self._critic_update(state, batch["action"], batch["reward"], discount,
                                      next_state)
        self.num_updates += 1
        if self.num_updates % cfg.actor_update_interval == 0:
            metrics.update(self._actor_update(state))
        self._polyak()
        return metrics

    def _logits(self, critic: EnsembleQ, state: torch.Tensor, action: torch.Tensor
                ) -> torch.Tensor:
        """[E, B, K] logits in the atoms' dtype: under ``precision=bf16`` the atoms' layer
        multiplies in bfloat16, and the softmax, the projection and the loss run in float32."""
        return critic(state, action).to(self.support.dtype)

    def _critic_update(self, state: torch.Tensor, action: torch.Tensor, reward: torch.Tensor,
                       discount: torch.Tensor, next_state: torch.Tensor
                       ) -> dict[str, torch.Tensor]:
        """One step of the critics towards the projected target ``reward`` + ``discount`` Z'
        (``discount``: gamma^m, 0 where the episode terminated)."""
        cfg = self.cfg
        with torch.no_grad():
            next_mean = self._policy(self._actor_input(next_state))
            noise = torch.randn(next_mean.shape, generator=self.generator, device=self.device)
            noise = (noise * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
            next_action = (next_mean + noise).clamp(-1.0, 1.0)
            next_probs = self._logits(self.critic_target, next_state, next_action).softmax(-1)
            projected = categorical_projection(next_probs, reward, discount, self.support)
            target = clipped_double_target(projected, self.support)
        loss, metrics = distributional_critic_loss(self._logits(self.critic, state, action),
                                                   target)
        # no host sync per update: update() checks the critic columns once per call
        metrics[self.critic_step.metric] = self.critic_step(loss, check=False)
        return metrics

    def _actor_update(self, state: torch.Tensor) -> dict[str, torch.Tensor]:
        # frozen critic: the actor's backward pass skips the critics' weight gradients
        self.critic.requires_grad_(False)
        action = self._policy(self._actor_input(state))
        q = expected_value(self._logits(self.critic, state, action).softmax(-1), self.support)
        loss, metrics = deterministic_actor_loss(q)
        metrics[self.actor_step.metric] = self.actor_step(loss, check=False)
        self.critic.requires_grad_(True)
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """``OffPolicyLearner``'s state plus the normalizer and the noise scales."""
        state = {**super().state_dict(), "noise_scale": self.noise_scale.clone()}
        if self.normalizer is not None:
            state["normalizer"] = self.normalizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.noise_scale = state["noise_scale"].to(self.device)
        if self.normalizer is not None:
            self.normalizer.load_state_dict(state["normalizer"])
