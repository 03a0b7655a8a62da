"""Contrastive RL for goal-conditioned control (Eysenbach et al. 2022, "Contrastive Learning as
Goal-Conditioned RL"), with the deep residual networks of Wang et al. 2025 ("1000 Layer
Networks for Self-Supervised RL").

The critic is an energy between a state-action embedding phi(s, a) and a goal embedding psi(g);
trained with InfoNCE on (s_t, a_t, s_{t+k}) triples of one episode (k geometric with the
discount), exp(energy) estimates the discounted occupancy of the goal, up to a function of g:
the critic *is* the goal-reaching value, learned without rewards. The actor is a tanh-Gaussian
on (state, goal) maximizing the energy with SAC's automatic entropy tuning. No target networks,
no reward: the env's reward is ignored, ``info["success"]`` only reports.

Driven by the off-policy runner:

    action = crl.act(obs)                 # obs["policy"] holds the goal at spec.goal.columns
    out = env.step(action)
    crl.process_env_step(out.reward, out.terminated, out.truncated, out.info["final_obs"])
    metrics = crl.update(progress)        # utd_ratio updates per stored transition

Energies and contrastive losses are named variants in ``ENERGIES`` and ``CONTRASTIVE_LOSSES``,
each a pure function with hand-worked tests. Where JaxGCRL's CRL (Bortkiewicz et al. 2024,
``agents/crl``) differs, a config field switches to its choice (the reference test sets them):
``actor_first``, ``temperature_on_alpha``, ``log_std_tanh``, ``layer_norm_eps``,
``squash_epsilon``, ``logsumexp_offset`` and the ``norm`` energy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from robotrl.algos.sac import temperature_loss
from robotrl.nn.actor import DeterministicActor, FirstColumns
from robotrl.nn.residual import DeepResNet
from robotrl.nn.squashed_gaussian import SquashedGaussianActor
from robotrl.optim import GradientStep, adam, run_owed_updates
from robotrl.storage.trajectory import TrajectoryReplay
from robotrl.types import Obs, policy_obs

if TYPE_CHECKING:
    from robotrl.types import BuildContext, EnvSpec


# ---------------------------------------------------------------------------- energies
def energy_l2(phi: torch.Tensor, psi: torch.Tensor) -> torch.Tensor:
    """-||phi_i - psi_j||_2: [..., P, D] x [..., Q, D] -> [..., P, Q] (scaling-crl's default)."""
    return -torch.cdist(phi, psi)


def energy_norm(phi: torch.Tensor, psi: torch.Tensor) -> torch.Tensor:
    """-sqrt(||phi_i - psi_j||^2 + 1e-6): [..., P, D] x [..., Q, D] -> [..., P, Q] (JaxGCRL's
    ``norm`` energy, its default: ``l2`` with a guard that keeps the gradient finite at 0)."""
    return -((phi.unsqueeze(-2) - psi.unsqueeze(-3)).square().sum(-1) + 1e-6).sqrt()


def energy_l2_squared(phi: torch.Tensor, psi: torch.Tensor) -> torch.Tensor:
    """-||phi_i - psi_j||_2^2: [..., P, D] x [..., Q, D] -> [..., P, Q]."""
    return -(phi.unsqueeze(-2) - psi.unsqueeze(-3)).square().sum(-1)


def energy_dot(phi: torch.Tensor, psi: torch.Tensor) -> torch.Tensor:
    """phi_i . psi_j: [..., P, D] x [..., Q, D] -> [..., P, Q] (the original CRL critic)."""
    return phi @ psi.transpose(-1, -2)


def energy_cosine(phi: torch.Tensor, psi: torch.Tensor) -> torch.Tensor:
    """cos(phi_i, psi_j): [..., P, D] x [..., Q, D] -> [..., P, Q]."""
    return F.normalize(phi, dim=-1) @ F.normalize(psi, dim=-1).transpose(-1, -2)


ENERGIES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "l2": energy_l2, "l2_squared": energy_l2_squared, "dot": energy_dot, "cosine": energy_cosine,
    "norm": energy_norm,
}
"""Energy name -> pairwise energy (higher: the goal is likelier under the state-action)."""


def paired_energy(name: str, phi: torch.Tensor, psi: torch.Tensor) -> torch.Tensor:
    """The energy of row i with row i only: [B, D] x [B, D] -> [B]."""
    return ENERGIES[name](phi.unsqueeze(1), psi.unsqueeze(1))[:, 0, 0]


# ---------------------------------------------------------------------------- contrastive losses
def infonce_forward(logits: torch.Tensor) -> torch.Tensor:
    """-mean_i [l_ii - logsumexp_j l_ij]: each state-action picks its own goal among the
    batch's goals. ``logits`` [B, B], positives on the diagonal -> []."""
    return -(logits.diagonal() - logits.logsumexp(1)).mean()


def infonce_backward(logits: torch.Tensor) -> torch.Tensor:
    """-mean_j [l_jj - logsumexp_i l_ij]: each goal picks its own state-action. [B, B] -> []."""
    return -(logits.diagonal() - logits.logsumexp(0)).mean()


def infonce_symmetric(logits: torch.Tensor) -> torch.Tensor:
    """Forward plus backward InfoNCE (CLIP's symmetric loss, summed). [B, B] -> []."""
    return infonce_forward(logits) + infonce_backward(logits)


CONTRASTIVE_LOSSES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "forward": infonce_forward, "backward": infonce_backward, "symmetric": infonce_symmetric,
}
"""InfoNCE variant name -> loss of a [B, B] logit matrix with positives on the diagonal."""


def logsumexp_penalty(logits: torch.Tensor, offset: float = 0.0) -> torch.Tensor:
    """mean_i (logsumexp_j l_ij + offset)^2: keeps the forward normalizer near 1, which pins
    the free per-state offset InfoNCE leaves (JaxGCRL's regularizer, whose logits carry
    ``offset`` 1e-6). [B, B] -> []."""
    return (logits.logsumexp(1) + offset).square().mean()


def critic_loss(logits: torch.Tensor, variant: str, penalty: float, offset: float = 0.0
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """InfoNCE ``variant`` plus ``penalty`` x the logsumexp penalty (``offset`` added to the
    logits inside it) on ``logits`` [B, B] (row: state-action i, column: goal j, positives on
    the diagonal).

    Metrics: ``loss/critic``, ``train/accuracy`` (rows whose largest logit is their own goal),
    ``train/logits_pos`` and ``train/logits_neg`` (mean diagonal / off-diagonal logit).
    """
    loss = CONTRASTIVE_LOSSES[variant](logits)
    if penalty:
        loss = loss + penalty * logsumexp_penalty(logits, offset)
    with torch.no_grad():
        b = logits.shape[0]
        diag = logits.diagonal()
        eye = torch.eye(b, dtype=torch.bool, device=logits.device)
        metrics = {"loss/critic": loss.detach(),
                   "train/accuracy": (logits.argmax(1) == torch.arange(b, device=logits.device))
                   .to(logits.dtype).mean(),
                   "train/logits_pos": diag.mean(),
                   "train/logits_neg": logits.masked_select(~eye).mean() if b > 1 else diag.mean()}
    return loss, metrics


def actor_loss(energy: torch.Tensor, log_prob: torch.Tensor, alpha: torch.Tensor
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """E[alpha log pi(a|s,g) - f(phi(s, a), psi(g))], a ~ pi reparameterized.

    Args: ``energy`` [B] of the sampled actions with their goals (critic frozen); ``log_prob``
    [B]; ``alpha`` [] (detached).
    """
    loss = (alpha * log_prob - energy).mean()
    return loss, {"loss/actor": loss.detach(), "train/entropy": -log_prob.detach().mean()}


def alpha_scaled_temperature_loss(log_alpha: torch.Tensor, log_prob: torch.Tensor,
                                  target_entropy: float
                                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """alpha E[-log pi - target_entropy] (JaxGCRL's ``alpha_loss``): the same fixed point as
    ``sac.temperature_loss`` (log(alpha) E[...]), its gradient scaled by alpha. [B] -> []."""
    loss = log_alpha.exp() * (-log_prob.detach() - target_entropy).mean()
    return loss, {"loss/alpha": loss.detach()}


JAXGCRL_LOG_STD = (-5.0, 2.0)
"""Range the ``log_std_tanh`` actor squashes its log std into (JaxGCRL's Actor)."""


class TanhLogStdActor(SquashedGaussianActor):
    """``SquashedGaussianActor`` whose log std is squashed into ``JAXGCRL_LOG_STD`` by tanh,
    lo + (hi - lo) (tanh(x) + 1) / 2 (JaxGCRL's Actor, from SpinUp / Yarats), instead of
    clamped."""

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, raw = self.net(obs).chunk(2, dim=-1)
        lo, hi = JAXGCRL_LOG_STD
        return mean, lo + 0.5 * (hi - lo) * (torch.tanh(raw) + 1.0)


@dataclass
class CRLConfig:
    """Contrastive RL; defaults for small goal tasks on a 2-core CPU (``reacher_goal``).

    The paper's depth axis is ``critic_depth`` / ``actor_depth`` (dense layers in residual
    blocks of 4: 4, 8, ..., 1024).
    """

    collect_steps: int = 4
    """Env steps per world between update phases (one runner iteration)."""
    utd_ratio: float = 0.25
    """Gradient updates per stored transition (summed over worlds); fractions carry over."""
    batch_size: int = 256
    """Triples per update; each is the others' negatives (B x B logits)."""
    buffer_steps: int = 4096
    """Trajectory replay length in steps per world (x num_envs transitions)."""
    learning_starts: int = 4096
    """Transitions collected with uniform random actions before the first update."""
    gamma: float = 0.99
    """Discount of the goal distribution: future offsets k ~ gamma^(k-1), within the episode."""
    repr_dim: int = 64
    """Width of phi(s, a) and psi(g)."""
    critic_width: int = 256
    """Width of both encoders."""
    critic_depth: int = 4
    """Dense layers in the encoders' residual blocks (a multiple of 4)."""
    actor_width: int = 256
    """Width of the actor."""
    actor_depth: int = 4
    """Dense layers in the actor's residual blocks (a multiple of 4)."""
    energy: str = "l2"
    """Critic energy f(phi, psi): l2 (negative L2 distance), l2_squared, dot or cosine."""
    contrastive_loss: str = "forward"
    """InfoNCE variant: forward, backward or symmetric."""
    logsumexp_penalty: float = 0.1
    """Weight of the logsumexp-squared regularizer (0: off)."""
    critic_lr: float = 3e-4
    """Adam learning rate of both encoders."""
    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""
    alpha_lr: float = 3e-4
    """Adam learning rate of log(alpha)."""
    init_alpha: float = 1.0
    """Initial entropy temperature."""
    target_entropy: float | None = None
    """Entropy target; None: -0.5 x action_dim (JaxGCRL's CRL)."""
    checkpoint_activations: bool = False
    """Recompute residual blocks in the backward pass (memory of one block, ~1.3x time)."""
    bf16: bool = False
    """Run the networks under bfloat16 autocast (losses in float32)."""
    save_replay: bool = True
    """Store the trajectory replay in checkpoints (exact resume)."""
    actor_first: bool = False
    """Update the actor and temperature before the critic, against the critic before its step
    (JaxGCRL's ``update_networks``); False: after it, against the updated critic."""
    temperature_on_alpha: bool = False
    """Temperature loss alpha E[-log pi - H_target] (JaxGCRL) instead of log(alpha) E[...]
    (``sac.temperature_loss``): the same fixed point, the gradient scaled by alpha."""
    log_std_tanh: bool = False
    """Squash the actor's log std into [-5, 2] with tanh (JaxGCRL's Actor) instead of
    clamping it to [-20, 2]."""
    layer_norm_eps: float = 1e-5
    """Epsilon of every LayerNorm of the encoders and the actor (PyTorch's 1e-5; Flax's, in
    JaxGCRL: 1e-6)."""
    squash_epsilon: float = 0.0
    """log pi's tanh correction log(1 - tanh(u)^2 + eps) (JaxGCRL: 1e-6); 0: the exact term."""
    logsumexp_offset: float = 0.0
    """Added to the logits inside the logsumexp penalty (JaxGCRL: 1e-6)."""

    def __post_init__(self) -> None:
        for name, known in (("energy", ENERGIES), ("contrastive_loss", CONTRASTIVE_LOSSES)):
            if getattr(self, name) not in known:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; known: "
                                 f"{', '.join(known)}")
        for name in ("collect_steps", "batch_size", "repr_dim", "critic_width", "actor_width"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("critic_depth", "actor_depth"):
            depth = getattr(self, name)
            if depth < 4 or depth % 4:
                raise ValueError(f"{name} must be a positive multiple of 4 (dense layers in "
                                 f"residual blocks of 4), got {depth}")
        if self.buffer_steps < 2:
            raise ValueError(f"buffer_steps must be >= 2, got {self.buffer_steps}")
        if self.utd_ratio <= 0:
            raise ValueError(f"utd_ratio must be > 0, got {self.utd_ratio}")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")
        if self.init_alpha <= 0 or self.learning_starts < 0 or self.logsumexp_penalty < 0:
            raise ValueError("init_alpha must be > 0, learning_starts and logsumexp_penalty >= 0")
        if self.layer_norm_eps <= 0 or self.squash_epsilon < 0:
            raise ValueError("layer_norm_eps must be > 0 and squash_epsilon >= 0")


METRIC_KEYS: tuple[str, ...] = (
    "loss/critic", "train/grad_norm/critic", "train/accuracy", "train/logits_pos",
    "train/logits_neg", "loss/actor", "train/grad_norm/actor", "train/entropy", "loss/alpha",
    "train/grad_norm/alpha", "train/alpha", "train/goal_offset",
)
"""Per-update metrics, averaged over one ``update`` call."""


class CRL:
    """Contrastive RL on a goal-conditioned env (``spec.goal``); see the module docstring.

    Attributes:
        actor: ``SquashedGaussianActor`` on the whole ``policy`` observation (goal included).
        sa_encoder: phi, [state, action] -> [repr_dim] (state: ``policy`` minus the goal).
        g_encoder: psi, goal -> [repr_dim].
        buffer: ``TrajectoryReplay`` of raw observations and (-1, 1) actions.
    """

    def __init__(self, spec: EnvSpec, cfg: CRLConfig, num_envs: int,
                 device: str | torch.device = "cpu", seed: int | None = None) -> None:
        if spec.goal is None:
            raise ValueError(f"CRL learns goal-conditioned tasks; {spec.task!r} has no goal "
                             "(the goal tasks: robotrl.envs.list_tasks(goal=True))")
        self.cfg, self.spec, self.num_envs = cfg, spec, num_envs
        self.device = dev = torch.device(device)
        low = spec.action_low.to(dev, torch.float32)
        high = spec.action_high.to(dev, torch.float32)
        self.action_low, self.action_high = low, high
        self.action_scale, self.action_bias = (high - low) / 2, (high + low) / 2
        act_dim, obs_dim = spec.action_dim, spec.obs_dim
        self.goal_cols = torch.tensor(spec.goal.columns, device=dev)
        self.achieved_cols = torch.tensor(spec.goal.achieved, device=dev)
        keep = [c for c in range(obs_dim) if c not in spec.goal.columns]
        self.state_cols = torch.tensor(keep, device=dev)
        ckpt = cfg.checkpoint_activations
        self.sa_encoder = DeepResNet(len(keep) + act_dim, cfg.critic_width, cfg.critic_depth,
                                     cfg.repr_dim, ckpt).to(dev)
        self.g_encoder = DeepResNet(spec.goal.dim, cfg.critic_width, cfg.critic_depth,
                                    cfg.repr_dim, ckpt).to(dev)
        actor_class = TanhLogStdActor if cfg.log_std_tanh else SquashedGaussianActor
        self.actor = actor_class(obs_dim, act_dim, net=DeepResNet(
            obs_dim, cfg.actor_width, cfg.actor_depth, 2 * act_dim, ckpt),
            squash_epsilon=cfg.squash_epsilon).to(dev)
        for net in (self.sa_encoder, self.g_encoder, self.actor):
            for module in net.modules():
                if isinstance(module, nn.LayerNorm):
                    module.eps = cfg.layer_norm_eps
        self.dtype = torch.get_default_dtype()
        """Dtype of the parameters, replay and losses (float32 unless built under another
        default dtype; bf16 autocast outputs are cast back to it)."""
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=dev, requires_grad=True)
        self.target_entropy = (-0.5 * act_dim if cfg.target_entropy is None
                               else float(cfg.target_entropy))
        critic_params = [*self.sa_encoder.parameters(), *self.g_encoder.parameters()]
        self.critic_opt = adam(critic_params, cfg.critic_lr)
        self.actor_opt = adam(self.actor.parameters(), cfg.actor_lr)
        self.alpha_opt = adam([self.log_alpha], cfg.alpha_lr)
        self.critic_step = GradientStep("CRL", "critic", self.critic_opt)
        self.actor_step = GradientStep("CRL", "actor", self.actor_opt)
        self.alpha_step = GradientStep("CRL", "alpha", self.alpha_opt)
        self.buffer = TrajectoryReplay(cfg.buffer_steps, num_envs, obs_dim, act_dim,
                                       spec.max_episode_steps, dev)
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        self.generator = torch.Generator(device=dev)
        self.generator.manual_seed(seed)
        self.episode = torch.arange(num_envs, device=dev)
        """[N] run-wide id of each world's current episode (world + N x its episode count)."""
        self.transitions = 0
        self.num_updates = 0
        self.owed_updates = 0.0
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def build(cls, spec: EnvSpec, cfg: Any, ctx: BuildContext) -> CRL:
        return cls(spec, cfg, ctx.num_envs, ctx.device)

    @classmethod
    def observations(cls, cfg: Any) -> tuple[str, ...]:
        return ("policy",)

    def network_cost(self) -> dict[str, dict[str, float]]:
        """Parameters, FLOPs and activation bytes of one update's forward + backward per
        network (``DeepResNet.cost``): phi runs on 2B rows (critic and actor losses), psi and
        the actor on B."""
        b = self.cfg.batch_size
        return {"sa_encoder": self.sa_encoder.cost(2 * b), "g_encoder": self.g_encoder.cost(b),
                "actor": self.actor.net.cost(b)}

    # ------------------------------------------------------------------ acting
    def _to_env(self, action: torch.Tensor) -> torch.Tensor:
        return action * self.action_scale + self.action_bias

    def _autocast(self) -> Any:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.bf16)

    @torch.no_grad()
    def act(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """Exploration actions [N, A] for ``obs["policy"]`` [N, obs_dim] (goal included);
        uniform random until ``learning_starts`` transitions are stored."""
        if self._pending is not None:
            raise RuntimeError("act() called twice without process_env_step() in between")
        x = policy_obs(obs).to(self.device, self.dtype)
        if self.transitions < self.cfg.learning_starts:
            action = torch.rand(x.shape[0], self.spec.action_dim, generator=self.generator,
                                device=self.device) * 2 - 1
        else:
            with self._autocast():
                action, _ = self.actor.sample(x, self.generator)
            action = action.to(self.dtype)
        self._pending = (x.clone(), action)
        return self._to_env(action)

    @torch.no_grad()
    def act_deterministic(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        x = policy_obs(obs).to(self.device, self.dtype)
        with self._autocast():
            action = self.actor.deterministic(x)
        return self._to_env(action.to(self.dtype))

    def export_actor(self) -> DeterministicActor:
        """The mean action on the whole ``policy`` observation, goal columns included (the
        export metadata names them)."""
        network = nn.Sequential(self.actor.net, FirstColumns(self.actor.act_dim))
        return DeterministicActor(network, self.spec.obs_dim, self.action_low, self.action_high,
                                  "tanh")

    @torch.no_grad()
    def process_env_step(self, reward: torch.Tensor, terminated: torch.Tensor,
                         truncated: torch.Tensor, final_obs: Obs | torch.Tensor) -> None:
        """Append the last ``act``'s step of every world to the trajectory replay; worlds whose
        episode ended start a new episode id. Rewards are not used."""
        if self._pending is None:
            raise RuntimeError("process_env_step() called without a preceding act()")
        obs, action = self._pending
        self._pending = None
        self.buffer.add(obs, action, self.episode)
        done = (terminated | truncated).to(self.device)
        self.episode += done.long() * self.num_envs
        self.transitions += obs.shape[0]
        if self.transitions >= self.cfg.learning_starts:
            self.owed_updates += self.cfg.utd_ratio * obs.shape[0]

    # ------------------------------------------------------------------ learning
    def relabel(self, obs: torch.Tensor, future_obs: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(state [B, obs_dim - goal_dim], goal [B, goal_dim], actor input [B, obs_dim]): the
        goal is the future observation's achieved coordinates, written over obs's goal."""
        goal = future_obs[:, self.achieved_cols]
        actor_obs = obs.clone()
        actor_obs[:, self.goal_cols] = goal
        return obs[:, self.state_cols], goal, actor_obs

    def _update_once(self) -> torch.Tensor:
        cfg = self.cfg
        batch = self.buffer.sample(cfg.batch_size, cfg.gamma, self.generator)
        state, goal, actor_obs = self.relabel(batch["obs"], batch["future_obs"])
        alpha = self.log_alpha.detach().exp()
        with self._autocast():
            phi = self.sa_encoder(torch.cat([state, batch["action"]], 1))
            psi = self.g_encoder(goal)
        metrics: dict[str, torch.Tensor] = {}
        if not cfg.actor_first:
            metrics.update(self._critic_update(phi, psi))
        # the goal embedding reused without its graph: before the critic's step in both orders
        metrics.update(self._actor_update(state, actor_obs, psi.detach(), alpha))
        if cfg.actor_first:
            metrics.update(self._critic_update(phi, psi))
        self.num_updates += 1
        metrics["train/alpha"] = alpha
        metrics["train/goal_offset"] = batch["offset"].to(self.dtype).mean()
        return torch.stack([metrics[k].to(self.dtype) for k in METRIC_KEYS])

    def _critic_update(self, phi: torch.Tensor, psi: torch.Tensor) -> dict[str, torch.Tensor]:
        """The contrastive loss of ``phi`` [B, D] against ``psi`` [B, D] and the encoders' step."""
        cfg = self.cfg
        logits = ENERGIES[cfg.energy](phi.to(self.dtype), psi.to(self.dtype))
        c_loss, metrics = critic_loss(logits, cfg.contrastive_loss, cfg.logsumexp_penalty,
                                      cfg.logsumexp_offset)
        metrics[self.critic_step.metric] = self.critic_step(c_loss, check=False)
        return metrics

    def _actor_update(self, state: torch.Tensor, actor_obs: torch.Tensor, psi: torch.Tensor,
                      alpha: torch.Tensor) -> dict[str, torch.Tensor]:
        """The actor's step against the frozen phi and the goal embedding ``psi`` [B, D]
        (detached), then the temperature's."""
        cfg = self.cfg
        self.sa_encoder.requires_grad_(False)
        with self._autocast():
            action, log_prob = self.actor.sample(actor_obs, self.generator)
            phi_pi = self.sa_encoder(torch.cat([state, action.to(self.dtype)], 1))
        energy = paired_energy(cfg.energy, phi_pi.to(self.dtype), psi.to(self.dtype))
        log_prob = log_prob.to(self.dtype)
        a_loss, metrics = actor_loss(energy, log_prob, alpha)
        metrics[self.actor_step.metric] = self.actor_step(a_loss, check=False)
        self.sa_encoder.requires_grad_(True)
        t_loss_fn = alpha_scaled_temperature_loss if cfg.temperature_on_alpha else temperature_loss
        t_loss, t_metrics = t_loss_fn(self.log_alpha, log_prob, self.target_entropy)
        t_metrics[self.alpha_step.metric] = self.alpha_step(t_loss, check=False)
        return {**metrics, **t_metrics}

    def update(self, progress: float = 0.0) -> dict[str, float]:
        """The updates earned since the last call; metrics averaged over them (empty while
        warming up). Raises ``NonFiniteError`` on a NaN/Inf critic loss or gradient."""
        if int(self.owed_updates) == 0 or self.buffer.size < 2:
            return {}
        return run_owed_updates(self, self._update_once, METRIC_KEYS, "CRL")

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        state = {
            "actor": self.actor.state_dict(), "sa_encoder": self.sa_encoder.state_dict(),
            "g_encoder": self.g_encoder.state_dict(), "log_alpha": self.log_alpha.detach().clone(),
            "actor_opt": self.actor_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
            "alpha_opt": self.alpha_opt.state_dict(), "generator": self.generator.get_state(),
            "episode": self.episode.cpu(),
            "counters": (self.transitions, self.num_updates, self.owed_updates),
        }
        if self.cfg.save_replay:
            state["replay"] = self.buffer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        self.sa_encoder.load_state_dict(state["sa_encoder"])
        self.g_encoder.load_state_dict(state["g_encoder"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.alpha_opt.load_state_dict(state["alpha_opt"])
        self.generator.set_state(state["generator"].cpu())
        self.episode = state["episode"].to(self.device)
        self.transitions, self.num_updates, self.owed_updates = state["counters"]
        if "replay" in state:
            self.buffer.load_state_dict(state["replay"])
        self._pending = None
