"""Seed-batched PPO: S PPO runs updated as one (``num_seeds``).

Each seed collects its rollout in its own worlds with its own normalizers, as alone (its runner
does that); ``update`` then runs PPO's epochs of minibatches on all seeds at once: each seed's
shuffle from its own generator (its buffer's ``minibatches``, drawn in lockstep), its
advantages standardized alone, the S policies evaluated as stacked products
(``GaussianActorCritic`` with separate actor and critic networks and a free log std, its
parameters as ``FlatParameters`` lays them out: one row of [S, P] per seed), the loss of
``ppo_loss`` per seed, each seed's gradient clipped by its own norm (joint, or per network), and
Adam with each seed's own learning rate (the KL-adaptive rule moves them apart), written out
as torch's fused Adam computes it. One host read per minibatch, as alone: the finiteness guard
and every seed's KL.

A seed whose loss or gradient turns non-finite is stopped: it keeps the parameters it had
before the call (the others' arithmetic never mixes with its), and a ``SeedStop`` names the
minibatch and the first non-finite metric. Equality with separate runs: float64,
``tests/algos/test_seed_batch_ppo.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from robotrl.algos.ppo import LOSS_METRIC_KEYS, LR_SCHEDULES, PPO, _network_parts, adaptive_lr
from robotrl.algos.seed_batch import SeedStop, same_learners
from robotrl.nn.linear import linear
from robotrl.nn.policy import LOG_STD_MAX, LOG_STD_MIN
from robotrl.optim import GRADIENT_HOOKS

_HALF_LOG_2PI = math.log(math.sqrt(2 * math.pi))  # as torch.distributions.Normal computes it


class SeedBatchPPO:
    """S ``PPO`` learners updated as one; see the module docstring.

    Attributes:
        learners: the S learners (``learners[i].state_dict()`` is seed i's checkpoint).
        stopped: ``{seed: SeedStop}`` of the seeds stopped for a non-finite value.
    """

    def __init__(self, learners: Sequence[Any], cuda_graphs: bool | None = None) -> None:
        cfg = same_learners(learners, PPO, "SeedBatchPPO")
        self.check_config(cfg)
        if cuda_graphs:
            raise ValueError("seed-batched PPO has no CUDA-graph path (its adaptive learning "
                             "rate reads every minibatch's KL on the host)")
        self.learners = list(learners)
        self.cfg: Any = cfg
        self.stopped: dict[int, SeedStop] = {}
        policy = learners[0].policy
        self._shapes = [p.shape for p in learners[0].flat.params]
        self._parts = _network_parts(policy) if cfg.clip_grad_per_network and \
            cfg.max_grad_norm > 0 else ()
        self._actor, self._critic = policy.actor_head, policy.critic_head
        self._floor = policy.log_std_min

    @staticmethod
    def check_config(cfg: Any) -> None:
        """Raise ValueError for a PPO config the batch does not take (``config.validate`` asks
        before anything is built)."""
        unsupported = {"shared_backbone": cfg.shared_backbone,
                       "state_dependent_std": cfg.state_dependent_std,
                       "critic_obs (an asymmetric critic)": tuple(cfg.critic_obs) != ("policy",),
                       "kl_estimator=gaussian": cfg.kl_estimator != "k3"}
        refused = [name for name, on in unsupported.items() if on]
        if refused:
            raise ValueError(f"num_seeds > 1 with PPO takes separate actor and critic networks, "
                             f"a free log std and the k3 KL; this config has {refused}: run its "
                             "seeds as separate runs (a multirun: seed=0,1,2)")

    @property
    def active(self) -> list[int]:
        """Seeds still training."""
        return [i for i in range(len(self.learners)) if i not in self.stopped]

    # ------------------------------------------------------------------ networks
    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """The parameters of S policies as views of their stacked flat rows [S, P]."""
        out, offset = [], 0
        for shape in self._shapes:
            n = math.prod(shape)
            out.append(flat[:, offset:offset + n].view(flat.shape[0], *shape))
            offset += n
        return out

    @staticmethod
    def _mlp(module: nn.Module, params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``module``'s layers (Linear and activations) on S stacked weight sets: [S, B, in].
        Each seed's product is the one its layer computes alone (``robotrl.nn.linear.linear``
        on [B, in]), not one batched product: PPO's first minibatch of an update must give
        the log-probabilities acting stored bit for bit (log ratio 0, so the KL-adaptive rule
        reads KL = 0 there, as alone), and a batched product rounds differently."""
        it = iter(params)
        for layer in module:
            if isinstance(layer, nn.Linear):
                w, b = next(it), next(it)
                x = torch.stack([linear(x[j], w[j], b[j]) for j in range(x.shape[0])])
            else:
                x = layer(x)
        return x

    def _heads(self, flat: torch.Tensor, obs: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``GaussianActorCritic.heads`` of S policies: mean [S, B, A], log std [S, A], value
        [S, B]. ``policy.parameters()`` order: log std, the actor's, the critic's."""
        views = self._views(flat)
        n_actor = len(list(self._actor.parameters()))
        log_std = views[0]
        mean = self._mlp(self._actor, views[1:1 + n_actor], obs)
        value = self._mlp(self._critic, views[1 + n_actor:], obs).squeeze(-1)
        if self._floor is None:
            return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX), value
        return mean, torch.maximum(log_std, self._floor).clamp_max(LOG_STD_MAX), value

    def _loss(self, flat: torch.Tensor, batch: dict[str, torch.Tensor]
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """``ppo_loss`` of every seed: (losses [S], metrics [S, 8] in ``LOSS_METRIC_KEYS``)."""
        cfg = self.cfg
        mean, log_std, value = self._heads(flat, batch["obs"])
        std = torch.exp(log_std)[:, None, :]  # [S, 1, A]
        diff = batch["action"] - mean
        log_prob = (-(diff**2) / (2 * std**2) - std.log() - _HALF_LOG_2PI).sum(-1)  # [S, B]
        log_ratio = log_prob - batch["log_prob"]
        ratio = torch.exp(log_ratio)
        adv = batch["advantages"]
        unclipped = ratio * adv
        clipped = torch.clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * adv
        if cfg.clipfrac_outside_range:
            moved_ratio = ratio - 1.0
            counted = (moved_ratio > cfg.clip_high) | (-moved_ratio > cfg.clip_low)
        else:
            counted = clipped < unclipped
        pg_loss = -torch.minimum(unclipped, clipped).mean(-1)
        error = value - batch["returns"]
        if cfg.value_clip > 0:
            moved = value - batch["value"]
            error_clipped = error + (moved.clamp(-cfg.value_clip, cfg.value_clip) - moved)
            v_loss = 0.5 * torch.maximum(error.square(), error_clipped.square()).mean(-1)
        else:
            v_loss = 0.5 * error.square().mean(-1)
        entropy = log_std.sum(-1) + mean.shape[-1] * (0.5 + _HALF_LOG_2PI)  # [S]
        loss = pg_loss + cfg.value_coef * v_loss - cfg.entropy_coef * entropy
        metrics = torch.stack([
            pg_loss, v_loss, -entropy, loss, (torch.expm1(log_ratio) - log_ratio).mean(-1),
            counted.to(loss.dtype).mean(-1), entropy, std.mean((1, 2))], dim=1)
        return loss, metrics.detach()

    # ------------------------------------------------------------------ learning
    def _clip(self, grad: torch.Tensor) -> torch.Tensor:
        """Each seed's gradient [S, P] clipped as ``PPO.update`` clips it; the norms before."""
        cfg = self.cfg
        norm = torch.linalg.vector_norm(grad, dim=1)  # [S]
        if self._parts:
            for part in self._parts:
                g = grad[:, part]
                n = torch.linalg.vector_norm(g, dim=1, keepdim=True)
                g.mul_((cfg.max_grad_norm / (n + 1e-6)).clamp_max(1.0))
        else:
            limit = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
            grad.mul_((limit / (norm[:, None] + 1e-6)).clamp_max(1.0))
        return norm

    def update(self, progress: float = 0.0) -> dict[int, dict[str, float]]:
        """PPO's update of every active seed on its stored rollout; each active seed's
        metrics as ``PPO.update`` returns them (seeds stopped in this call are left out and
        recorded in ``stopped``)."""
        if GRADIENT_HOOKS:
            raise RuntimeError("seed batching does not support gradient hooks (data parallel)")
        seeds = self.active
        if not seeds:
            return {}
        cfg = self.cfg
        ls = [self.learners[i] for i in seeds]
        per_minibatch = cfg.normalize_advantages and cfg.normalize_advantages_per_minibatch
        explained = torch.stack([lr._explained_variance_and_normalize(
            cfg.normalize_advantages and not per_minibatch) for lr in ls])
        lrs = [LR_SCHEDULES[cfg.lr_schedule](lr.lr, progress, cfg) for lr in ls]
        flat = torch.stack([lr.flat.flat.detach() for lr in ls]).requires_grad_(True)
        states = [lr.optimizer.state.get(lr.flat.flat) for lr in ls]
        steps = {float(s["step"]) if s else 0.0 for s in states}
        if len(steps) != 1:
            raise ValueError(f"the optimizers of a seed batch must be at the same step, got "
                             f"{sorted(steps)}")
        step = steps.pop()
        m = torch.stack([s["exp_avg"] if s else torch.zeros_like(lr.flat.flat)
                         for s, lr in zip(states, ls, strict=True)])
        v = torch.stack([s["exp_avg_sq"] if s else torch.zeros_like(lr.flat.flat)
                         for s, lr in zip(states, ls, strict=True)])
        (beta1, beta2), eps = ls[0].optimizer.param_groups[0]["betas"], cfg.adam_eps
        keys = (*LOSS_METRIC_KEYS, "train/grad_norm/policy")
        kl_index = keys.index("train/kl")
        totals = torch.zeros(len(seeds), len(keys), device=flat.device, dtype=flat.dtype)
        bad: dict[int, tuple[str, float, int]] = {}
        count, first = 0, int(step)
        for _ in range(cfg.num_epochs):
            streams = [lr.buffer.minibatches(cfg.num_minibatches, lr.generator) for lr in ls]
            for parts in zip(*streams, strict=True):
                batch = {k: torch.stack([p[k] for p in parts]) for k in parts[0]}
                if per_minibatch and batch["advantages"].shape[1] > 1:
                    adv = batch["advantages"]
                    batch["advantages"] = (adv - adv.mean(-1, keepdim=True)) / (
                        adv.std(-1, keepdim=True) + 1e-8)
                loss, metrics = self._loss(flat, batch)
                flat.grad = None
                loss.sum().backward()
                grad = flat.grad
                norm = self._clip(grad)
                row = torch.cat([metrics, norm[:, None].to(metrics)], dim=1)  # [S, K]
                finite = torch.isfinite(row).all(1)
                host = torch.cat([finite.to(row), row[:, kl_index]]).tolist()
                s = len(seeds)
                for j in range(s):
                    if not host[j] and j not in bad:
                        k = int((~torch.isfinite(row[j])).nonzero()[0])
                        bad[j] = (keys[k], float(row[j, k]), int(step) + 1)
                    if cfg.lr_schedule == "adaptive" and j not in bad:
                        lrs[j] = adaptive_lr(lrs[j], host[s + j], cfg.desired_kl)
                step += 1.0
                with torch.no_grad():  # torch's fused Adam, with a learning rate per seed
                    m.lerp_(grad, 1 - beta1)
                    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                    size = torch.tensor(lrs, dtype=flat.dtype, device=flat.device)[:, None] / (
                        1 - beta1**step)
                    denom = (v.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
                    flat.sub_(size * m / denom)
                totals += row
                count += 1
        out: dict[int, dict[str, float]] = {}
        means = torch.cat([totals / count, explained[:, None].to(totals)], dim=1).tolist()
        for j, (i, lr) in enumerate(zip(seeds, ls, strict=True)):
            lr.buffer.clear()
            if j in bad:
                metric, value, at = bad[j]  # counted in optimizer steps (minibatches)
                self.stopped[i] = SeedStop(i, at, metric, value, first)
                continue
            with torch.no_grad():
                lr.flat.flat.copy_(flat[j])
            template = states[j] or {}
            step_t = torch.tensor(step, dtype=template["step"].dtype if template
                                  else torch.float32, device=template["step"].device
                                  if template else flat.device)
            lr.optimizer.state[lr.flat.flat] = {"step": step_t, "exp_avg": m[j].clone(),
                                                "exp_avg_sq": v[j].clone()}
            lr._set_lr(lrs[j])
            metrics = dict(zip(keys, means[j][:-1], strict=True))
            metrics["train/lr"] = lrs[j]
            metrics["train/explained_variance"] = means[j][-1]
            out[i] = metrics
        return out
