"""Seed-batched TD3+BC: S independent TD3+BC runs trained in one process (issue 46, item 1).

The batch holds S ordinary ``TD3BC`` learners, each built exactly as it would be alone (its own
seed, sampling generator, normalizer and attached dataset view). ``update`` stacks their
parameters, target networks and Adam moments along a leading seed dimension S, runs
``cfg.updates_per_iteration`` updates on the stacked tensors and writes everything back, so
between calls every learner is an ordinary TD3+BC learner: its ``state_dict`` is an ordinary
checkpoint, its ``export_actor`` an ordinary export, and a checkpoint loaded into it is what the
next call continues from.

One update of the batch is, for each seed, the update that seed would make alone:

* the batch indices and the target-smoothing noise come from the seed's own generator, in the
  order ``TD3BC.sample`` and ``_update_once`` draw them (indices, then noise);
* the critics of all seeds are one ensemble of S x E members (``ensemble_linear``: one batched
  product per layer), the actors one ensemble of S members;
* the losses are the per-seed losses of ``ensemble_mse`` and ``td3bc_actor_loss`` (lambda from
  each seed's own mean |Q|), summed over seeds for one backward: seeds share no parameter, so
  each seed's gradient is the gradient of its own loss;
* one fused Adam step over the stacked tensors (Adam is elementwise; TD3+BC does not clip
  gradients, so there is no norm across the stacked tensor to keep per seed); the gradient
  norms reported are per seed;
* Polyak averaging of the stacked targets (the same ``_foreach_lerp_``).

Equality with separate runs is tested in float64 (``tests/algos/test_seed_batch.py``); in
float32 the batched products may round differently from the solo ones.

Divergence: after each ``update`` call (one host read, as ``summarize_updates`` alone) a seed
whose critic loss or gradient norm (or, on actor updates, actor loss or gradient norm) is
non-finite is stopped: its learner keeps the parameters of the end of the previous call (its
last good state), a ``SeedStop`` records which seed, which update and which metric, and the
following calls train the remaining seeds only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from robotrl.algos.offline.td3bc import TD3BC, TD3BCConfig
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


class SeedBatchTD3BC:
    """S ``TD3BC`` learners trained as one; see the module docstring.

    Attributes:
        learners: the S learners (``learners[i].state_dict()`` is seed i's checkpoint).
        stopped: ``{seed: SeedStop}`` of the seeds stopped for a non-finite value.
    """

    METRIC_KEYS = TD3BC.METRIC_KEYS
    CHECKED = ("loss/critic", "train/grad_norm/critic", "loss/actor", "train/grad_norm/actor")

    def __init__(self, learners: Sequence[TD3BC]) -> None:
        if not learners:
            raise ValueError("a seed batch needs at least one learner")
        for learner in learners:
            if type(learner) is not TD3BC:  # subclasses change the losses
                raise TypeError(f"seed batching supports TD3BC only, got {type(learner).__name__}")
        cfg = learners[0].cfg
        for learner in learners[1:]:
            if learner.cfg != cfg:
                raise ValueError("every learner of a seed batch needs the same config")
        self.learners = list(learners)
        self.cfg: TD3BCConfig = cfg
        self.stopped: dict[int, SeedStop] = {}
        self._tables: tuple[tuple[int, ...], torch.Tensor] | None = None
        self._act: nn.Module = make_activation(cfg.activation)

    @classmethod
    def create(cls, obs_dim: int, action_low: torch.Tensor, action_high: torch.Tensor,
               cfg: TD3BCConfig, seeds: Sequence[int],
               device: str | torch.device = "cpu") -> SeedBatchTD3BC:
        """One learner per seed, each built as ``TD3BC(..., seed=seed)`` alone (construction
        draws the initial weights from torch's global generator: seed it per learner, as a
        run does, with ``seed_everything(seed)`` before building)."""
        from robotrl.seeding import seed_everything

        learners = []
        for seed in seeds:
            seed_everything(seed)
            learners.append(TD3BC(obs_dim, action_low, action_high, cfg, device, seed=seed))
        return cls(learners)

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
        for net in ("actor", "critic", "actor_target", "critic_target"):
            params = [list(getattr(lr, net).parameters()) for lr in ls]
            st[net] = [_stack(group) for group in zip(*params, strict=True)]
        for net in ("actor", "critic"):
            for p in st[net]:
                p.requires_grad_(True)
            opt = adam(st[net], getattr(self.cfg, f"{net}_lr"))
            solo = [getattr(lr, f"{net}_opt") for lr in ls]
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
                    raise RuntimeError("SeedBatchTD3BC.update() before attach(dataset)")
            self._tables = (key, torch.stack([lr.data.table for lr in ls]))
        st["table"] = self._tables[1]
        return st

    def _scatter(self, seeds: list[int], st: dict[str, Any]) -> None:
        for j, i in enumerate(seeds):
            lr = self.learners[i]
            with torch.no_grad():
                for net in ("actor", "critic", "actor_target", "critic_target"):
                    for p, stacked in zip(getattr(lr, net).parameters(), st[net], strict=True):
                        p.copy_(stacked[j])
            for net in ("actor", "critic"):
                opt, solo = st[f"{net}_opt"], getattr(lr, f"{net}_opt")
                for p, stacked in zip(getattr(lr, net).parameters(), st[net], strict=True):
                    s = opt.state[stacked]
                    solo.state[p] = {"step": s["step"].clone(),
                                     "exp_avg": s["exp_avg"][j].clone(),
                                     "exp_avg_sq": s["exp_avg_sq"][j].clone()}

    # ------------------------------------------------------------------ networks
    def _actor(self, params: list[torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
        """S actors: obs [S, B, O] -> actions [S, B, A]; params as ``TanhActor``'s, stacked
        (``nn.Linear`` weights [S, out, in], biases [S, out])."""
        x = obs
        n = len(params) // 2
        for k in range(n):
            w, b = params[2 * k], params[2 * k + 1]
            x = torch.baddbmm(b[:, None, :], x, w.transpose(1, 2))
            if k < n - 1:
                x = self._act(x)
        return torch.tanh(x)

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
    def _update_once(self, st: dict[str, Any], gens: list[torch.Generator],
                     num_updates: int) -> torch.Tensor:
        """One update of every seed in ``st``; returns metrics [S, K] (NaN where skipped)."""
        cfg, table = self.cfg, st["table"]
        lr0 = self.learners[0]
        s, n_rows, dev = table.shape[0], table.shape[1], table.device
        dtype = lr0.dtype
        idx = torch.stack([torch.randint(n_rows, (cfg.batch_size,), device=dev, generator=g)
                           for g in gens])
        noise = torch.stack([torch.randn((cfg.batch_size, lr0.act_dim), device=dev, dtype=dtype,
                                         generator=g) for g in gens])
        rows = table[torch.arange(s, device=dev)[:, None], idx]  # [S, B, W]
        batch = lr0.data.unpack(rows)
        with torch.no_grad():
            mean = self._actor(st["actor_target"], batch["next_obs"])
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
        phase = 0 if cfg.actor_on_first_update else cfg.policy_freq - 1
        if num_updates % cfg.policy_freq == phase:
            if cfg.lagged_actor_target:
                self._polyak(st["actor_target"], st["actor"])
            action = self._actor(st["actor"], batch["obs"])
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

    def update(self, progress: float = 0.0) -> dict[int, dict[str, float]]:
        """``cfg.updates_per_iteration`` updates of every active seed; returns each active
        seed's metrics as ``TD3BC.update`` would (seeds stopped in this call are left out
        and recorded in ``stopped``)."""
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
        rows = torch.stack([self._update_once(st, gens, start + u) for u in range(n)])  # [U,S,K]
        checked = [self.METRIC_KEYS.index(k) for k in self.CHECKED]
        values = rows[:, :, checked]  # [U, S, C]
        # the actor columns are checked on the updates that step the actor (NaN by schedule
        # elsewhere), the critic columns on every update
        phase = 0 if self.cfg.actor_on_first_update else self.cfg.policy_freq - 1
        steps = torch.arange(start, start + n, device=rows.device)
        actor_rows = (steps % self.cfg.policy_freq == phase)[:, None]  # [U, 1]
        bad = ~torch.isfinite(values)
        bad[:, :, 2:] &= actor_rows[:, :, None]
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
            self._scatter([seeds[j] for j in good], _select(st, good))
            for j in good:
                self.learners[seeds[j]].num_updates = start + n
        return out

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Every seed's ordinary TD3+BC checkpoint, and the stops."""
        return {"seeds": [lr.state_dict() for lr in self.learners],
                "stopped": {i: dataclasses.asdict(s) for i, s in self.stopped.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for lr, s in zip(self.learners, state["seeds"], strict=True):
            lr.load_state_dict(s)
        self.stopped = {int(i): SeedStop(**s) for i, s in state["stopped"].items()}



def _select(st: dict[str, Any], keep: list[int]) -> dict[str, Any]:
    """``st`` restricted to the batch positions ``keep`` (for the scatter of the good seeds:
    positions index the leading dimension, so the positions of ``_scatter`` are remapped)."""
    if len(keep) == st["actor"][0].shape[0]:
        return st
    index = torch.tensor(keep, device=st["actor"][0].device)
    out: dict[str, Any] = {}
    for net in ("actor", "critic", "actor_target", "critic_target"):
        out[net] = [p.detach().index_select(0, index) for p in st[net]]
    for net in ("actor", "critic"):
        opt = st[f"{net}_opt"]
        fake = _StateView({q: {"step": opt.state[p]["step"],
                               "exp_avg": opt.state[p]["exp_avg"].index_select(0, index),
                               "exp_avg_sq": opt.state[p]["exp_avg_sq"].index_select(0, index)}
                           for p, q in zip(st[net], out[net], strict=True)})
        out[f"{net}_opt"] = fake
    return out


class _StateView:
    """An object with an optimizer-like ``state`` mapping (for ``_scatter``)."""

    def __init__(self, state: dict[torch.Tensor, dict[str, torch.Tensor]]) -> None:
        self.state = state
