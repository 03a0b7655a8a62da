"""Seed batches: S independent runs of one learner trained in one process.

A batch holds S ordinary learners, each built exactly as it would be alone (its own seed,
generator, normalizer, replay or dataset view). ``update`` stacks their parameters, target
networks and Adam moments along a leading seed dimension S, runs the call's updates on the
stacked tensors and writes everything back, so between calls every learner is an ordinary
learner: its ``state_dict`` is an ordinary checkpoint, its ``export_actor`` an ordinary export,
and a checkpoint loaded into it is what the next call continues from.

One update of the batch is, for each seed, the update that seed would make alone:

* its random draws (batch rows, policy noise) come from the seed's own generator, in the order
  its learner draws them (``_draws``);
* the critics of all seeds are one ensemble of S x E members (``ensemble_linear``: one batched
  product per layer), the actors (and other networks) one ensemble of S members;
* the losses are the learner's per-seed losses, summed over seeds for one backward per
  network: seeds share no parameter, so each seed's gradient is the gradient of its own loss;
* one fused Adam step over the stacked tensors at the learner's own learning rate and betas
  (Adam is elementwise; none of the batched learners clips gradients, so there is no norm
  across the stacked tensor to keep per seed); the gradient norms reported are per seed;
* Polyak averaging of the stacked targets (the same ``_foreach_lerp_``).

Equality with separate runs is tested in float64 (``tests/algos/test_seed_batch*.py``); in
float32 the batched products may round differently from the solo ones. Subclasses:
``robotrl.algos.offline.seed_batch`` (every offline learner), ``SeedBatchSAC``,
``SeedBatchCrossQ`` and ``SeedBatchFastTD3`` below; PPO's, whose update is epochs of
minibatches, is ``robotrl.algos.ppo_seed_batch``.

On a CUDA device the updates of a call are replayed from CUDA graphs (``cuda_graphs``, on by
default there: every batch's graphed updates equal each seed alone in float64 on an H100,
``pytest -m gpu``, 2026-11-26): each seed's random draws are made as above, outside the graph,
and copied into the graph's static inputs; the rest of an update (sampling rows, forward,
backward, Adam with ``capturable`` step counts, Polyak) is one graph launch instead of ~100
kernel launches. A graph is recorded per kind of update (e.g. with or without a delayed actor
step) after that kind has run eagerly twice in the call (so every optimizer state exists before
recording), and is dropped at the end of the call. ``tests/algos/test_seed_batch*.py`` compare
graphed batches with each seed alone on a GPU.

Divergence: after each ``update`` call (one host read) a seed whose critic loss or gradient
norm (or, on actor updates, actor loss or gradient norm) is non-finite is stopped: its learner
keeps the parameters of the end of the previous call (its last good state), a ``SeedStop``
records which seed, which update and which metric, and the following calls train the
remaining seeds only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import nn

from robotrl.algos.crossq import CrossQ
from robotrl.algos.fasttd3 import (
    FastTD3,
    categorical_projection,
    clipped_double_target,
    expected_value,
)
from robotrl.algos.sac import SAC
from robotrl.nn.batch_renorm import RENORM_VARIANTS, BatchRenorm, _stat_dtype
from robotrl.nn.ensemble import EnsembleLinear
from robotrl.nn.linear import ensemble_linear, precision_autocast, stacked_linear
from robotrl.nn.mlp import make_activation
from robotrl.nn.squashed_gaussian import LOG_STD_MAX, LOG_STD_MIN, squashed_log_prob
from robotrl.optim import GRADIENT_HOOKS, adam


@dataclasses.dataclass
class SeedStop:
    """A seed stopped for a non-finite value."""

    seed: int
    """Position of the seed in the batch."""
    update: int
    """The (1-based) update whose value was non-finite (``num_updates`` after it)."""
    metric: str
    """The first non-finite metric of that update, e.g. ``loss/critic``."""
    value: float
    """Its value (NaN or +-inf)."""
    last_good: int
    """``num_updates`` of the parameters the stopped learner keeps (its last good state)."""

    def message(self) -> str:
        return (f"seed {self.seed} stopped: {self.metric} = {self.value} at update "
                f"{self.update}; it keeps its parameters of update {self.last_good}")


def squashed_sample(raw: torch.Tensor, noise: torch.Tensor, epsilon: float = 0.0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``SquashedGaussianActor.sample`` from S actors' network outputs ``raw`` [S, B, 2 A]
    (mean, then log std) and the seeds' ``noise`` [S, B, A]: (actions [S, B, A] in (-1, 1),
    log pi [S, B])."""
    mean, log_std = raw.chunk(2, dim=-1)
    log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
    u = mean + log_std.exp() * noise
    return torch.tanh(u), squashed_log_prob(noise, log_std, u, epsilon)


def same_learners(learners: Sequence[Any], learner: type, batch: str) -> Any:
    """The config every one of ``learners`` shares; TypeError for one of another class than
    ``learner`` (subclasses change the losses), ValueError for none or differing configs."""
    if not learners:
        raise ValueError("a seed batch needs at least one learner")
    for one in learners:
        if type(one) is not learner:
            raise TypeError(f"{batch} batches {learner.__name__} only, got {type(one).__name__}")
    cfg = learners[0].cfg
    if any(one.cfg != cfg for one in learners[1:]):
        raise ValueError("every learner of a seed batch needs the same config")
    return cfg


def _stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.stack([t.detach() for t in tensors]).contiguous()


class SeedBatch:
    """S learners of one class trained as one; see the module docstring. Subclasses name the
    learner class, its stacked networks and optimized ones, and write ``_update_once``.

    Attributes:
        learners: the S learners (``learners[i].state_dict()`` is seed i's checkpoint).
        stopped: ``{seed: SeedStop}`` of the seeds stopped for a non-finite value.
    """

    LEARNER: type
    NETS: tuple[str, ...]
    """Every network stacked (learner attributes), targets included."""
    OPTIMIZED: tuple[str, ...]
    """The networks with an optimizer (``<net>_opt`` on the learner)."""
    METRIC_KEYS: tuple[str, ...]
    CHECKED: tuple[str, ...]
    """Metrics whose non-finite value stops a seed."""

    GRAPH_WARMUP = 2
    """Eager updates of a kind, per ``update`` call, before that kind is recorded as a graph."""

    def __init__(self, learners: Sequence[Any], cuda_graphs: bool | None = None) -> None:
        cfg = same_learners(learners, self.LEARNER, type(self).__name__)
        self.learners = list(learners)
        self.cfg: Any = cfg
        self.stopped: dict[int, SeedStop] = {}
        self.device: torch.device = learners[0].device
        self._act: nn.Module = make_activation(cfg.activation)
        on_cuda = learners[0].device.type == "cuda"
        if cuda_graphs and not on_cuda:
            raise ValueError(f"cuda_graphs=True needs learners on a CUDA device, got "
                             f"{learners[0].device}")
        self.cuda_graphs = on_cuda if cuda_graphs is None else cuda_graphs
        """Replay the updates from CUDA graphs (default: on a CUDA device)."""

    @property
    def active(self) -> list[int]:
        """Seeds still training."""
        return [i for i in range(len(self.learners)) if i not in self.stopped]

    # ------------------------------------------------------------------ stacking
    def _gather(self, seeds: list[int]) -> dict[str, Any]:
        ls = [self.learners[i] for i in seeds]
        st: dict[str, Any] = {}
        for net in self.NETS:
            params = [self._params(lr, net) for lr in ls]
            st[net] = [_stack(group) for group in zip(*params, strict=True)]
        for net in self.OPTIMIZED:
            for p in st[net]:
                p.requires_grad_(True)
            solo = [self._optimizer(lr, net) for lr in ls]
            group = solo[0].param_groups[0]  # the learner's lr (and betas) as they are now
            opt = adam(st[net], group["lr"], group["betas"], weight_decay=group["weight_decay"],
                       capturable=self.cuda_graphs)
            if type(opt) is not type(solo[0]):
                raise TypeError(f"{type(self).__name__}: the {net} optimizer is a "
                                f"{type(solo[0]).__name__}; a batch steps Adam or AdamW")
            params = [self._params(lr, net) for lr in ls]
            first = solo[0].state.get(params[0][0])
            if first is not None:
                steps = {float(o.state[ps[0]]["step"]) for o, ps in zip(solo, params, strict=True)}
                if len(steps) != 1:
                    raise ValueError(f"the {net} optimizers of a seed batch must be at the same "
                                     f"step, got {sorted(steps)}")
                for k, p in enumerate(st[net]):
                    states = [o.state[ps[k]] for o, ps in zip(solo, params, strict=True)]
                    opt.state[p] = {"step": states[0]["step"].clone(),
                                    "exp_avg": _stack([s["exp_avg"] for s in states]),
                                    "exp_avg_sq": _stack([s["exp_avg_sq"] for s in states])}
            st[f"{net}_opt"] = opt
        self._data(seeds, st)
        return st

    def _params(self, learner: Any, net: str) -> list[torch.Tensor]:
        """The tensors of ``net`` on ``learner`` (a module's ``parameters()``)."""
        return list(getattr(learner, net).parameters())

    def _optimizer(self, learner: Any, net: str) -> torch.optim.Optimizer:
        """The optimizer of ``net`` on ``learner`` (``<net>_opt``)."""
        return getattr(learner, f"{net}_opt")

    def _data(self, seeds: list[int], st: dict[str, Any]) -> None:
        """Put into ``st`` what ``_draws`` and ``_update_once`` read of the seeds' data."""

    def _count(self, learners: list[Any]) -> int:
        """How many updates this ``update`` call makes (the same for every seed)."""
        raise NotImplementedError

    def _advance(self, learner: Any, start: int, n: int) -> None:
        """Counters of a seed after ``n`` updates from ``start``."""
        learner.num_updates = start + n

    def _scatter(self, seeds: list[int], st: dict[str, Any]) -> None:
        for j, i in enumerate(seeds):
            lr = self.learners[i]
            with torch.no_grad():
                for net in self.NETS:
                    for p, stacked in zip(self._params(lr, net), st[net], strict=True):
                        p.copy_(stacked[j])
            for net in self.OPTIMIZED:
                opt, solo = st[f"{net}_opt"], self._optimizer(lr, net)
                for p, stacked in zip(self._params(lr, net), st[net], strict=True):
                    s = opt.state.get(stacked)
                    if not s:  # a network that has not stepped yet (a fixed temperature)
                        continue
                    solo.state[p] = {"step": s["step"].clone(),
                                     "exp_avg": s["exp_avg"][j].clone(),
                                     "exp_avg_sq": s["exp_avg_sq"][j].clone()}

    def _select(self, st: dict[str, Any], keep: list[int]) -> dict[str, Any]:
        """``st`` restricted to the batch positions ``keep`` (for the scatter of the good seeds:
        positions index the leading dimension, so the positions of ``_scatter`` are remapped)."""
        if len(keep) == st[self.NETS[0]][0].shape[0]:
            return st
        index = torch.tensor(keep, device=st[self.NETS[0]][0].device)
        out: dict[str, Any] = {}
        for net in self.NETS:
            out[net] = [p.detach().index_select(0, index) for p in st[net]]
        for net in self.OPTIMIZED:
            opt = st[f"{net}_opt"]
            out[f"{net}_opt"] = _StateView({
                q: {"step": opt.state[p]["step"],
                    "exp_avg": opt.state[p]["exp_avg"].index_select(0, index),
                    "exp_avg_sq": opt.state[p]["exp_avg_sq"].index_select(0, index)}
                for p, q in zip(st[net], out[net], strict=True) if opt.state.get(p)})
        return out

    # ------------------------------------------------------------------ networks
    def _mlp(self, params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """S MLPs (``robotrl.nn.mlp``'s ``nn.Linear`` layers, weights [S, out, in], biases
        [S, out], stacked): [S, B, in] -> [S, B, out], no output activation."""
        n = len(params) // 2
        for k in range(n):
            w, b = params[2 * k], params[2 * k + 1]
            x = stacked_linear(x, w.transpose(1, 2), b[:, None, :])
            if k < n - 1:
                x = self._act(x)
        return x

    def _critic(self, params: list[torch.Tensor], obs: torch.Tensor, action: torch.Tensor,
                member: int | None = None) -> torch.Tensor:
        """S ensembles of E critics: [S, B, O], [S, B, A] -> Q [S, E, B] (all members, as one
        ensemble of S E members; [S, E, B, K] with K outputs) or [S, B] (``member`` alone, as
        ``EnsembleQ.member``)."""
        x = torch.cat([obs, action], dim=-1)  # [S, B, in]
        s, e = x.shape[0], self.cfg.num_critics
        if member is not None:
            n = len(params) // 2
            for k in range(n):
                w, b = params[2 * k][:, member], params[2 * k + 1][:, member]
                x = stacked_linear(x, w, b)
                if k < n - 1:
                    x = self._act(x)
            return x.squeeze(-1)
        x = x[:, None].expand(s, e, *x.shape[1:]).reshape(s * e, *x.shape[1:])
        n = len(params) // 2
        for k in range(n):
            w, b = params[2 * k], params[2 * k + 1]
            x = ensemble_linear(x, w.reshape(s * e, *w.shape[2:]), b.reshape(s * e, *b.shape[2:]))
            if k < n - 1:
                x = self._act(x)
        return x.reshape(s, e, x.shape[1], -1).squeeze(-1)  # [S, E, B] or [S, E, B, K]

    # ------------------------------------------------------------------ learning
    def _draws(self, st: dict[str, Any], gens: list[torch.Generator],
               num_updates: int) -> dict[str, torch.Tensor]:
        """Update ``num_updates``'s random draws, each seed's from its own generator in the order
        its learner draws them: here the batch rows ``idx`` [S, B] (uniform over ``st["rows"]``,
        as the learner's ``sample``)."""
        return {"idx": torch.stack([torch.randint(st["rows"], (self.cfg.batch_size,),
                                                  device=self.device, generator=g)
                                    for g in gens])}

    def _branch(self, num_updates: int) -> Hashable:
        """The kind of update numbered ``num_updates`` (one CUDA graph per kind)."""
        return None

    def _polyak(self, target: list[torch.Tensor], source: list[torch.Tensor]) -> None:
        with torch.no_grad():
            torch._foreach_lerp_(target, [p.detach() for p in source], self.cfg.tau)

    def _step(self, st: dict[str, Any], net: str, loss: torch.Tensor) -> torch.Tensor:
        """Backward of the summed per-seed losses, one Adam step; per-seed gradient norms [S]."""
        opt, params = st[f"{net}_opt"], st[net]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        s = params[0].shape[0]
        sq = torch.stack([p.grad.reshape(s, -1).square().sum(1) for p in params]).sum(0)
        opt.step()
        return sq.sqrt()

    def _update_once(self, st: dict[str, Any], draws: dict[str, torch.Tensor],
                     num_updates: int) -> torch.Tensor:
        """One update of every seed in ``st`` with ``draws`` (``_draws``); metrics [S, K] in
        ``METRIC_KEYS`` order (NaN where a delayed update did not run). No host reads: it is
        recorded in CUDA graphs."""
        raise NotImplementedError

    def _run(self, st: dict[str, Any], gens: list[torch.Generator], start: int,
             n: int) -> torch.Tensor:
        """Updates ``start`` .. ``start + n - 1`` of every seed in ``st``: metrics [U, S, K]."""
        dev = self.device
        if not self.cuda_graphs:
            return torch.stack([self._update_once(st, self._draws(st, gens, start + u), start + u)
                                for u in range(n)])
        current = torch.cuda.current_stream(dev)
        side = torch.cuda.Stream(dev)
        eager: dict[Hashable, int] = {}
        graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor],
                                     torch.Tensor]] = {}
        rows = []
        for u in range(n):
            draws = self._draws(st, gens, start + u)
            kind = self._branch(start + u)
            if eager.get(kind, 0) < self.GRAPH_WARMUP:  # as torch's docs: warm up on a side stream
                eager[kind] = eager.get(kind, 0) + 1
                side.wait_stream(current)
                with torch.cuda.stream(side):
                    rows.append(self._update_once(st, draws, start + u))
                current.wait_stream(side)
                continue
            if kind not in graphs:
                static = {k: v.clone() for k, v in draws.items()}
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):  # records; runs nothing
                    out = self._update_once(st, static, start + u)
                graphs[kind] = (graph, static, out)
            graph, static, out = graphs[kind]
            for k, v in draws.items():
                static[k].copy_(v)
            graph.replay()
            rows.append(out.clone())
        return torch.stack(rows)

    def _checked(self, steps: torch.Tensor) -> torch.Tensor:
        """[U, C]: whether ``CHECKED`` metric c is computed on the update numbered
        ``steps[u]`` (delayed updates leave NaN by schedule elsewhere)."""
        return torch.ones(len(steps), len(self.CHECKED), dtype=torch.bool, device=steps.device)

    def update(self, progress: float = 0.0) -> dict[int, dict[str, float]]:
        """``cfg.updates_per_iteration`` updates of every active seed; returns each active
        seed's metrics as the learner's ``update`` would (seeds stopped in this call are left
        out and recorded in ``stopped``)."""
        if GRADIENT_HOOKS:
            raise RuntimeError("seed batching does not support gradient hooks (data parallel)")
        seeds = self.active
        if not seeds:
            return {}
        ls = [self.learners[i] for i in seeds]
        start = ls[0].num_updates
        if any(lr.num_updates != start for lr in ls):
            raise ValueError("the learners of a seed batch must be at the same update, got "
                             f"{[lr.num_updates for lr in ls]}")
        n = self._count(ls)
        if n == 0:
            return {i: {} for i in seeds}
        st = self._gather(seeds)
        gens = [lr.generator for lr in ls]
        gen_states = [g.get_state() for g in gens]  # restored for seeds stopped in this call
        with precision_autocast(self.device, self.cfg.precision):
            rows = self._run(st, gens, start, n)  # [U, S, K]
        checked = [self.METRIC_KEYS.index(k) for k in self.CHECKED]
        values = rows[:, :, checked]  # [U, S, C]
        steps = torch.arange(start, start + n, device=rows.device)
        bad = ~torch.isfinite(values) & self._checked(steps)[:, None, :]
        means = rows.nanmean(0)  # [S, K]
        first = torch.where(bad.any(-1), torch.arange(n, device=rows.device)[:, None], n)
        first_row = first.min(0).values  # [S]: n if the seed stayed finite
        host = torch.cat([means.flatten().double(), first_row.double()]).tolist()
        k = len(self.METRIC_KEYS)
        out: dict[int, dict[str, float]] = {}
        good: list[int] = []
        for j, i in enumerate(seeds):
            row = int(host[len(seeds) * k + j])
            if row < n:
                metric_pos = int(bad[row, j].nonzero()[0])
                value = float(values[row, j, metric_pos])
                self.stopped[i] = SeedStop(i, start + row + 1, self.CHECKED[metric_pos], value,
                                           start)
                gens[j].set_state(gen_states[j])
                continue
            good.append(j)
            m = {key: v for key, v in zip(self.METRIC_KEYS, host[j * k:(j + 1) * k], strict=True)
                 if not math.isnan(v)}
            m["train/updates"] = float(start + n)
            out[i] = m
        if good:
            self._scatter([seeds[j] for j in good], self._select(st, good))
            for j in good:
                self._advance(self.learners[seeds[j]], start, n)
        return out

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Every seed's ordinary checkpoint, and the stops."""
        return {"seeds": [lr.state_dict() for lr in self.learners],
                "stopped": {i: dataclasses.asdict(s) for i, s in self.stopped.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for lr, s in zip(self.learners, state["seeds"], strict=True):
            lr.load_state_dict(s)
        self.stopped = {int(i): SeedStop(**s) for i, s in state["stopped"].items()}


class OffPolicySeedBatch(SeedBatch):
    """S replay learners (``OffPolicyLearner``) trained as one. Each seed collects in its own
    worlds and stores into its own replay (its runner does that, as alone); a call runs the
    updates every seed has earned (the same count: the seeds store alike) on rows each seed
    draws from its own replay."""

    FIELDS = ("obs", "action", "reward", "next_obs", "terminated")
    """The replay fields an update reads."""

    def _count(self, learners: list[Any]) -> int:
        """The updates each seed has earned (``OffPolicyLearner.update``'s), 0 while a replay
        holds less than a batch."""
        counts = {int(lr.owed_updates) for lr in learners}
        sizes = {len(lr.buffer) for lr in learners}
        if len(counts) != 1 or len(sizes) != 1:
            raise ValueError(f"the seeds of a batch must have stored alike, got owed updates "
                             f"{sorted(counts)} and replay sizes {sorted(sizes)}")
        count, size = counts.pop(), sizes.pop()
        return 0 if size < self.cfg.batch_size else count

    def _advance(self, learner: Any, start: int, n: int) -> None:
        learner.num_updates = start + n
        learner.owed_updates -= n

    def _data(self, seeds: list[int], st: dict[str, Any]) -> None:
        buffers = [self.learners[i].buffer for i in seeds]
        st["rows"] = len(buffers[0])
        st["replay"] = {f: [getattr(b, f) for b in buffers] for f in self.FIELDS}

    def _batch(self, st: dict[str, Any], idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each seed's rows ``idx`` [S, B] of its own replay: fields [S, B, ...]."""
        return {f: torch.stack([col[i] for col, i in zip(cols, idx, strict=True)])
                for f, cols in st["replay"].items()}

    def _actor_step(self, num_updates: int) -> bool:
        """Whether update ``num_updates`` (0-based) steps the actor (the learner counts the
        update first, then steps the actor every ``actor_update_interval``)."""
        return (num_updates + 1) % self.cfg.actor_update_interval == 0

    def _branch(self, num_updates: int) -> Hashable:
        return self._actor_step(num_updates)

    def _checked(self, steps: torch.Tensor) -> torch.Tensor:
        """The actor columns on the updates that step the actor, the critic's on every one."""
        actor = ((steps + 1) % self.cfg.actor_update_interval == 0)[:, None]
        return torch.cat([torch.ones_like(actor).expand(-1, 2), actor.expand(-1, 2)], dim=1)


class SeedBatchSAC(OffPolicySeedBatch):
    """S ``SAC`` learners trained as one (``SAC._update_once``, stacked, the temperature too)."""

    LEARNER = SAC
    METRIC_KEYS = SAC.metric_keys
    NETS = ("actor", "critic", "critic_target", "log_alpha")
    OPTIMIZED = ("actor", "critic", "log_alpha")
    CHECKED = ("loss/critic", "train/grad_norm/critic", "loss/actor", "train/grad_norm/actor")

    def __init__(self, learners: Sequence[Any], cuda_graphs: bool | None = None) -> None:
        super().__init__(learners, cuda_graphs)
        lr0 = learners[0]
        self.obs_dim, self.act_dim, self.eps = lr0.obs_dim, lr0.act_dim, self.cfg.squash_epsilon
        self.target_entropy = lr0.target_entropy

    def _params(self, learner: Any, net: str) -> list[torch.Tensor]:
        return [learner.log_alpha] if net == "log_alpha" else super()._params(learner, net)

    def _optimizer(self, learner: Any, net: str) -> torch.optim.Optimizer:
        return learner.alpha_opt if net == "log_alpha" else super()._optimizer(learner, net)

    def _draws(self, st: dict[str, Any], gens: list[torch.Generator],
               num_updates: int) -> dict[str, torch.Tensor]:
        """Each seed's replay rows, its next-action noise and, on actor updates, its action
        noise, in that order (``buffer.sample``, ``_critic_update``, ``_actor_update``)."""
        cfg, dev = self.cfg, self.device
        shape = (cfg.batch_size, self.act_dim)
        idx, next_noise, noise = [], [], []
        actor = self._actor_step(num_updates)
        for g in gens:
            idx.append(torch.randint(0, st["rows"], (cfg.batch_size,), generator=g, device=dev))
            next_noise.append(torch.randn(shape, generator=g, device=dev))
            if actor:
                noise.append(torch.randn(shape, generator=g, device=dev))
        out = {"idx": torch.stack(idx), "next_noise": torch.stack(next_noise)}
        if actor:
            out["noise"] = torch.stack(noise)
        return out

    def _policy(self, st: dict[str, Any], obs: torch.Tensor, train: bool = False
                ) -> torch.Tensor:
        """The S actors' networks on the ``policy`` columns of ``obs``: [S, B, 2 A]
        (``train``: CrossQ's normalization in training mode)."""
        return self._mlp(st["actor"], obs[..., : self.obs_dim])

    def _sample(self, st: dict[str, Any], obs: torch.Tensor, noise: torch.Tensor,
                train: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``SquashedGaussianActor.sample`` of S actors with the given noise: ([S, B, A] in
        (-1, 1), log pi [S, B])."""
        return squashed_sample(self._policy(st, obs, train), noise, self.eps)

    def _critic_values(self, st: dict[str, Any], batch: dict[str, torch.Tensor],
                       next_action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q of the stored (s, a) [S, E, B], the target critics' Q of (s', a') [S, E, B],
        without gradient)."""
        with torch.no_grad():
            next_q = self._critic(st["critic_target"], batch["next_obs"], next_action)
        return self._critic(st["critic"], batch["obs"], batch["action"]), next_q

    def _actor_values(self, st: dict[str, Any], obs: torch.Tensor, action: torch.Tensor
                      ) -> torch.Tensor:
        """The critics at the actor's actions [S, E, B], their parameters frozen."""
        return self._critic([p.detach() for p in st["critic"]], obs, action)

    def _update_once(self, st: dict[str, Any], draws: dict[str, torch.Tensor],
                     num_updates: int) -> torch.Tensor:
        cfg = self.cfg
        batch = self._batch(st, draws["idx"])
        log_alpha = st["log_alpha"][0]  # [S]
        alpha = log_alpha.detach().exp()[:, None]  # [S, 1]
        with torch.no_grad():
            next_action, next_log_prob = self._sample(st, batch["next_obs"], draws["next_noise"])
        q, next_q = self._critic_values(st, batch, next_action)  # [S, E, B]
        with torch.no_grad():
            soft = next_q.min(1).values - alpha * next_log_prob  # [S, B]
            target = batch["reward"] + cfg.gamma * (~batch["terminated"]) * soft
        critic_loss = 0.5 * (q - target[:, None]).square().mean(-1).sum(-1)  # [S]
        metrics = {"loss/critic": critic_loss.detach(),
                   "train/grad_norm/critic": self._step(st, "critic", critic_loss.sum()),
                   "train/q": q.detach().mean((1, 2)), "train/alpha": alpha[:, 0]}
        if self._actor_step(num_updates):
            action, log_prob = self._sample(st, batch["obs"], draws["noise"], train=True)
            q_pi = self._actor_values(st, batch["obs"], action).min(1).values  # [S, B]
            actor_loss = (alpha * log_prob - q_pi).mean(-1)
            metrics.update({"loss/actor": actor_loss.detach(),
                            "train/grad_norm/actor": self._step(st, "actor", actor_loss.sum()),
                            "train/entropy": -log_prob.detach().mean(-1)})
            if cfg.autotune_alpha:
                t_loss = -(log_alpha[:, None] * (log_prob.detach() + self.target_entropy)
                           ).mean(-1)
                metrics.update({"loss/alpha": t_loss.detach(), "train/grad_norm/alpha":
                                self._step(st, "log_alpha", t_loss.sum())})
        if "critic_target" in st:
            self._polyak(st["critic_target"], st["critic"])
        nan = torch.full_like(critic_loss, math.nan)
        return torch.stack([metrics.get(k, nan).to(nan.dtype) for k in self.METRIC_KEYS], dim=1)


class SeedBatchCrossQ(SeedBatchSAC):
    """S ``CrossQ`` learners trained as one: SAC's batch without target critics, every network
    walked layer by layer with each seed's Batch Renormalization statistics (stacked and
    updated in place by the training-mode forwards: the critics on the joint batch of (s, a) and
    (s', a'), the actor on its own step; running statistics elsewhere). The renormalization's
    warm-up is counted per update, as the layers count their training forwards."""

    LEARNER = CrossQ
    NETS = ("actor", "critic", "log_alpha", "actor_stats", "critic_stats")
    OPTIMIZED = ("actor", "critic", "log_alpha")

    def _params(self, learner: Any, net: str) -> list[torch.Tensor]:
        if net.endswith("_stats"):  # the running statistics, carried like parameters
            return [t for m in _renorms(getattr(learner, net[: -len("_stats")]))
                    for t in (m.running_mean, m.running_var)]
        return super()._params(learner, net)

    def _data(self, seeds: list[int], st: dict[str, Any]) -> None:
        super()._data(seeds, st)
        ls = [self.learners[i] for i in seeds]
        counts = {(int(_renorms(lr.actor)[0].steps), int(_renorms(lr.critic)[0].steps))
                  for lr in ls}
        if len(counts) != 1:
            raise ValueError(f"the seeds of a batch must have normalized alike, got (actor, "
                             f"critic) training forwards {sorted(counts)}")
        self._steps0, self._start = counts.pop(), ls[0].num_updates

    def _forwards(self, num_updates: int) -> tuple[int, int]:
        """(actor, critic) training forwards of each layer before update ``num_updates``."""
        k, start = self.cfg.actor_update_interval, self._start
        actor0, critic0 = self._steps0
        return actor0 + num_updates // k - start // k, critic0 + num_updates - start

    def _branch(self, num_updates: int) -> Hashable:
        """(actor step, critic renormalizes, actor renormalizes): past the warm-up, a layer's
        training forward corrects towards the running statistics."""
        actor, critic = self._forwards(num_updates)
        warm = self.cfg.renorm_warmup
        step = self._actor_step(num_updates)
        return step, critic + 1 > warm, step and actor + 1 > warm

    def _advance(self, learner: Any, start: int, n: int) -> None:
        super()._advance(learner, start, n)
        for net, count in zip(("actor", "critic"), self._forwards(start + n), strict=True):
            for m in _renorms(getattr(learner, net)):
                m.steps.fill_(count)
                m._steps = None  # the layer reads its count again

    def _walk(self, module: nn.Module, params: list[torch.Tensor], stats: list[torch.Tensor],
              x: torch.Tensor, correct: bool | None) -> torch.Tensor:
        """``module``'s layers (learner 0's: their kinds and settings) on S stacked sets of
        parameters and statistics; ``correct`` None: evaluation mode (running statistics),
        else training mode (batch statistics, renormalized when True; statistics updated)."""
        p, r = iter(params), iter(stats)
        for layer in module:
            if isinstance(layer, BatchRenorm):
                w, b, mean, var = next(p), next(p), next(r), next(r)
                if correct is False and layer.variant == "ioffe":  # as the layer: torch's kernel
                    x = _batch_norm(layer, x, w, b, mean, var)
                    continue
                if layer.members is None:  # [S, H] -> [S, 1, H] against x [S, B, H]
                    w, b, mean, var = (t[:, None] for t in (w, b, mean, var))
                xf = x.to(_stat_dtype(x))
                if correct is None:
                    x_hat = (xf - mean) / (var + layer.eps).sqrt()
                else:
                    x_hat, batch_mean, batch_var = RENORM_VARIANTS[layer.variant](
                        xf, mean, var, layer.eps, layer.rmax, layer.dmax, correct, True)
                    with torch.no_grad():
                        mean.lerp_(batch_mean, layer.momentum)
                        var.lerp_(batch_var, layer.momentum)
                x = torch.addcmul(b, x_hat, w).to(x.dtype)
            elif isinstance(layer, EnsembleLinear):
                w, b = next(p), next(p)  # [S, E, in, out], [S, E, 1, out]
                s, e = w.shape[:2]
                y = ensemble_linear(x.reshape(s * e, *x.shape[2:]),
                                    w.reshape(s * e, *w.shape[2:]), b.reshape(s * e, *b.shape[2:]))
                x = y.reshape(s, e, *y.shape[1:])
            elif isinstance(layer, nn.Linear):
                w, b = next(p), next(p)
                x = stacked_linear(x, w.transpose(1, 2), b[:, None, :])
            else:  # an activation
                x = layer(x)
        return x

    def _policy(self, st: dict[str, Any], obs: torch.Tensor, train: bool = False
                ) -> torch.Tensor:
        correct = self._correct[2] if train else None
        return self._walk(self.learners[0].actor.net, st["actor"], st["actor_stats"],
                          obs[..., : self.obs_dim], correct)

    def _q(self, st: dict[str, Any], params: list[torch.Tensor], obs: torch.Tensor,
           action: torch.Tensor, correct: bool | None) -> torch.Tensor:
        x = torch.cat([obs, action], dim=-1)  # [S, B, in] -> every member's [S, E, B, in]
        x = x[:, None].expand(x.shape[0], self.cfg.num_critics, *x.shape[1:])
        return self._walk(self.learners[0].critic.net, params, st["critic_stats"], x,
                          correct).squeeze(-1)

    def _critic_values(self, st: dict[str, Any], batch: dict[str, torch.Tensor],
                       next_action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One training-mode forward of (s, a) and (s', a') together (CrossQ's joint batch)."""
        b = batch["reward"].shape[1]
        q_all = self._q(st, st["critic"], torch.cat([batch["obs"], batch["next_obs"]], 1),
                        torch.cat([batch["action"], next_action], 1), self._correct[1])
        q, next_q = q_all.split(b, dim=-1)
        return q, next_q.detach()

    def _actor_values(self, st: dict[str, Any], obs: torch.Tensor, action: torch.Tensor
                      ) -> torch.Tensor:
        return self._q(st, [p.detach() for p in st["critic"]], obs, action, None)

    def _update_once(self, st: dict[str, Any], draws: dict[str, torch.Tensor],
                     num_updates: int) -> torch.Tensor:
        self._correct = self._branch(num_updates)
        return super()._update_once(st, draws, num_updates)


def _renorms(module: nn.Module) -> list[BatchRenorm]:
    return [m for m in module.modules() if isinstance(m, BatchRenorm)]


def _batch_norm(layer: BatchRenorm, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """``BatchRenorm._batch_norm`` of S stacked layers: x [..., B, H] as [B, (...) H] columns
    through ``F.batch_norm`` (the statistics updated in place, as the layer's)."""
    b = x.shape[-2]
    flat = x.to(_stat_dtype(x)).movedim(-2, 0).reshape(b, -1)
    y = nn.functional.batch_norm(flat, mean.view(-1), var.view(-1), weight.reshape(-1),
                                 bias.reshape(-1), training=True, momentum=layer.momentum,
                                 eps=layer.eps)
    return y.view(b, *x.shape[:-2], x.shape[-1]).movedim(0, -2).to(x.dtype)


class SeedBatchFastTD3(OffPolicySeedBatch):
    """S ``FastTD3`` learners trained as one (``FastTD3._update_once``, stacked): each seed's
    replay rows normalized by its own running statistics (updated while it acts, fixed during
    a call), its twin distributional critics projected and clipped per seed."""

    LEARNER = FastTD3
    METRIC_KEYS = FastTD3.metric_keys
    NETS = ("actor", "critic", "critic_target")
    OPTIMIZED = ("actor", "critic")
    CHECKED = ("loss/critic", "train/grad_norm/critic", "loss/actor", "train/grad_norm/actor")

    def __init__(self, learners: Sequence[Any], cuda_graphs: bool | None = None) -> None:
        super().__init__(learners, cuda_graphs)
        self.obs_dim = learners[0].obs_dim
        self.support = learners[0].support

    def _data(self, seeds: list[int], st: dict[str, Any]) -> None:
        super()._data(seeds, st)
        norms = [self.learners[i].normalizer for i in seeds]
        if norms[0] is not None:  # RunningNormalizer.forward's arithmetic, per seed
            st["norm"] = (torch.stack([n.mean for n in norms])[:, None],
                          torch.stack([torch.sqrt(n.var + n.eps) for n in norms])[:, None],
                          norms[0].clip)

    def _norm(self, st: dict[str, Any], x: torch.Tensor) -> torch.Tensor:
        if "norm" not in st:
            return x
        mean, std, clip = st["norm"]
        return torch.clamp((x - mean.to(x.dtype)) / std.to(x.dtype), -clip, clip)

    def _draws(self, st: dict[str, Any], gens: list[torch.Generator],
               num_updates: int) -> dict[str, torch.Tensor]:
        """Each seed's replay rows, then its target-smoothing noise (``buffer.sample``,
        ``_critic_update``)."""
        cfg, dev = self.cfg, self.device
        shape = (cfg.batch_size, self.learners[0].act_dim)
        idx, noise = [], []
        for g in gens:
            idx.append(torch.randint(0, st["rows"], (cfg.batch_size,), generator=g, device=dev))
            noise.append(torch.randn(shape, generator=g, device=dev))
        return {"idx": torch.stack(idx), "noise": torch.stack(noise)}

    def _update_once(self, st: dict[str, Any], draws: dict[str, torch.Tensor],
                     num_updates: int) -> torch.Tensor:
        cfg, support = self.cfg, self.support
        batch = self._batch(st, draws["idx"])
        state, next_state = self._norm(st, batch["obs"]), self._norm(st, batch["next_obs"])
        s, b = state.shape[:2]
        with torch.no_grad():
            next_mean = torch.tanh(self._mlp(st["actor"], next_state[..., : self.obs_dim]))
            noise = (draws["noise"] * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
            next_action = (next_mean + noise).clamp(-1.0, 1.0)
            next_probs = self._critic(st["critic_target"], next_state, next_action).softmax(-1)
            reward = batch["reward"]
            discount = cfg.gamma * (~batch["terminated"]).to(reward.dtype)
            # the seeds' rows side by side: the projection and the clipped double target work
            # row by row, over [E, S B, K]
            flat = next_probs.transpose(0, 1).reshape(cfg.num_critics, s * b, -1)
            projected = categorical_projection(flat, reward.reshape(-1), discount.reshape(-1),
                                               support)
            target = clipped_double_target(projected, support).reshape(s, 1, b, -1)
        logits = self._critic(st["critic"], state, batch["action"])  # [S, E, B, K]
        critic_loss = -(target * logits.log_softmax(-1)).sum(-1).mean(-1).sum(-1)  # [S]
        metrics = {"loss/critic": critic_loss.detach(),
                   "train/grad_norm/critic": self._step(st, "critic", critic_loss.sum())}
        if self._actor_step(num_updates):
            action = torch.tanh(self._mlp(st["actor"], state[..., : self.obs_dim]))
            critic = [p.detach() for p in st["critic"]]  # the actor's backward skips them
            q = expected_value(self._critic(critic, state, action).softmax(-1), support)
            actor_loss = -q.min(1).values.mean(-1)  # [S]
            metrics.update({"loss/actor": actor_loss.detach(),
                            "train/grad_norm/actor": self._step(st, "actor", actor_loss.sum()),
                            "train/q": q.detach().mean((1, 2))})
        self._polyak(st["critic_target"], st["critic"])
        nan = torch.full_like(critic_loss, math.nan)
        return torch.stack([metrics.get(k, nan).to(nan.dtype) for k in self.METRIC_KEYS], dim=1)


class _StateView:
    """An object with an optimizer-like ``state`` mapping (for ``_scatter``)."""

    def __init__(self, state: dict[torch.Tensor, dict[str, torch.Tensor]]) -> None:
        self.state = state
