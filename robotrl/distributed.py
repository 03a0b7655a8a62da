"""Data-parallel training on ``torch.distributed``, launched by ``torchrun``.

    torchrun --nproc-per-node 2 -m robotrl.cli.main train distributed=true num_envs=64 ...

Every rank builds the same learner (same seed, so the same initial parameters), runs its own
``num_envs`` worlds seeded from its own stream (rank 0: the run seed, so a one-process
distributed run equals a plain run; rank r: ``derive_seed(seed, "rank-r")``), and averages its
gradients with the others after every backward (``robotrl.optim.GRADIENT_HOOKS``: one all-reduce
of all gradients, flattened). What must agree beyond gradients is averaged where it is computed
(``mean``): observation normalizer statistics, PPO's KL for the adaptive learning rate,
TRPO's gradient, Fisher-vector products and line-search values. GRPO's ranks draw their own
rounds from the run's shared train states and take as many gradient steps as the rank with the
most minibatches (a rank whose batch is shorter adds zero gradients for the steps it lacks).
Rank 0 logs, shows progress, evaluates and writes ``last.pt``/``best.pt``; rank r writes
``last.rank<r>.pt`` (its worlds, replay and RNG), so resume restores every rank exactly. NCCL on
GPUs, gloo on CPU.

Outside a distributed run every function here is a no-op.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch
import torch.distributed as dist

from robotrl.seeding import derive_seed

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclasses.dataclass(frozen=True)
class Rank:
    """This process's place in the run."""

    rank: int = 0
    world_size: int = 1

    @property
    def main(self) -> bool:
        """Rank 0: logs, evaluates and writes the run's checkpoints."""
        return self.rank == 0

    def seed(self, run_seed: int) -> int:
        """This rank's seed: ``run_seed`` on rank 0 (a one-process run), the ``rank-r`` stream
        of it on rank r; a rank's worlds and its other streams derive from it as a run's do."""
        return run_seed if self.main else derive_seed(run_seed, f"rank-{self.rank}")


_RANK = Rank()


def current() -> Rank:
    """This process's rank (``Rank()`` outside a distributed run)."""
    return _RANK


def active() -> bool:
    return _RANK.world_size > 1


def init(device: str) -> Rank:
    """Join the process group ``torchrun`` set up (its environment variables), with NCCL for
    a CUDA ``device`` and gloo otherwise; register the gradient all-reduce. Raises ValueError
    naming the missing variables when not launched by ``torchrun``."""
    global _RANK
    missing = [v for v in TORCHRUN_VARS if v not in os.environ]
    if missing:
        raise ValueError(
            f"distributed=true needs torchrun's environment ({', '.join(missing)} unset): "
            "torchrun --nproc-per-node N -m robotrl.cli.main train distributed=true ...")
    if not dist.is_initialized():
        cuda = torch.device(device).type == "cuda"
        if cuda:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if cuda else "gloo")
    _RANK = Rank(dist.get_rank(), dist.get_world_size())
    from robotrl.optim import GRADIENT_HOOKS

    if _RANK.world_size > 1 and average_gradients not in GRADIENT_HOOKS:
        GRADIENT_HOOKS.append(average_gradients)
    return _RANK


def shutdown() -> None:
    """Leave the process group (end of a run)."""
    global _RANK
    from robotrl.optim import GRADIENT_HOOKS

    if average_gradients in GRADIENT_HOOKS:
        GRADIENT_HOOKS.remove(average_gradients)
    if dist.is_initialized():
        dist.destroy_process_group()
    _RANK = Rank()


def average_gradients(params: list[torch.Tensor],
                      riders: torch.Tensor | None = None) -> torch.Tensor | None:
    """Replace every gradient by its mean over ranks, and average ``riders`` (values the ranks
    must agree on) with them: one all-reduce of all of it flattened (a parameter without a
    gradient counts as zeros, so every rank sends the same layout). Returns the riders."""
    if not active():
        return riders
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    parts = [g.reshape(-1) for g in grads]
    if riders is not None:
        parts.append(riders.detach().reshape(-1).to(parts[0].dtype))
    flat = mean(torch.cat(parts))
    offset = 0
    for p, g in zip(params, grads, strict=True):
        n = g.numel()
        view = flat[offset:offset + n].view_as(g)
        if p.grad is None:
            p.grad = view.clone()
        else:
            p.grad.copy_(view)
        offset += n
    return None if riders is None else flat[offset:].to(riders.dtype).view_as(riders)


def mean(x: torch.Tensor) -> torch.Tensor:
    """``x`` averaged over ranks (a new tensor; ``x`` itself outside a distributed run)."""
    if not active():
        return x
    out = x.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / _RANK.world_size


def total(x: torch.Tensor) -> torch.Tensor:
    """``x`` summed over ranks (``x`` itself outside a distributed run)."""
    if not active():
        return x
    out = x.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def largest(value: int) -> int:
    """The largest of every rank's ``value`` (``value`` itself outside a distributed run)."""
    if not active():
        return int(value)
    t = torch.tensor([float(value)], device=_collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def any_rank(*flags: bool) -> tuple[bool, ...]:
    """Each flag, true on every rank if it is true on any (a stop request, a time budget):
    one all-reduce for all of them."""
    if not active():
        return tuple(bool(f) for f in flags)
    t = torch.tensor([float(f) for f in flags], device=_collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return tuple(bool(v) for v in t.tolist())


def _collective_device() -> torch.device:
    """Where small host-made tensors go for a collective (NCCL reduces only CUDA tensors)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def rank_path(path: str | Path, rank: Rank | None = None) -> Path:
    """Where rank ``rank`` keeps checkpoint ``path``: rank 0 the path itself, rank r
    ``<stem>.rank<r><suffix>`` beside it."""
    rank = rank or _RANK
    path = Path(path)
    return path if rank.main else path.with_name(f"{path.stem}.rank{rank.rank}{path.suffix}")
