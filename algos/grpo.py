"""Group Relative Policy Optimization for control: critic-free, groups from simulator snapshots.

GRPO (Shao et al. 2024, "DeepSeekMath") replaces PPO's critic by the group: G rollouts from one
starting point, each scored by its outcome relative to the others (``advantages.
GROUP_ADVANTAGES``: GRPO's mean/std, Dr. GRPO's mean only, RLOO's leave-one-out). A batched
simulator restores the exact same state in G worlds, which a language model's prompt gives for
free. The ``group`` runner drives it (``robotrl.runners.group``):

    for each round:                                # under torch.inference_mode()
        env.set_state(M initial states, each in G worlds); obs = env.observe()
        action = grpo.act(obs); out = env.step(action)
        grpo.process_env_step(out.reward, out.terminated, out.truncated, final_obs)
        ...                                        # until every world's episode ended
        ready = grpo.end_round(outcome)            # [N]: return or success of each world
    metrics = grpo.update(progress)                # outside inference mode

The 2025 fixes are options: DAPO's clip-higher (``clip_high > clip_low``) and dynamic sampling
(groups whose outcomes are all equal carry no signal: dropped, and more rounds are drawn, at
most ``max_draws``; Yu et al. 2025), GSPO's sequence-level ratio (Zheng et al. 2025), the loss
aggregations of ``pg_core.AGGREGATIONS``, and a k3 KL penalty to a frozen reference policy (the
initial one; off by default). The loss sees log-probabilities only (``grpo_loss``), so a token
policy with ``sample``/``log_prob`` plugs into the same update.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from robotrl import distributed
from robotrl.algos.advantages import GROUP_ADVANTAGES, group_advantages
from robotrl.algos.pg_core import AGGREGATIONS, aggregate, kl_k3, policy_loss
from robotrl.nn.mlp import ACTIVATIONS
from robotrl.nn.policy import GaussianPolicy
from robotrl.optim import GradientStep, NonFiniteError, adam
from robotrl.types import Obs

if TYPE_CHECKING:
    from robotrl.nn.actor import DeterministicActor
    from robotrl.types import BuildContext, EnvSpec, ObsSpec
    from robotrl.vla.policy import TokenPolicy

OUTCOMES: tuple[str, ...] = ("return", "success")
"""What a rollout is scored by: its undiscounted return, or ``info["success"]`` at its end."""


@dataclass
class GRPOConfig:
    """GRPO hyperparameters; the sampling fields are read by the ``group`` runner too."""

    group_size: int = 8
    """G: rollouts from each initial state; ``num_envs`` must be a multiple (M = num_envs / G
    groups per round)."""
    horizon: int = 0
    """Steps of a round (a fixed horizon; an episode cut there is scored as it stands); 0: the
    task's episode limit."""
    outcome: str = "return"
    """"return" or "success" (tasks with a success criterion: reacher and the pendulums)."""
    advantage: str = "grpo"
    """Group-relative estimator: "grpo" (mean/std), "dr_grpo" (mean only) or "rloo"."""
    ratio: str = "step"
    """Importance ratio: "step" (one per action, as PPO) or "sequence" (GSPO: the geometric mean
    over the trajectory's actions, one clip per trajectory)."""
    clip_low: float = 0.2
    """Lower clip width of the ratio (ratio >= 1 - clip_low)."""
    clip_high: float = 0.28
    """Upper clip width (ratio <= 1 + clip_high); above clip_low is DAPO's clip-higher."""
    loss_agg: str = "token_mean"
    """Loss aggregation over a trajectory's steps (``pg_core.AGGREGATIONS``); with
    ``ratio=sequence`` the loss is a mean over trajectories."""
    num_epochs: int = 4
    """Passes over each batch."""
    num_minibatches: int = 4
    """Minibatches per pass (whole trajectories)."""
    learning_rate: float = 3e-4
    """Adam learning rate."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip; 0 disables clipping."""
    kl_coef: float = 0.0
    """Weight of the k3 KL(pi || pi_ref) penalty to the initial policy (0: off, as DAPO)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    dynamic_sampling: bool = True
    """Drop groups whose outcomes are all equal and draw more rounds until M groups are kept
    (DAPO); off: every group is kept (equal ones get zero advantage)."""
    max_draws: int = 4
    """Rounds drawn per batch at most with dynamic sampling; the update uses what it has."""
    train_states: int = 512
    """Fixed initial states training draws from (saved in the run dir)."""
    test_states: int = 64
    """Disjoint initial states evaluation reports apart (training never sees them)."""
    actor_hidden: tuple[int, ...] = (64, 64)
    """Hidden widths of the policy's mean network (a fresh policy)."""
    activation: str = "tanh"
    """Hidden activation (a fresh policy): relu, tanh, elu, silu or gelu."""
    init_log_std: float = -0.5
    """Initial log standard deviation (also after ``init=``: a pretrained actor has no std)."""
    normalize_obs: bool = True
    """Normalize observations by running statistics, updated after every batch (a fresh
    policy; a pretrained one keeps its own, frozen)."""

    def __post_init__(self) -> None:
        self.actor_hidden = tuple(int(w) for w in self.actor_hidden)
        choices = {"outcome": OUTCOMES, "advantage": tuple(GROUP_ADVANTAGES),
                   "ratio": tuple(RATIO_LOSSES), "loss_agg": tuple(AGGREGATIONS),
                   "activation": tuple(ACTIVATIONS)}
        for name, known in choices.items():
            if getattr(self, name) not in known:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; known: "
                                 f"{', '.join(known)}")
        for name in ("group_size", "num_epochs", "num_minibatches", "max_draws",
                     "train_states", "test_states"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (a group compares its rollouts), got "
                             f"{self.group_size}")
        if self.horizon < 0 or self.clip_low < 0 or self.clip_high < 0:
            raise ValueError("horizon, clip_low and clip_high must be >= 0")
        if self.kl_coef < 0 or self.entropy_coef < 0 or self.max_grad_norm < 0:
            raise ValueError("kl_coef, entropy_coef and max_grad_norm must be >= 0")


def step_ratio_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor, cfg: GRPOConfig
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One ratio per action (PPO, GRPO): the clipped surrogate of every valid step, with its
    trajectory's advantage, aggregated by ``cfg.loss_agg``. Shapes: [B, T], [B], mask [B, T]."""
    return policy_loss(logp_new, logp_old, advantages[:, None], cfg.clip_low, cfg.clip_high,
                       mask, cfg.loss_agg)


def sequence_ratio_loss(logp_new: torch.Tensor, logp_old: torch.Tensor,
                        advantages: torch.Tensor, mask: torch.Tensor, cfg: GRPOConfig
                        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (Zheng et al. 2025, eq. 7): one ratio per trajectory, the geometric mean of its
    steps' ratios ``exp(mean_t log r_t)``, clipped once; the loss is the mean over
    trajectories. Shapes: [B, T], [B], mask [B, T]."""
    mask = mask.to(logp_new.dtype)
    steps = mask.sum(-1).clamp(min=1.0)
    seq_new = (logp_new * mask).sum(-1) / steps
    seq_old = (logp_old * mask).sum(-1) / steps
    return policy_loss(seq_new, seq_old, advantages, cfg.clip_low, cfg.clip_high)


RATIO_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]] = {
    "step": step_ratio_loss,
    "sequence": sequence_ratio_loss,
}
"""Policy-loss variants by importance-ratio level."""


def grpo_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, cfg: GRPOConfig, logp_ref: torch.Tensor | None = None,
              entropy: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO's loss on a minibatch of trajectories: the ratio loss of ``cfg.ratio`` plus
    ``kl_coef`` k3 KL(pi || pi_ref) minus ``entropy_coef`` entropy (both per step, aggregated
    by ``cfg.loss_agg``).

    Args:
        logp_new: [B, T] log pi(a_t | s_t) under the policy being optimized (0 where invalid).
        logp_old: [B, T] under the policy that collected the batch (no gradient).
        advantages: [B] one per trajectory (its group-relative outcome).
        mask: [B, T] bool, valid steps (before the episode ended).
        cfg: clip widths, aggregation, coefficients.
        logp_ref: [B, T] under the reference policy, or None (no KL term).
        entropy: [B, T] policy entropy per step, or None (no bonus).

    Returns:
        ``(loss [], metrics)``: detached ``loss/policy``, ``loss/kl_ref``, ``loss/entropy``
        (minus the entropy), ``loss/total``, ``train/kl`` (k3 KL(old || new)), ``train/clipfrac``.
    """
    pg_loss, pg = RATIO_LOSSES[cfg.ratio](logp_new, logp_old, advantages, mask, cfg)
    loss = pg_loss
    zero = torch.zeros((), device=pg_loss.device)
    kl_ref = ent = zero
    if logp_ref is not None:
        kl_ref = aggregate(kl_k3(logp_ref.detach() - logp_new), mask, cfg.loss_agg)
        loss = loss + cfg.kl_coef * kl_ref
    if entropy is not None:
        ent = aggregate(entropy, mask, cfg.loss_agg)
        loss = loss - cfg.entropy_coef * ent
    metrics = {"loss/policy": pg_loss, "loss/kl_ref": kl_ref, "loss/entropy": -ent,
               "loss/total": loss, "train/kl": pg["approx_kl"], "train/clipfrac": pg["clipfrac"]}
    return loss, {k: v.detach() for k, v in metrics.items()}


def informative_groups(outcome: torch.Tensor) -> torch.Tensor:
    """[M] bool: groups of ``outcome`` [M, G] whose outcomes are not all equal (DAPO's dynamic
    sampling keeps these: an all-equal group has zero advantage, so no gradient)."""
    return outcome.amax(dim=1) > outcome.amin(dim=1)


class GRPO:
    """GRPO with a Gaussian policy or a token policy (``robotrl.vla``); see the module
    docstring for the call protocol.

    Both expose ``sample``/``evaluate``/``deterministic`` over observation groups; a Gaussian
    policy has one log-probability per action, a token policy one per action token, and the
    ``step`` ratio is taken per token (the batch's log-probabilities are [B, T, L], flattened
    to [B, T * L] for the loss).

    Attributes:
        policy: the policy being trained (raw observations in).
        ref_policy: the initial policy, frozen (the KL reference: ``policy.reference()``).
        horizon: T, steps of a round.
        generator: drives action sampling and minibatch shuffling.
    """

    token_policies = True
    """Trains token policies too (``policy=vla``)."""

    def __init__(self, obs_dim: int, action_low: torch.Tensor, action_high: torch.Tensor,
                 num_envs: int, horizon: int, cfg: GRPOConfig | None = None,
                 device: str | torch.device = "cpu", seed: int | None = None,
                 policy: TokenPolicy | None = None,
                 obs_specs: dict[str, ObsSpec] | None = None) -> None:
        """Args: ``num_envs`` N = M * G worlds; ``horizon`` T steps per round; ``seed`` of the
        sampling generator (None: drawn from torch's global RNG after the network init);
        ``policy`` a token policy to train instead of a fresh Gaussian one, reading the groups
        ``obs_specs`` describes (the env spec's ``observations``)."""
        self.cfg = cfg = cfg if cfg is not None else GRPOConfig()
        if num_envs % cfg.group_size:
            raise ValueError(f"num_envs ({num_envs}) must be a multiple of algo.group_size "
                             f"({cfg.group_size}): each initial state runs in G worlds")
        self.device = torch.device(device)
        self.dtype = torch.get_default_dtype()
        """Dtype of the ``policy`` observations, log-probabilities and advantages (float32
        unless built under another default dtype)."""
        self.num_envs, self.horizon, self.obs_dim = num_envs, int(horizon), int(obs_dim)
        self.num_groups = num_envs // cfg.group_size
        self.action_low = torch.as_tensor(action_low, dtype=torch.float32).to(self.device)
        self.action_high = torch.as_tensor(action_high, dtype=torch.float32).to(self.device)
        self.act_dim = self.action_low.numel()
        if policy is None:
            policy = GaussianPolicy(obs_dim, action_low, action_high, cfg.actor_hidden,
                                    cfg.activation, "clip", cfg.normalize_obs, cfg.init_log_std)
        self._set_policy(policy)
        self.update_normalizer = cfg.normalize_obs and policy.normalizer is not None
        """Fold each batch's observations into the normalizer (off for a pretrained policy)."""
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        t, n, a, dev = self.horizon, num_envs, self.act_dim, self.device
        shapes = {"policy": ((obs_dim,), self.dtype)}
        shapes.update({k: (v.shape, v.dtype) for k, v in (obs_specs or {}).items()})
        missing = [g for g in self.policy.observations if g not in shapes]
        if missing:
            raise ValueError(f"the policy reads observation groups {missing} that the env does "
                             f"not return (it has {list(shapes)})")
        self.groups: tuple[str, ...] = tuple(self.policy.observations)
        """Observation groups the policy reads (stored per step)."""
        tokens = int(getattr(self.policy, "num_tokens", 1))
        # one round [T, N, ...] as collected; the batch [M * G, T, ...] of kept trajectories
        self._round = {**{f"obs/{g}": torch.zeros(t, n, *shapes[g][0], dtype=shapes[g][1],
                                                  device=dev) for g in self.groups},
                       "action": torch.zeros(t, n, a, device=dev),
                       "log_prob": torch.zeros(t, n, tokens, device=dev),
                       "valid": torch.zeros(t, n, dtype=torch.bool, device=dev)}
        self._batch = {k: torch.zeros_like(v.transpose(0, 1)) for k, v in self._round.items()}
        self._batch["advantages"] = torch.zeros(n, device=dev)
        self._alive = torch.ones(n, dtype=torch.bool, device=dev)
        self._t = 0
        self._pending = False
        self._clear_batch()

    @classmethod
    def build(cls, spec: EnvSpec, cfg: GRPOConfig, ctx: BuildContext) -> GRPO:
        """The learner for an env with ``spec`` on ``ctx.device`` for ``ctx.num_envs`` worlds;
        a round lasts ``cfg.horizon`` steps, or the episode limit when 0 or longer."""
        limit = spec.max_episode_steps
        horizon = min(cfg.horizon, limit) if cfg.horizon else limit
        policy = None
        if ctx.policy is not None:
            from robotrl.registry import build_policy

            policy = build_policy(ctx.policy, spec)
        return cls(spec.obs_dim, spec.action_low, spec.action_high, ctx.num_envs, horizon, cfg,
                   ctx.device, policy=policy, obs_specs=spec.observations)

    @classmethod
    def observations(cls, cfg: GRPOConfig) -> tuple[str, ...]:
        return ("policy",)

    def _set_policy(self, policy: GaussianPolicy | TokenPolicy) -> None:
        """Train ``policy`` from here: it becomes the KL reference (the policy's ``reference``:
        a frozen copy, or the shared LM with its LoRA adapters off), with a fresh optimizer
        over its trainable parameters."""
        self.policy = policy.to(self.device)
        self.ref_policy = self.policy.reference()  # first: it may restructure the policy
        trainable = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer = adam(trainable, self.cfg.learning_rate)
        self.step = GradientStep("GRPO", "policy", self.optimizer,
                                 max_grad_norm=self.cfg.max_grad_norm)

    def init_from_actor(self, actor: DeterministicActor) -> None:
        """Start from a pretrained actor (any algorithm's ``export_actor``: PPO, SAC, BC, ...):
        its network, normalization and output transform become the policy's mean, with std
        ``exp(init_log_std)``; it is also the KL reference and its normalizer stays frozen."""
        if (actor.obs_dim, actor.act_dim) != (self.obs_dim, self.act_dim):
            raise ValueError(f"the init actor maps {actor.obs_dim} observations to "
                             f"{actor.act_dim} actions; this task has {self.obs_dim} and "
                             f"{self.act_dim}")
        if not (torch.equal(actor.low, self.action_low.cpu())
                and torch.equal(actor.high, self.action_high.cpu())):
            raise ValueError(f"the init actor's action bounds {actor.low.tolist()}.."
                             f"{actor.high.tolist()} differ from the task's")
        self._set_policy(GaussianPolicy.from_actor(actor, self.cfg.init_log_std))
        self.update_normalizer = False

    def init_from_policy(self, policy: TokenPolicy) -> None:
        """Start from a trained token policy (BC's): a copy is trained, and the KL reference is
        that copy as it starts (``reference``; a LoRA policy's adapters are merged into its LM
        first)."""
        if tuple(policy.observations) != self.groups or policy.arch != self.policy.arch:
            raise ValueError(f"the init policy ({policy.arch.get('kind')}, reading "
                             f"{list(policy.observations)}) differs from this run's "
                             f"({self.policy.arch.get('kind')}, {list(self.groups)}): use the "
                             "same policy= settings as the run it comes from")
        self._set_policy(copy.deepcopy(policy))

    def _groups(self, obs: Obs | torch.Tensor) -> Obs:
        """The groups the policy reads, on the learner's device (``policy`` in ``dtype``)."""
        if isinstance(obs, torch.Tensor):
            obs = {"policy": obs}
        out = {g: obs[g].to(self.device) for g in self.groups}
        if "policy" in out:
            out["policy"] = out["policy"].to(self.dtype)
        return out

    # ------------------------------------------------------------------ collection
    @torch.no_grad()
    def act(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """Sample actions for ``obs`` (its ``policy`` group [N, obs_dim]) and record them at the
        round's next step; returns [N, A] clipped to the bounds."""
        if self._pending:
            raise RuntimeError("act() called twice without process_env_step() in between")
        if self._t >= self.horizon:
            raise RuntimeError(f"a round has at most horizon={self.horizon} steps; call "
                               "end_round() first")
        x = self._groups(obs)
        action, log_prob = self.policy.sample(x, self.generator)
        r, t = self._round, self._t
        for g in self.groups:
            r[f"obs/{g}"][t] = x[g]
        r["action"][t], r["log_prob"][t] = action, log_prob.reshape(self.num_envs, -1)
        self._pending = True
        return torch.clamp(action, self.action_low, self.action_high)

    @torch.no_grad()
    def act_deterministic(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """Mean action [N, A] clipped; records nothing."""
        return self.policy.deterministic(self._groups(obs))

    @torch.no_grad()
    def process_env_step(self, reward: torch.Tensor, terminated: torch.Tensor,
                         truncated: torch.Tensor, final_obs: Obs | torch.Tensor) -> None:
        """Close the step: it is valid for the worlds whose episode had not ended before it.
        The outcome comes whole at ``end_round``; rewards are not stored."""
        if not self._pending:
            raise RuntimeError("process_env_step() called without a preceding act()")
        self._round["valid"][self._t] = self._alive
        self._alive &= ~(terminated.to(self.device, torch.bool) | truncated.to(self.device, torch.bool))
        self._t += 1
        self._pending = False

    @torch.no_grad()
    def end_round(self, outcome: torch.Tensor) -> bool:
        """Score the round's worlds with ``outcome`` [N] (world i in group i // G), keep the
        informative groups (all, without dynamic sampling) until the batch has M; True when
        the batch is ready: full, or ``max_draws`` rounds drawn."""
        cfg, g, m = self.cfg, self.cfg.group_size, self.num_groups
        if outcome.shape != (self.num_envs,):
            raise ValueError(f"outcome must have shape ({self.num_envs},), got "
                             f"{tuple(outcome.shape)}")
        r = self._round
        r["valid"][self._t:] = False
        grouped = outcome.to(self.device, self.dtype).reshape(m, g)
        advantages = group_advantages(grouped, cfg.advantage).flatten()
        keep = informative_groups(grouped) if cfg.dynamic_sampling else torch.ones(
            m, dtype=torch.bool, device=self.device)
        take = keep.nonzero().flatten()[: m - self._filled]
        if take.numel():
            worlds = (take[:, None] * g + torch.arange(g, device=self.device)).flatten()
            rows = slice(self._filled * g, self._filled * g + worlds.numel())
            for key, value in r.items():
                self._batch[key][rows] = value[:, worlds].transpose(0, 1)
            self._batch["advantages"][rows] = advantages[worlds]
            self._filled += take.numel()
        self._draws += 1
        self._drawn_groups += m
        self._informative += int(keep.sum())
        self._t = 0
        self._alive.fill_(True)
        return self._filled == m or not cfg.dynamic_sampling or self._draws >= cfg.max_draws

    def _clear_batch(self) -> None:
        self._filled = self._draws = self._drawn_groups = self._informative = 0

    # ------------------------------------------------------------------ learning
    def update(self, progress: float = 0.0) -> dict[str, float]:
        """Epochs of minibatches (whole trajectories) over the batch, then clear it.

        Returns:
            ``loss/{policy,kl_ref,entropy,total}``, ``train/{kl,clipfrac,grad_norm/policy,
            action_std}``, ``train/groups`` (kept groups the update used), ``train/draws``
            (rounds drawn) and ``train/informative`` (fraction of drawn groups whose outcomes
            differ). An empty batch (no informative group in ``max_draws`` rounds) skips the
            update (in a data-parallel run: when every rank's is empty).

        Raises:
            NonFiniteError: a loss or gradient is NaN/Inf (before that optimizer step).
        """
        cfg, b = self.cfg, self._filled * self.cfg.group_size
        size = max(-(-b // cfg.num_minibatches), 1)
        # a data-parallel run: every rank takes the gradient steps of the rank with the most
        # minibatches (all-reduced gradients); a rank with fewer adds zero gradients
        steps = distributed.largest(-(-b // size))
        if steps == 0:
            return self._end_batch()
        batch = {k: v[:b] for k, v in self._batch.items()}
        params = self.step.params  # the trained ones (frozen LM weights cannot change)
        rows: list[torch.Tensor] = []
        keys: tuple[str, ...] = ()
        for epoch in range(cfg.num_epochs):
            perm = torch.randperm(b, generator=self.generator, device=self.device)
            chunks = list(perm.split(size)) if b else []
            for i in range(len(chunks), steps):
                zero = torch.stack([p.sum() for p in params]).sum() * 0.0
                self.step(zero, f"epoch {epoch}, minibatch {i} (none on this rank)")
            for i, idx in enumerate(chunks):
                old = batch["log_prob"][idx]
                # only the valid steps are evaluated (an episode that ends early leaves most of
                # its round invalid), then spread back to [b, T, L] and flattened per token
                valid = batch["valid"][idx]
                mask = valid[..., None].expand_as(old)
                obs = {g: batch[f"obs/{g}"][idx][valid] for g in self.groups}
                action = batch["action"][idx][valid]

                def spread(values: torch.Tensor, mask: torch.Tensor = mask) -> torch.Tensor:
                    return torch.zeros(mask.shape, device=self.device).masked_scatter(
                        mask, values).flatten(1)

                logp, entropy = self.policy.evaluate(obs, action)
                logp, entropy = spread(logp), spread(entropy)
                logp_ref = None
                if cfg.kl_coef > 0:
                    with torch.no_grad():
                        logp_ref = spread(self.ref_policy.evaluate(obs, action)[0])
                loss, metrics = grpo_loss(logp, old.flatten(1), batch["advantages"][idx],
                                          mask.flatten(1), cfg, logp_ref, entropy)
                metrics[self.step.metric] = self.step(loss, f"epoch {epoch}, minibatch {i}")
                keys = tuple(metrics)
                rows.append(torch.stack([metrics[k] for k in keys]))
        if self.update_normalizer:
            self.policy.normalizer.update(batch["obs/policy"][batch["valid"]])
        with torch.no_grad():
            finite = torch.stack([torch.isfinite(p).all() for p in params]).all()[None]
            mean = torch.stack(rows).mean(0) if rows else finite[:0].float()
            *means, ok = torch.cat([mean, finite]).tolist()
        if not ok:
            raise NonFiniteError("GRPO parameters became NaN/Inf during the update")
        return {**dict(zip(keys, means, strict=True)), **self._end_batch()}

    def _end_batch(self) -> dict[str, float]:
        """The batch's sampling metrics and the policy's std; the batch is cleared."""
        info = {"train/groups": float(self._filled), "train/draws": float(self._draws),
                "train/informative": self._informative / max(self._drawn_groups, 1)}
        if isinstance(self.policy, GaussianPolicy):
            info["train/action_std"] = float(self.policy.log_std.detach().exp().mean())
        self._clear_batch()
        return info

    def export_actor(self) -> DeterministicActor:
        """Frozen copy of ``act_deterministic`` for sim2real export (Gaussian policies)."""
        if not isinstance(self.policy, GaussianPolicy):
            raise NotImplementedError("token policies decode autoregressively; ONNX/TorchScript "
                                      "export covers MLP actors only")
        return self.policy.export()

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs between updates; ``arch`` rebuilds a policy that
        came from ``init_from_actor`` (its widths are not the config's)."""
        return {"arch": dict(self.policy.arch), "policy": self.policy.state_dict(),
                "ref_policy": self.ref_policy.state_dict(),
                "optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state(),
                "update_normalizer": self.update_normalizer}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned; the round and batch start empty."""
        if state["arch"] != self.policy.arch:
            if "kind" in state["arch"]:
                from robotrl.vla import policy_from_arch

                self._set_policy(policy_from_arch(state["arch"]))
            else:
                self._set_policy(GaussianPolicy(self.obs_dim, self.action_low,
                                                self.action_high, **state["arch"]))
        self.policy.load_state_dict(state["policy"])
        self.ref_policy.load_state_dict(state["ref_policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"].cpu())
        self.update_normalizer = bool(state["update_normalizer"])
        self._t, self._pending = 0, False
        self._alive.fill_(True)
        self._clear_batch()

