"""Seed-batched offline learners: S independent runs of TD3+BC or IQL trained in one process.

A batch holds S ordinary learners (``TD3BC`` or ``IQL``), each built exactly as it would be alone
(its own seed, sampling generator, normalizer and attached dataset view). ``update`` stacks their
parameters, target networks and Adam moments along a leading seed dimension S, runs
``cfg.updates_per_iteration`` updates on the stacked tensors and writes everything back, so
between calls every learner is an ordinary learner: its ``state_dict`` is an ordinary
checkpoint, its ``export_actor`` an ordinary export, and a checkpoint loaded into it is what the
next call continues from.

One update of the batch is, for each seed, the update that seed would make alone:

* the batch indices (and TD3+BC's target-smoothing noise) come from the seed's own generator,
  in the order the learner's ``sample`` and ``_update_once`` draw them;
* the critics of all seeds are one ensemble of S x E members (``ensemble_linear``: one batched
  product per layer), the actors (and IQL's value networks) one ensemble of S members;
* the losses are the learner's per-seed losses (TD3+BC: ``ensemble_mse`` and the actor loss
  with lambda from each seed's own mean |Q|; IQL: the expectile value loss, the
  advantage-weighted actor loss, ``ensemble_mse``), summed over seeds for one backward per
  network: seeds share no parameter, so each seed's gradient is the gradient of its own loss;
* one fused Adam step over the stacked tensors at the learner's own learning rate (Adam is
  elementwise; neither learner clips gradients, so there is no norm across the stacked tensor
  to keep per seed); the gradient norms reported are per seed;
* Polyak averaging of the stacked targets (the same ``_foreach_lerp_``).

Equality with separate runs is tested in float64 (``tests/algos/test_seed_batch.py``); in
float32 the batched products may round differently from the solo ones.

On a CUDA device the updates of a call are replayed from CUDA graphs (``cuda_graphs``; on by
default there): each seed's random draws are made as above, outside the graph, and copied into
the graph's static inputs; the rest of an update (sampling rows, forward, backward, Adam with
``capturable`` step counts, Polyak) is one graph launch instead of ~100 kernel launches. A graph
is recorded per kind of update (TD3+BC: with or without the delayed actor step) after that kind
has run eagerly twice in the call (so every optimizer state exists before recording), and is
dropped at the end of the call. ``tests/algos/test_seed_batch.py`` compares graphed and eager
batches on a GPU.

Divergence: after each ``update`` call (one host read, as ``summarize_updates`` alone) a seed
whose critic loss or gradient norm (or, on actor updates, actor loss or gradient norm) is
non-finite is stopped: its learner keeps the parameters of the end of the previous call (its
last good state), a ``SeedStop`` records which seed, which update and which metric, and the
following calls train the remaining seeds only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import nn

from robotrl.algos.offline.base import OfflineLearner
from robotrl.algos.offline.iql import IQL
from robotrl.algos.offline.td3bc import TD3BC
from robotrl.nn.linear import ensemble_linear
from robotrl.nn.mlp import make_activation
from robotrl.nn.target import td_target
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


def _stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.stack([t.detach() for t in tensors]).contiguous()


class SeedBatch:
    """S learners of one class trained as one; see the module docstring. Subclasses name the
    learner class, its stacked networks and optimized ones, and write ``_update_once``.

    Attributes:
        learners: the S learners (``learners[i].state_dict()`` is seed i's checkpoint).
        stopped: ``{seed: SeedStop}`` of the seeds stopped for a non-finite value.
    """

    LEARNER: type[OfflineLearner]
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
        if not learners:
            raise ValueError("a seed batch needs at least one learner")
        for learner in learners:
            if type(learner) is not self.LEARNER:  # subclasses change the losses
                raise TypeError(f"{type(self).__name__} batches {self.LEARNER.__name__} only, "
                                f"got {type(learner).__name__}")
        cfg = learners[0].cfg
        for learner in learners[1:]:
            if learner.cfg != cfg:
                raise ValueError("every learner of a seed batch needs the same config")
        self.learners = list(learners)
        self.cfg: Any = cfg
        self.stopped: dict[int, SeedStop] = {}
        self._tables: tuple[tuple[int, ...], torch.Tensor] | None = None
        self._act: nn.Module = make_activation(cfg.activation)
        on_cuda = learners[0].device.type == "cuda"
        if cuda_graphs and not on_cuda:
            raise ValueError(f"cuda_graphs=True needs learners on a CUDA device, got "
                             f"{learners[0].device}")
        self.cuda_graphs = on_cuda if cuda_graphs is None else cuda_graphs
        """Replay the updates from CUDA graphs (default: on a CUDA device)."""

    @classmethod
    def create(cls, obs_dim: int, action_low: torch.Tensor, action_high: torch.Tensor,
               cfg: Any, seeds: Sequence[int], device: str | torch.device = "cpu",
               cuda_graphs: bool | None = None) -> SeedBatch:
        """One learner per seed, each built as ``LEARNER(..., seed=seed)`` alone (construction
        draws the initial weights from torch's global generator: seed it per learner, as a
        run does, with ``seed_everything(seed)`` before building)."""
        from robotrl.seeding import seed_everything

        learners = []
        for seed in seeds:
            seed_everything(seed)
            learners.append(cls.LEARNER(obs_dim, action_low, action_high, cfg, device, seed=seed))
        return cls(learners, cuda_graphs)

    @property
    def active(self) -> list[int]:
        """Seeds still training."""
        return [i for i in range(len(self.learners)) if i not in self.stopped]

    def attach(self, data: Any) -> None:
        """Attach ``data`` to every learner (each its own view and normalizer statistics)."""
        for learner in self.learners:
            learner.attach(data)
        self._tables = None

    # ------------------------------------------------------------------ stacking
    def _gather(self, seeds: list[int]) -> dict[str, Any]:
        ls = [self.learners[i] for i in seeds]
        st: dict[str, Any] = {}
        for net in self.NETS:
            params = [list(getattr(lr, net).parameters()) for lr in ls]
            st[net] = [_stack(group) for group in zip(*params, strict=True)]
        for net in self.OPTIMIZED:
            for p in st[net]:
                p.requires_grad_(True)
            solo = [getattr(lr, f"{net}_opt") for lr in ls]
            # the learner's lr as it is now
            opt = adam(st[net], solo[0].param_groups[0]["lr"], capturable=self.cuda_graphs)
            params = [list(getattr(lr, net).parameters()) for lr in ls]
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
        key = tuple(id(self.learners[i].data) for i in seeds)
        if self._tables is None or self._tables[0] != key:
            for lr in ls:
                if lr.data is None:
                    raise RuntimeError(f"{type(self).__name__}.update() before attach(dataset)")
            self._tables = (key, torch.stack([lr.data.table for lr in ls]))
        st["table"] = self._tables[1]
        return st

    def _scatter(self, seeds: list[int], st: dict[str, Any]) -> None:
        for j, i in enumerate(seeds):
            lr = self.learners[i]
            with torch.no_grad():
                for net in self.NETS:
                    for p, stacked in zip(getattr(lr, net).parameters(), st[net], strict=True):
                        p.copy_(stacked[j])
            for net in self.OPTIMIZED:
                opt, solo = st[f"{net}_opt"], getattr(lr, f"{net}_opt")
                for p, stacked in zip(getattr(lr, net).parameters(), st[net], strict=True):
                    s = opt.state[stacked]
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
                for p, q in zip(st[net], out[net], strict=True)})
        return out

    # ------------------------------------------------------------------ networks
    def _mlp(self, params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """S MLPs (``robotrl.nn.mlp``'s ``nn.Linear`` layers, weights [S, out, in], biases
        [S, out], stacked): [S, B, in] -> [S, B, out], no output activation."""
        n = len(params) // 2
        for k in range(n):
            w, b = params[2 * k], params[2 * k + 1]
            x = torch.baddbmm(b[:, None, :], x, w.transpose(1, 2))
            if k < n - 1:
                x = self._act(x)
        return x

    def _critic(self, params: list[torch.Tensor], obs: torch.Tensor, action: torch.Tensor,
                member: int | None = None) -> torch.Tensor:
        """S ensembles of E critics: [S, B, O], [S, B, A] -> Q [S, E, B] (all members, as one
        ensemble of S E members) or [S, B] (``member`` alone, as ``EnsembleQ.member``)."""
        x = torch.cat([obs, action], dim=-1)  # [S, B, in]
        s, e = x.shape[0], self.cfg.num_critics
        if member is not None:
            n = len(params) // 2
            for k in range(n):
                w, b = params[2 * k][:, member], params[2 * k + 1][:, member]
                x = torch.baddbmm(b, x, w)
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
        return x.reshape(s, e, -1)

    # ------------------------------------------------------------------ learning
    def _draws(self, gens: list[torch.Generator], n_rows: int,
               device: torch.device) -> dict[str, torch.Tensor]:
        """One update's random draws, each seed's from its own generator in the order its
        learner draws them: here the batch rows ``idx`` [S, B] (the learner's ``sample``)."""
        return {"idx": torch.stack([torch.randint(n_rows, (self.cfg.batch_size,), device=device,
                                                  generator=g) for g in gens])}

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
        table = st["table"]
        n_rows, dev = table.shape[1], table.device
        if not self.cuda_graphs:
            return torch.stack([self._update_once(st, self._draws(gens, n_rows, dev), start + u)
                                for u in range(n)])
        current = torch.cuda.current_stream(dev)
        side = torch.cuda.Stream(dev)
        eager: dict[Hashable, int] = {}
        graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor],
                                     torch.Tensor]] = {}
        rows = []
        for u in range(n):
            draws = self._draws(gens, n_rows, dev)
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
        st = self._gather(seeds)
        gens = [lr.generator for lr in ls]
        gen_states = [g.get_state() for g in gens]  # restored for seeds stopped in this call
        n = self.cfg.updates_per_iteration
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
                self.learners[seeds[j]].num_updates = start + n
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


class SeedBatchTD3BC(SeedBatch):
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

    def _draws(self, gens: list[torch.Generator], n_rows: int,
               device: torch.device) -> dict[str, torch.Tensor]:
        """Each seed's batch rows, then its target-smoothing noise [S, B, A] (``sample``, then
        ``_smoothed_next_action``)."""
        lr0 = self.learners[0]
        out = super()._draws(gens, n_rows, device)
        out["noise"] = torch.stack([
            torch.randn((self.cfg.batch_size, lr0.act_dim), device=device, dtype=lr0.dtype,
                        generator=g) for g in gens])
        return out

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
        rows = table[torch.arange(s, device=dev)[:, None], idx]  # [S, B, W]
        batch = lr0.data.unpack(rows)
        with torch.no_grad():
            mean = torch.tanh(self._mlp(st["actor_target"], batch["next_obs"]))
            noise = (noise * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
            next_action = (mean + noise).clamp(-1.0, 1.0)
            next_q = self._critic(st["critic_target"], batch["next_obs"], next_action)
            target = td_target(batch["reward"], batch["terminated"], next_q.min(1).values,
                               cfg.gamma)
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
            q_pi = self._critic(critic, batch["obs"], action, member=0)  # [S, B]
            lmbda = cfg.alpha / q_pi.abs().mean(-1).detach()
            bc = (action - batch["action"]).square().mean((1, 2))
            actor_loss = -lmbda * q_pi.mean(-1) + bc
            metrics.update({"loss/actor": actor_loss.detach(),
                            "train/grad_norm/actor": self._step(st, "actor", actor_loss.sum()),
                            "train/bc_mse": bc.detach(), "train/lambda": lmbda})
            if not cfg.lagged_actor_target:
                self._polyak(st["actor_target"], st["actor"])
            self._polyak(st["critic_target"], st["critic"])
        return torch.stack([metrics.get(k, nan).to(dtype) for k in self.METRIC_KEYS], dim=1)


class SeedBatchIQL(SeedBatch):
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

    def _log_prob(self, params: list[torch.Tensor], obs: torch.Tensor,
                  action: torch.Tensor) -> torch.Tensor:
        """``GaussianActor.log_prob`` of S actors (``parameters()`` order: its own log_std
        [S, A] first, then the net's): [S, B]."""
        low, high = self.cfg.log_std_range
        raw = params[0]
        log_std = (low + torch.sigmoid(raw) * (high - low) if self.cfg.sigmoid_log_std
                   else raw.clamp(low, high))[:, None, :]
        z = (action - torch.tanh(self._mlp(params[1:], obs))) / log_std.exp()
        return (-0.5 * z.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

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
        cfg, table = self.cfg, st["table"]
        s, dev = table.shape[0], table.device
        idx = draws["idx"]
        batch = self.learners[0].data.unpack(table[torch.arange(s, device=dev)[:, None], idx])
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


class _StateView:
    """An object with an optimizer-like ``state`` mapping (for ``_scatter``)."""

    def __init__(self, state: dict[torch.Tensor, dict[str, torch.Tensor]]) -> None:
        self.state = state
