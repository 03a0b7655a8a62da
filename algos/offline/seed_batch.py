"""Seed-batched offline learners: S runs of any offline learner (BC, TD3+BC, ReBRAC, IQL, CQL,
AWAC, the MCEP variants) in one process (``robotrl.algos.seed_batch``: stacking, Adam, CUDA
graphs, stopping a diverging seed).

Each seed's learner keeps its own view of the dataset (its normalizer statistics); the batch
reads the S packed tables stacked [S, rows, width], each seed's rows drawn by its own generator.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import nn

from robotrl.algos.offline.awac import AWAC
from robotrl.algos.offline.bc import BC
from robotrl.algos.offline.cql import CQL
from robotrl.algos.offline.iql import IQL
from robotrl.algos.offline.mcep import AWACMCEP, TD3BCMCEP
from robotrl.algos.offline.rebrac import ReBRAC
from robotrl.algos.offline.td3bc import TD3BC
from robotrl.algos.seed_batch import SeedBatch, SeedStop, squashed_sample
from robotrl.nn.ensemble import EnsembleLayerNorm, EnsembleLinear
from robotrl.nn.linear import ensemble_linear
from robotrl.nn.squashed_gaussian import squashed_log_prob
from robotrl.nn.target import td_target

__all__ = ["OfflineSeedBatch", "SeedBatch", "SeedBatchAWAC", "SeedBatchAWACMCEP", "SeedBatchBC",
           "SeedBatchCQL", "SeedBatchIQL", "SeedBatchReBRAC", "SeedBatchTD3BC", "SeedBatchTD3BCMCEP",
           "SeedStop"]


class OfflineSeedBatch(SeedBatch):
    """A seed batch of offline learners: ``cfg.updates_per_iteration`` updates a call on the
    attached datasets' tables."""

    def __init__(self, learners: Sequence[Any], cuda_graphs: bool | None = None) -> None:
        super().__init__(learners, cuda_graphs)
        self._tables: tuple[tuple[int, ...], torch.Tensor] | None = None

    @classmethod
    def create(cls, obs_dim: int, action_low: torch.Tensor, action_high: torch.Tensor,
               cfg: Any, seeds: Sequence[int], device: str | torch.device = "cpu",
               cuda_graphs: bool | None = None) -> OfflineSeedBatch:
        """One learner per seed, each built as ``LEARNER(..., seed=seed)`` alone (construction
        draws the initial weights from torch's global generator: seed it per learner, as a
        run does, with ``seed_everything(seed)`` before building)."""
        from robotrl.seeding import seed_everything

        learners = []
        for seed in seeds:
            seed_everything(seed)
            learners.append(cls.LEARNER(obs_dim, action_low, action_high, cfg, device, seed=seed))
        return cls(learners, cuda_graphs)

    def attach(self, data: Any) -> None:
        """Attach ``data`` to every learner (each its own view and normalizer statistics)."""
        for learner in self.learners:
            learner.attach(data)
        self._tables = None

    def _count(self, learners: list[Any]) -> int:
        return self.cfg.updates_per_iteration

    def _data(self, seeds: list[int], st: dict[str, Any]) -> None:
        key = tuple(id(self.learners[i].data) for i in seeds)
        if self._tables is None or self._tables[0] != key:
            for i in seeds:
                if self.learners[i].data is None:
                    raise RuntimeError(f"{type(self).__name__}.update() before attach(dataset)")
            self._tables = (key, torch.stack([self.learners[i].data.table for i in seeds]))
        st["table"] = self._tables[1]
        st["rows"] = st["table"].shape[1]


    def _log_std(self, params: list[torch.Tensor]) -> torch.Tensor:
        """``GaussianActor.current_log_std`` of S actors (``parameters()`` order: its own
        log_std [S, A] first, then the net's): [S, A]."""
        low, high = self.cfg.log_std_range
        raw = params[0]
        return (low + torch.sigmoid(raw) * (high - low) if self.cfg.sigmoid_log_std
                else raw.clamp(low, high))

    def _log_prob(self, params: list[torch.Tensor], obs: torch.Tensor,
                  action: torch.Tensor) -> torch.Tensor:
        """``GaussianActor.log_prob`` of S actors: [S, B]."""
        log_std = self._log_std(params)[:, None, :]
        z = (action - torch.tanh(self._mlp(params[1:], obs))) / log_std.exp()
        return (-0.5 * z.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def _batch(self, st: dict[str, Any], idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each seed's rows ``idx`` [S, B] of its own table, unpacked: fields [S, B, ...]."""
        table = st["table"]
        rows = table[torch.arange(table.shape[0], device=table.device)[:, None], idx]
        return self.learners[0].data.unpack(rows)


class SeedBatchTD3BC(OfflineSeedBatch):
    """S ``TD3BC`` learners trained as one (``TD3BC._update_once``, stacked)."""

    LEARNER = TD3BC
    NETS = ("actor", "critic", "actor_target", "critic_target")
    OPTIMIZED = ("actor", "critic")
    METRIC_KEYS = TD3BC.METRIC_KEYS
    CHECKED = ("loss/critic", "train/grad_norm/critic", "loss/actor", "train/grad_norm/actor")

    def _checked(self, steps: torch.Tensor) -> torch.Tensor:
        """The actor columns on the updates that step the actor, the critic's on every one."""
        phase = 0 if self.cfg.actor_on_first_update else self.cfg.policy_freq - 1
        actor = (steps % self.cfg.policy_freq == phase)[:, None]  # [U, 1]
        return torch.cat([torch.ones_like(actor).expand(-1, 2), actor.expand(-1, 2)], dim=1)

    def _draws(self, st: dict[str, Any], gens: list[torch.Generator],
               num_updates: int) -> dict[str, torch.Tensor]:
        """Each seed's batch rows, then its target-smoothing noise [S, B, A] (``sample``, then
        ``_smoothed_next_action``)."""
        lr0 = self.learners[0]
        out = super()._draws(st, gens, num_updates)
        out["noise"] = torch.stack([
            torch.randn((self.cfg.batch_size, lr0.act_dim), device=self.device, dtype=lr0.dtype,
                        generator=g) for g in gens])
        return out

    def _next_value(self, next_q: torch.Tensor, next_action: torch.Tensor,
                    batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The bootstrap value [S, B] from the target critics' Q [S, E, B] at (s', a')."""
        return next_q.min(1).values

    def _actor_objective(self, critic: list[torch.Tensor], batch: dict[str, torch.Tensor],
                         action: torch.Tensor, alpha: float | None = None
                         ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Each seed's actor loss [S] at ``action`` = pi(s), with its metrics (``alpha``: the
        Q weight, default the config's)."""
        q_pi = self._critic(critic, batch["obs"], action, member=0)  # [S, B]
        lmbda = (self.cfg.alpha if alpha is None else alpha) / q_pi.abs().mean(-1).detach()
        bc = (action - batch["action"]).square().mean((1, 2))
        return -lmbda * q_pi.mean(-1) + bc, {"train/bc_mse": bc.detach(), "train/lambda": lmbda}

    def _after_actor(self, st: dict[str, Any], critic: list[torch.Tensor],
                     batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What an actor update does after the actor's step (MCEP: the evaluation policy's)."""
        return {}

    def _branch(self, num_updates: int) -> Hashable:
        """Whether update ``num_updates`` steps the actor and the targets."""
        phase = 0 if self.cfg.actor_on_first_update else self.cfg.policy_freq - 1
        return num_updates % self.cfg.policy_freq == phase

    def _update_once(self, st: dict[str, Any], draws: dict[str, torch.Tensor],
                     num_updates: int) -> torch.Tensor:
        """One update of every seed in ``st``; returns metrics [S, K] (NaN where skipped)."""
        cfg, table = self.cfg, st["table"]
        lr0 = self.learners[0]
        s, dev = table.shape[0], table.device
        dtype = lr0.dtype
        idx, noise = draws["idx"], draws["noise"]
        batch = self._batch(st, idx)
        if "next_actions" in st:  # ReBRAC's a'_data
            batch["next_action"] = st["next_actions"][torch.arange(s, device=dev)[:, None], idx]
        with torch.no_grad():
            mean = torch.tanh(self._mlp(st["actor_target"], batch["next_obs"]))
            noise = (noise * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
            next_action = (mean + noise).clamp(-1.0, 1.0)
            next_q = self._critic(st["critic_target"], batch["next_obs"], next_action)
            target = td_target(batch["reward"], batch["terminated"],
                               self._next_value(next_q, next_action, batch), cfg.gamma)
        q = self._critic(st["critic"], batch["obs"], batch["action"])  # [S, E, B]
        critic_loss = (q - target[:, None]).square().mean(-1).sum(-1)  # [S]
        nan = torch.full((s,), math.nan, device=dev, dtype=dtype)
        metrics = {"loss/critic": critic_loss.detach(),
                   "train/grad_norm/critic": self._step(st, "critic", critic_loss.sum()),
                   "train/q": q.detach().mean((1, 2))}
        if self._branch(num_updates):
            if cfg.lagged_actor_target:
                self._polyak(st["actor_target"], st["actor"])
            action = torch.tanh(self._mlp(st["actor"], batch["obs"]))
            critic = [p.detach() for p in st["critic"]]  # the actor's backward skips them
            actor_loss, actor_metrics = self._actor_objective(critic, batch, action)
            metrics.update({"loss/actor": actor_loss.detach(),
                            "train/grad_norm/actor": self._step(st, "actor", actor_loss.sum()),
                            **actor_metrics})
            metrics.update(self._after_actor(st, critic, batch))
            if not cfg.lagged_actor_target:
                self._polyak(st["actor_target"], st["actor"])
            self._polyak(st["critic_target"], st["critic"])
        return torch.stack([metrics.get(k, nan).to(dtype) for k in self.METRIC_KEYS], dim=1)


class SeedBatchIQL(OfflineSeedBatch):
    """S ``IQL`` learners trained as one (``IQL._update_once``, stacked; the actor's cosine
    learning rate set on every learner as ``IQL.update`` sets it)."""

    LEARNER = IQL
    NETS = ("actor", "value", "critic", "critic_target")
    OPTIMIZED = ("actor", "value", "critic")
    METRIC_KEYS = IQL.METRIC_KEYS
    CHECKED = ("loss/value", "train/grad_norm/value", "loss/actor", "train/grad_norm/actor",
               "loss/critic", "train/grad_norm/critic")
    """In the default update order (V, actor, Q): the first one named is where it began."""

    def update(self, progress: float = 0.0) -> dict[int, dict[str, float]]:
        for i in self.active:
            self.learners[i].set_actor_lr(progress)
        return super().update(progress)

    def _critic_step(self, st: dict[str, Any], batch: dict[str, torch.Tensor]
                     ) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        with torch.no_grad():
            next_v = self._mlp(st["value"], batch["next_obs"]).squeeze(-1)
            target = td_target(batch["reward"], batch["terminated"], next_v, cfg.gamma)
        q = self._critic(st["critic"], batch["obs"], batch["action"])  # [S, E, B]
        loss = (q - target[:, None]).square().mean(-1).sum(-1)  # [S]
        return {"loss/critic": loss.detach(),
                "train/grad_norm/critic": self._step(st, "critic", loss.sum()),
                "train/q": q.detach().mean((1, 2))}

    def _update_once(self, st: dict[str, Any], draws: dict[str, torch.Tensor],
                     num_updates: int) -> torch.Tensor:
        cfg = self.cfg
        batch = self._batch(st, draws["idx"])
        obs, action = batch["obs"], batch["action"]
        with torch.no_grad():
            q_target = self._critic(st["critic_target"], obs, action).min(1).values  # [S, B]
        v = self._mlp(st["value"], obs).squeeze(-1)
        diff = q_target - v
        weight = torch.where(diff < 0, 1.0 - cfg.expectile, cfg.expectile)
        v_loss = (weight * diff.square()).mean(-1)  # [S]
        metrics = {"loss/value": v_loss.detach(), "train/v_gap": diff.detach().mean(-1)}
        if not cfg.q_on_updated_value:
            metrics.update(self._critic_step(st, batch))
        metrics["train/grad_norm/value"] = self._step(st, "value", v_loss.sum())
        if cfg.actor_on_updated_value:
            with torch.no_grad():
                v = self._mlp(st["value"], obs).squeeze(-1)
        advantage = (q_target - v).detach()
        w = torch.exp(advantage / cfg.temperature).clamp(max=cfg.max_weight)
        actor_loss = -(w * self._log_prob(st["actor"], obs, action)).mean(-1)  # [S]
        metrics.update({"loss/actor": actor_loss.detach(),
                        "train/grad_norm/actor": self._step(st, "actor", actor_loss.sum()),
                        "train/weight": w.mean(-1)})
        if cfg.q_on_updated_value:
            metrics.update(self._critic_step(st, batch))
        self._polyak(st["critic_target"], st["critic"])
        dtype = self.learners[0].dtype
        return torch.stack([metrics[k].to(dtype) for k in self.METRIC_KEYS], dim=1)




class SeedBatchBC(OfflineSeedBatch):
    """S ``BC`` learners (MLP actors) trained as one (``BC._update_once``, stacked)."""

    LEARNER = BC
    NETS = ("actor",)
    OPTIMIZED = ("actor",)
    METRIC_KEYS = BC.METRIC_KEYS
    CHECKED = BC.METRIC_KEYS

    def _update_once(self, st: dict[str, Any], draws: dict[str, torch.Tensor],
                     num_updates: int) -> torch.Tensor:
        batch = self._batch(st, draws["idx"])
        action = torch.tanh(self._mlp(st["actor"], batch["obs"]))
        loss = (action - batch["action"]).square().mean((1, 2))  # [S]
        norm = self._step(st, "actor", loss.sum())
        return torch.stack([loss.detach(), norm.to(loss.dtype)], dim=1)


class SeedBatchCQL(OfflineSeedBatch):
    """S ``CQL`` learners trained as one (``CQL._update_once``, stacked): each seed's policy
    samples (the bootstrap's, the K per state of each proposal, the actor's) and uniform actions
    drawn from its own generator in its learner's order, the conservative penalty, temperature
    and Lagrange weight per seed."""

    LEARNER = CQL
    NETS = ("actor", "critic", "critic_target", "temperature", "cql_weight")
    OPTIMIZED = ("actor", "critic", "temperature", "cql_weight")
    METRIC_KEYS = CQL.METRIC_KEYS
    CHECKED = ("loss/critic", "train/grad_norm/critic", "loss/actor", "train/grad_norm/actor")

    def _optimizer(self, learner: Any, net: str) -> torch.optim.Optimizer:
        return {"temperature": learner.alpha_opt, "cql_weight": learner.weight_opt}.get(
            net) or super()._optimizer(learner, net)

    def _draws(self, st: dict[str, Any], gens: list[torch.Generator],
               num_updates: int) -> dict[str, torch.Tensor]:
        """Rows, then (actor first) the actor's sample, the bootstrap's, the uniform actions,
        the K samples at s and at s'; critic first: the actor's sample last."""
        cfg, lr0, dev = self.cfg, self.learners[0], self.device
        b, k, a, dtype = cfg.batch_size, cfg.num_actions, lr0.act_dim, lr0.dtype
        draws = super()._draws(st, gens, num_updates)
        shapes = {"pi": (b, a), "next": (b, a), "uniform": (b, k, a), "k_obs": (b * k, a),
                  "k_next": (b * k, a)}
        order = ["next", "uniform", "k_obs", "k_next"]
        order = order + ["pi"] if cfg.update_order == "critic_first" else ["pi"] + order
        per_seed: dict[str, list[torch.Tensor]] = {name: [] for name in order}
        for g in gens:
            for name in order:
                draw = torch.rand if name == "uniform" else torch.randn
                per_seed[name].append(draw(shapes[name], generator=g, device=dev, dtype=dtype))
        return {**draws, **{name: torch.stack(v) for name, v in per_seed.items()}}

    def _sample(self, st: dict[str, Any], obs: torch.Tensor, noise: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``SquashedGaussianActor.sample`` of S actors with the given noise."""
        return squashed_sample(self._mlp(st["actor"], obs), noise,
                               self.learners[0].actor.squash_epsilon)

    def _actor_step(self, st: dict[str, Any], obs: torch.Tensor, noise: torch.Tensor
                    ) -> dict[str, torch.Tensor]:
        """``CQL._update_actor``: the temperature's step, then the actor's (critics frozen)."""
        cfg = self.cfg
        log_alpha = st["temperature"][0]  # [S]
        alpha = log_alpha.detach().exp()
        pi_action, log_prob = self._sample(st, obs, noise)
        scale = log_alpha.exp() if cfg.temperature_loss == "alpha" else log_alpha
        t_loss = -(scale[:, None] * (log_prob.detach() + self.learners[0].target_entropy)
                   ).mean(-1)
        self._step(st, "temperature", t_loss.sum())
        if cfg.update_order == "critic_first":
            alpha = log_alpha.detach().exp()
        critic = [p.detach() for p in st["critic"]]
        q = self._critic(critic, obs, pi_action)  # [S, E, B]
        actor_loss = (alpha[:, None] * log_prob - q.min(1).values).mean(-1)
        return {"loss/actor": actor_loss.detach(), "train/entropy": -log_prob.detach().mean(-1),
                "train/grad_norm/actor": self._step(st, "actor", actor_loss.sum()),
                "train/alpha": alpha}

    def _critic_step(self, st: dict[str, Any], batch: dict[str, torch.Tensor],
                     draws: dict[str, torch.Tensor], alpha: torch.Tensor
                     ) -> dict[str, torch.Tensor]:
        """``CQL._update_critic``: the TD error plus the conservative penalty, and the
        Lagrange weight's step."""
        cfg, lr0 = self.cfg, self.learners[0]
        obs, action, next_obs = batch["obs"], batch["action"], batch["next_obs"]
        s, b = obs.shape[:2]
        k, a, e = cfg.num_actions, lr0.act_dim, cfg.num_critics
        with torch.no_grad():
            next_action, next_log_prob = self._sample(st, next_obs, draws["next"])
            next_q = self._critic(st["critic_target"], next_obs, next_action).min(1).values
            if cfg.backup_entropy:
                next_q = next_q - alpha[:, None] * next_log_prob
            target = td_target(batch["reward"], batch["terminated"], next_q, cfg.gamma)
            uniform = draws["uniform"] * 2 - 1  # [S, B, K, A]
            act_s, logp_s = self._sample(st, obs.repeat_interleave(k, 1), draws["k_obs"])
            act_n, logp_n = self._sample(st, next_obs.repeat_interleave(k, 1), draws["k_next"])
            sampled = torch.cat([uniform, act_n.view(s, b, k, a), act_s.view(s, b, k, a)], 2)
            log_density = torch.cat([torch.full((s, b, k), a * math.log(0.5), device=obs.device,
                                                dtype=obs.dtype),
                                     logp_n.view(s, b, k), logp_s.view(s, b, k)], 2)
        q_data = self._critic(st["critic"], obs, action)  # [S, E, B]
        q_sampled = self._critic(st["critic"], obs.repeat_interleave(3 * k, 1),
                                 sampled.view(s, b * 3 * k, a)).view(s, e, b, 3 * k)
        mse = (q_data - target[:, None]).square().mean(-1).sum(-1)  # [S]
        weighted = (q_sampled - log_density[:, None]) / cfg.cql_temperature
        lse = cfg.cql_temperature * torch.logsumexp(weighted, dim=-1)
        gap_e = (lse - q_data).mean(-1)  # [S, E]
        gap = gap_e.sum(-1)
        if cfg.lagrange:
            log_weight = st["cql_weight"][0]
            weight = log_weight.exp().clamp(0.0, 1e6) * cfg.cql_alpha
            w_loss = -(weight * (gap.detach() - e * cfg.target_action_gap)) / e
            self._step(st, "cql_weight", w_loss.sum())
            if cfg.update_order == "critic_first":
                weight = log_weight.exp().clamp(0.0, 1e6) * cfg.cql_alpha
            weight = weight.detach()
        else:
            weight = torch.full_like(gap, cfg.cql_alpha).detach()
        loss = mse + weight * gap
        return {"loss/critic": loss.detach(),
                "train/grad_norm/critic": self._step(st, "critic", loss.sum()),
                "train/q": q_data.detach().mean((1, 2)),
                "train/cql_gap": gap_e.detach().mean(-1), "train/cql_weight": weight}

    def _update_once(self, st: dict[str, Any], draws: dict[str, torch.Tensor],
                     num_updates: int) -> torch.Tensor:
        batch = self._batch(st, draws["idx"])
        alpha = st["temperature"][0].detach().exp()  # the bootstrap's alpha in both orders
        if self.cfg.update_order == "critic_first":
            metrics = self._critic_step(st, batch, draws, alpha)
            metrics.update(self._actor_step(st, batch["obs"], draws["pi"]))
        else:
            metrics = self._actor_step(st, batch["obs"], draws["pi"])
            metrics.update(self._critic_step(st, batch, draws, alpha))
        self._polyak(st["critic_target"], st["critic"])
        dtype = self.learners[0].dtype
        return torch.stack([metrics[k].to(dtype) for k in self.METRIC_KEYS], dim=1)


class SeedBatchReBRAC(SeedBatchTD3BC):
    """S ``ReBRAC`` learners trained as one: TD3+BC's batch with LayerNorm critics, the
    bootstrap penalized by ||a' - a'_data||^2 and ReBRAC's actor objective, each seed's BC
    coefficients its own (resolved from the dataset's card at attach)."""

    LEARNER = ReBRAC

    def _data(self, seeds: list[int], st: dict[str, Any]) -> None:
        super()._data(seeds, st)
        ls = [self.learners[i] for i in seeds]
        key = tuple(id(lr.next_actions) for lr in ls)
        if getattr(self, "_next", (None,))[0] != key:
            self._next = (key, torch.stack([lr.next_actions for lr in ls]))
        st["next_actions"] = self._next[1]
        self._bc = tuple(torch.tensor([getattr(lr, f"{part}_bc") for lr in ls],
                                      dtype=ls[0].dtype, device=self.device)
                         for part in ("actor", "critic"))
        """Each seed's (actor, critic) BC coefficient [S], as its learner resolved them."""

    def _critic(self, params: list[torch.Tensor], obs: torch.Tensor, action: torch.Tensor,
                member: int | None = None) -> torch.Tensor:
        """The S ensembles with LayerNorm after every hidden activation (``EnsembleQ`` with
        ``layer_norm``): Q [S, E, B]."""
        x = torch.cat([obs, action], dim=-1)
        s, e = x.shape[0], self.cfg.num_critics
        x = x[:, None].expand(s, e, *x.shape[1:]).reshape(s * e, *x.shape[1:])
        it = iter(params)
        for layer in self.learners[0].critic.net:
            if isinstance(layer, EnsembleLinear):
                w, b = next(it), next(it)
                x = ensemble_linear(x, w.reshape(s * e, *w.shape[2:]),
                                    b.reshape(s * e, *b.shape[2:]))
            elif isinstance(layer, EnsembleLayerNorm):
                w, b = next(it), next(it)
                normed = nn.functional.layer_norm(x, x.shape[-1:], eps=layer.eps)
                x = torch.addcmul(b.reshape(s * e, *b.shape[2:]), normed,
                                  w.reshape(s * e, *w.shape[2:]))
            else:
                x = layer(x)
        return x.reshape(s, e, -1)

    def _next_value(self, next_q: torch.Tensor, next_action: torch.Tensor,
                    batch: dict[str, torch.Tensor]) -> torch.Tensor:
        penalty = (next_action - batch["next_action"]).square().sum(-1)  # [S, B]
        return next_q.min(1).values - self._bc[1][:, None] * penalty

    def _actor_objective(self, critic: list[torch.Tensor], batch: dict[str, torch.Tensor],
                         action: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        q = self._critic(critic, batch["obs"], action).min(1).values  # [S, B]
        lmbda = (1.0 / q.abs().mean(-1).detach() if self.cfg.normalize_q
                 else torch.ones_like(q[:, 0]))
        squared = (action - batch["action"]).square()  # [S, B, A]
        loss = (self._bc[0][:, None] * squared.sum(-1) - lmbda[:, None] * q).mean(-1)
        return loss, {"train/bc_mse": squared.detach().mean((-2, -1)), "train/lambda": lmbda}


class SeedBatchAWAC(OfflineSeedBatch):
    """S ``AWAC`` learners trained as one (``AWAC._update_once``, stacked): each seed's
    bootstrap and V(s) samples from its own generator, its advantage weights (clipped exp or
    batch softmax) over its own batch."""

    LEARNER = AWAC
    NETS = ("actor", "critic", "critic_target")
    OPTIMIZED = ("actor", "critic")
    METRIC_KEYS = AWAC.METRIC_KEYS
    CHECKED = ("loss/critic", "train/grad_norm/critic", "loss/actor", "train/grad_norm/actor")

    def _draws(self, st: dict[str, Any], gens: list[torch.Generator],
               num_updates: int) -> dict[str, torch.Tensor]:
        """Rows, the bootstrap's noise, then the noise of the action that estimates V(s)."""
        lr0 = self.learners[0]
        shape = (self.cfg.batch_size, lr0.act_dim)
        draws = super()._draws(st, gens, num_updates)
        noise = [[torch.randn(shape, generator=g, device=self.device, dtype=lr0.dtype)
                  for _ in range(2)] for g in gens]
        return {**draws, "next": torch.stack([n[0] for n in noise]),
                "pi": torch.stack([n[1] for n in noise])}

    def _update_once(self, st: dict[str, Any], draws: dict[str, torch.Tensor],
                     num_updates: int) -> torch.Tensor:
        cfg, actor = self.cfg, st["actor"]
        batch = self._batch(st, draws["idx"])
        obs, action, next_obs = batch["obs"], batch["action"], batch["next_obs"]
        log_std = self._log_std(actor)[:, None, :]  # [S, 1, A]
        with torch.no_grad():
            mu = self._mlp(actor[1:], next_obs)
            if cfg.backup == "squashed_entropy":
                log_std_b = log_std.expand_as(mu)
                u = mu + log_std_b.exp() * draws["next"]
                next_q = self._critic(st["critic_target"], next_obs, torch.tanh(u))
                next_v = next_q.min(1).values - squashed_log_prob(draws["next"], log_std_b, u)
            else:
                next_action = (torch.tanh(mu) + log_std.exp() * draws["next"]).clamp(-1.0, 1.0)
                next_v = self._critic(st["critic_target"], next_obs, next_action).min(1).values
            target = td_target(batch["reward"], batch["terminated"], next_v, cfg.gamma)
        q = self._critic(st["critic"], obs, action)  # [S, E, B]
        critic_loss = (q - target[:, None]).square().mean(-1).sum(-1)
        metrics = {"loss/critic": critic_loss.detach(),
                   "train/grad_norm/critic": self._step(st, "critic", critic_loss.sum()),
                   "train/q": q.detach().mean((1, 2))}
        with torch.no_grad():  # one sampled action estimates V(s)
            pi_action = (torch.tanh(self._mlp(actor[1:], obs)) + log_std.exp() * draws["pi"]
                         ).clamp(-1.0, 1.0)
            advantage = (self._critic(st["critic"], obs, action).min(1).values
                         - self._critic(st["critic"], obs, pi_action).min(1).values)
        log_prob = self._log_prob(actor, obs, action)  # [S, B]
        if cfg.advantage_weights == "batch_softmax":
            weight = torch.softmax(advantage / cfg.temperature, dim=-1) * advantage.shape[-1]
            actor_loss = -(log_prob * weight).sum(-1)
        else:
            weight = torch.exp(advantage / cfg.temperature).clamp(max=cfg.max_weight)
            actor_loss = -(weight * log_prob).mean(-1)
        metrics.update({"loss/actor": actor_loss.detach(),
                        "train/grad_norm/actor": self._step(st, "actor", actor_loss.sum()),
                        "train/weight": weight.mean(-1)})
        self._polyak(st["critic_target"], st["critic"])
        metrics.update(self._after_update(st, draws, batch))
        dtype = self.learners[0].dtype
        return torch.stack([metrics[k].to(dtype) for k in self.METRIC_KEYS], dim=1)

    def _after_update(self, st: dict[str, Any], draws: dict[str, torch.Tensor],
                      batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What an update does after AWAC's (MCEP: the evaluation policy's step)."""
        return {}


class _EvaluationPolicies:
    """MCEP's evaluation policies stacked beside the rest (their optimizer: ``eval_opt``)."""

    def _optimizer(self, learner: Any, net: str) -> torch.optim.Optimizer:
        return learner.eval_opt if net == "eval_policy" else super()._optimizer(  # type: ignore[misc]
            learner, net)


class SeedBatchTD3BCMCEP(_EvaluationPolicies, SeedBatchTD3BC):
    """S ``TD3BCMCEP`` learners trained as one: TD3+BC's batch, and after each actor step the
    evaluation policies' own TD3+BC step at ``eval_alpha``."""

    LEARNER = TD3BCMCEP
    NETS = (*SeedBatchTD3BC.NETS, "eval_policy")
    OPTIMIZED = (*SeedBatchTD3BC.OPTIMIZED, "eval_policy")
    METRIC_KEYS = TD3BCMCEP.METRIC_KEYS

    def _after_actor(self, st: dict[str, Any], critic: list[torch.Tensor],
                     batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        action = torch.tanh(self._mlp(st["eval_policy"], batch["obs"]))
        loss, _ = self._actor_objective(critic, batch, action, self.cfg.eval_alpha)
        return {"loss/eval_actor": loss.detach(),
                "train/grad_norm/eval_actor": self._step(st, "eval_policy", loss.sum())}


class SeedBatchAWACMCEP(_EvaluationPolicies, SeedBatchAWAC):
    """S ``AWACMCEP`` learners trained as one: AWAC's batch, then the evaluation policies'
    step (Q of their own reparameterized sample, mean over critics, clipped at 1e4, anchored by
    ``eval_lambda`` log pi(a_data)), each sample from its seed's generator after AWAC's draws."""

    LEARNER = AWACMCEP
    NETS = (*SeedBatchAWAC.NETS, "eval_policy")
    OPTIMIZED = (*SeedBatchAWAC.OPTIMIZED, "eval_policy")
    METRIC_KEYS = AWACMCEP.METRIC_KEYS

    def _draws(self, st: dict[str, Any], gens: list[torch.Generator],
               num_updates: int) -> dict[str, torch.Tensor]:
        lr0 = self.learners[0]
        draws = super()._draws(st, gens, num_updates)
        draws["eval"] = torch.stack([
            torch.randn((self.cfg.batch_size, lr0.act_dim), generator=g, device=self.device,
                        dtype=lr0.dtype) for g in gens])
        return draws

    def _after_update(self, st: dict[str, Any], draws: dict[str, torch.Tensor],
                      batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        obs, params = batch["obs"], st["eval_policy"]
        log_std = self._log_std(params)[:, None, :]
        action = (torch.tanh(self._mlp(params[1:], obs)) + log_std.exp() * draws["eval"]
                  ).clamp(-1.0, 1.0)
        critic = [p.detach() for p in st["critic"]]
        q = self._critic(critic, obs, action).mean(1).clamp(max=1e4)  # [S, B]
        loss = (-q - self.cfg.eval_lambda * self._log_prob(params, obs, batch["action"])).mean(-1)
        return {"loss/eval_actor": loss.detach(),
                "train/grad_norm/eval_actor": self._step(st, "eval_policy", loss.sum())}
