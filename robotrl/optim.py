"""One optimizer step for every learner: zero-grad, backward, gradient all-reduce hook, clipping,
a named error on non-finite values, and the gradient norm as a metric.

    critic = GradientStep("SAC", "critic", critic_opt, max_grad_norm=0.0)
    grad_norm = critic(loss, where="update 41")            # [] tensor, for train/grad_norm/critic

A step whose loss or gradient is NaN/Inf raises ``NonFiniteError`` (a ``FloatingPointError``)
with one message everywhere: the algorithm, the loss, where in training, the values. The check
reads one flag on the host; a learner that batches it with another read (PPO reads its KL in the
same sync) calls ``backward``, checks with ``check`` and then ``apply``; a learner that must not
sync per step (SAC) passes ``check=False`` and raises ``NonFiniteError`` itself once per update
call, from ``nonfinite_message``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

GradientHook = Callable[[list[torch.Tensor], torch.Tensor | None], torch.Tensor | None]
"""Called with the parameters and the step's ``riders`` after backward, before clipping;
returns the riders as the step should see them (data-parallel: gradients and riders averaged
over ranks in one all-reduce)."""

GRADIENT_HOOKS: list[GradientHook] = []
"""Hooks every ``GradientStep`` runs after backward; data-parallel training registers its
all-reduce here (issue 18), so no learner needs to know about ranks."""


class NonFiniteError(FloatingPointError):
    """A loss, gradient or parameter became NaN/Inf."""


def nonfinite_message(algo: str, loss: str, where: str, values: str = "",
                      skipped: bool = True) -> str:
    """The one message of a non-finite loss or gradient: algorithm, loss, place, values, fix."""
    state = ("the optimizer step was skipped and the parameters are unchanged" if skipped
             else "the parameters may be corrupt; the last good checkpoint is kept")
    shown = f" ({values})" if values else ""
    return (f"{algo} {loss} loss or its gradient is non-finite (NaN/Inf) at {where}{shown}; "
            f"{state}. Check rewards and observations for NaN/Inf, or lower the learning rate.")


class FlatParameters:
    """``params`` re-seated as views of one contiguous leaf tensor ``flat``, for an optimizer
    that steps one tensor instead of many.

    On CPU with small networks the per-tensor work of an optimizer step and of gradient clipping
    is Python bookkeeping, not arithmetic: for PPO's 13 tensors (24.7k numbers) fused Adam takes
    61 µs and ``clip_grad_norm_`` 53 µs, on one flat tensor 27 µs and 6 µs
    (benchmarks/README.md at commit 757c2c7, "PPO against RSL-RL"). The modules keep their parameters (so
    ``state_dict``, export and ``load_state_dict``, which copies in place, are unchanged);
    ``gather_grads`` writes their gradients into ``flat.grad`` after each backward, and the
    optimizer holds ``flat`` only. Build it after the module has its final device and dtype:
    ``module.to(...)`` afterwards would give the parameters new storage, detached from ``flat``.
    """

    def __init__(self, params: Iterable[torch.Tensor]) -> None:
        self.params = list(params)
        if not self.params:
            raise ValueError("FlatParameters needs at least one parameter")
        with torch.no_grad():
            self.flat = nn.Parameter(torch.cat([p.reshape(-1) for p in self.params]))
        offset = 0
        for p in self.params:
            p.data = self.flat.data[offset:offset + p.numel()].view_as(p)
            offset += p.numel()

    def gather_grads(self) -> None:
        """``flat.grad`` = the parameters' gradients side by side (zero where one has none)."""
        self.flat.grad = torch.cat([
            p.grad.reshape(-1) if p.grad is not None else p.detach().new_zeros(p.numel())
            for p in self.params])
        for p in self.params:
            p.grad = None

    def flat_optimizer_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """An optimizer ``state_dict`` saved over the separate parameters (one group, in the
        same order, e.g. by an earlier version) as the state of one optimizer over ``flat``:
        each per-parameter tensor concatenated (zeros for a parameter never stepped), the rest
        (Adam's step count) taken from the first parameter that has state. A state already
        flat is returned as it is."""
        (group,) = state["param_groups"]
        if len(group["params"]) == 1:
            return state
        if len(group["params"]) != len(self.params):
            raise ValueError(f"the optimizer state has {len(group['params'])} parameters; "
                             f"this model has {len(self.params)}")
        per_param = [state["state"].get(i, {}) for i in group["params"]]
        template = next((s for s in per_param if s), {})  # a parameter never stepped has none
        merged: dict[str, Any] = {}
        for key, value in template.items():
            if not (torch.is_tensor(value) and value.dim() > 0):
                merged[key] = value
                continue
            merged[key] = torch.cat([
                s[key].reshape(-1) if key in s else value.new_zeros(p.numel())
                for s, p in zip(per_param, self.params, strict=True)])
        return {"state": {0: merged} if merged else {},
                "param_groups": [{**group, "params": [0]}]}


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``nn.utils.clip_grad_norm_`` (the same coefficient, max_norm / (norm + 1e-6) capped at
    1); for one tensor (``FlatParameters``) as three operations instead of its per-call
    grouping of tensors."""
    if len(params) != 1 or params[0].grad is None:
        return nn.utils.clip_grad_norm_(params, max_norm)
    grad = params[0].grad
    norm = torch.linalg.vector_norm(grad)
    grad.mul_((max_norm / (norm + 1e-6)).clamp_max(1.0))
    return norm


class GradientStep:
    """Steps ``optimizer`` on a loss; see the module docstring.

    Attributes:
        algo, name: for errors and the ``train/grad_norm/<name>`` metric.
        optimizer: the optimizer stepped.
        params: the parameters whose gradients are reduced, clipped and measured.
        max_norm: clip threshold of the global gradient norm (``inf``: report only).
    """

    def __init__(self, algo: str, name: str, optimizer: torch.optim.Optimizer,
                 params: Iterable[torch.Tensor] | None = None, max_grad_norm: float = 0.0,
                 flat: FlatParameters | None = None) -> None:
        """Args: ``params`` default to the optimizer's; ``max_grad_norm`` 0 disables clipping
        (the norm is still computed: clipping by ``inf`` multiplies by exactly 1); ``flat``:
        the optimizer steps ``flat.flat``, and each backward gathers the gradients into it."""
        if max_grad_norm < 0:
            raise ValueError(f"max_grad_norm must be >= 0 (0 disables), got {max_grad_norm}")
        self.algo, self.name, self.optimizer, self.flat = algo, name, optimizer, flat
        self.params = (list(params) if params is not None else
                       [p for group in optimizer.param_groups for p in group["params"]])
        self.max_norm = max_grad_norm if max_grad_norm > 0 else float("inf")

    @property
    def metric(self) -> str:
        """The metric key of this step's gradient norm."""
        return f"train/grad_norm/{self.name}"

    def backward(self, loss: torch.Tensor, riders: torch.Tensor | None = None) -> Any:
        """Zero-grad, backward, hooks, clip; returns the global gradient norm [] before
        clipping. ``riders`` (a 1-D tensor of values every rank must agree on, e.g. PPO's KL
        for its adaptive learning rate) travel with the gradients: averaged over ranks in the
        same all-reduce of a data-parallel run; then (grad norm, riders) is returned."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.flat is not None:
            self.flat.gather_grads()
        out = riders
        for hook in GRADIENT_HOOKS:
            out = hook(self.params, out)
        norm = clip_grad_norm(self.params, self.max_norm)
        return norm if riders is None else (norm, out)

    def fail(self, where: str, values: str = "") -> None:
        """Drop the gradients and raise the named error (the step is not applied)."""
        self.optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError(nonfinite_message(self.algo, self.name, where, values))

    def check(self, loss: torch.Tensor, grad_norm: torch.Tensor, where: str) -> None:
        """One host read: raise ``NonFiniteError`` if ``loss`` or ``grad_norm`` is not finite."""
        pair = torch.stack([loss.detach(), grad_norm]).to(torch.float32)
        if not bool(torch.isfinite(pair).all()):
            loss_value, norm_value = pair.tolist()
            self.fail(where, f"loss {loss_value:.4g}, gradient norm {norm_value:.4g}")

    def apply(self) -> None:
        """The optimizer step on the gradients of the last ``backward``."""
        self.optimizer.step()

    def __call__(self, loss: torch.Tensor, where: str = "", check: bool = True) -> torch.Tensor:
        """``backward``, ``check`` (unless ``check=False``), ``apply``; returns the gradient
        norm [] (a detached tensor: no host sync unless checked)."""
        grad_norm = self.backward(loss)
        if check:
            self.check(loss, grad_norm, where)
        self.apply()
        return grad_norm


def adam(params: Iterable[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999),
         eps: float = 1e-8, weight_decay: float = 0.0, capturable: bool = False
         ) -> torch.optim.Adam:
    """Adam with the fused kernel (one kernel for the whole step; CPU support since torch 2.4),
    foreach where fused is not available. On PPO's networks (HalfCheetah, 2 cores) the fused
    step is ~10x cheaper than foreach's, which spends its time grouping tensors and reading
    step counts on the host (benchmarks/README.md at commit 757c2c7, "PPO against RSL-RL").
    ``weight_decay`` > 0 gives AdamW (decoupled decay, Loshchilov & Hutter 2019);
    ``capturable``: a step that can be recorded in a CUDA graph (step counts on the device)."""
    params = list(params)
    kind = torch.optim.AdamW if weight_decay > 0 else torch.optim.Adam
    opts = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
    if capturable:
        opts["capturable"] = True
    try:
        return kind(params, **opts, fused=True)
    except (RuntimeError, TypeError):
        return kind(params, **opts, foreach=True)


def summarize_updates(rows: torch.Tensor, keys: Sequence[str], algo: str, loss: str,
                      first: int, last: int) -> dict[str, float]:
    """The metrics of one ``update`` call's gradient updates, read with one host sync.

    Args:
        rows: [U, K] one row of ``keys`` per update, NaN where an update skipped a metric
            (delayed actor updates); columns 0 and 1 (the main loss and its gradient norm) are
            on every row and are checked.
        algo, loss, first, last: for the error (updates ``first``..``last``).
    Returns each key's mean over the rows that have it (keys no row has are left out).

    Raises:
        NonFiniteError: a checked column is NaN/Inf (the steps were applied: learners that do
            not sync per step check here, once per call).
    """
    finite = torch.isfinite(rows[:, :2]).all()
    means = rows.nanmean(0)
    *values, ok = torch.cat([means, finite[None].to(means)]).tolist()
    if not ok:
        raise NonFiniteError(nonfinite_message(algo, loss, f"updates {first}..{last}",
                                               skipped=False))
    return {k: v for k, v in zip(keys, values, strict=True) if not math.isnan(v)}


def run_owed_updates(learner: Any, update_once: Callable[[], torch.Tensor],
                     keys: Sequence[str], algo: str) -> dict[str, float]:
    """Run the whole updates an off-policy ``learner`` has earned (``learner.owed_updates``,
    fractions carry over; ``update_once`` bumps ``learner.num_updates`` and returns one row of
    ``keys``) and summarize them (``summarize_updates``, the critic loss checked), with
    ``train/updates``. Callers return ``{}`` first when nothing is owed or the replay is short."""
    count = int(learner.owed_updates)
    learner.owed_updates -= count
    rows = torch.stack([update_once() for _ in range(count)])
    metrics = summarize_updates(rows, keys, algo, "critic", learner.num_updates - count + 1,
                                learner.num_updates)
    metrics["train/updates"] = float(learner.num_updates)
    return metrics
