"""Batch Renormalization (Ioffe 2017, "Batch Renormalization: Towards Reducing Minibatch
Dependence in Batch-Normalized Models"), the normalization CrossQ's critics and actor rely on.

In training mode a layer normalizes with the minibatch's statistics (biased variance) and
moves its running statistics towards them (``running += momentum (batch - running)``, with the
unbiased variance, as ``torch.nn.BatchNorm1d``); after ``warmup_steps`` training forwards it
corrects the batch statistics towards the running ones (``r``, ``d``, held within
``rmax``/``dmax`` and not differentiated), so training sees what evaluation will. In evaluation
mode it normalizes with the running statistics alone (what acting, targets and exported
controllers use).

For ensembles (``members``) the input is [E, B, H] (or one [B, H] for every member) and every
member keeps its own statistics and affine parameters; otherwise [B, H]. Statistics are
computed in float32 at least (bf16 autocast), in float64 for float64 inputs.

Two variants of the training-mode arithmetic (``RENORM_VARIANTS``): ``ioffe``, the paper's
(Algorithm 1: the biased batch variance, ``(x - mu_B) / sigma_B * r + d``), and
``sb3_contrib``, sb3-contrib's ``BatchRenorm1d`` (the unbiased batch variance, and the correction
applied as a shifted mean and a scaled variance with eps added after scaling); its reference
equivalence test (``tests/reference/test_sb3_contrib.py``) selects the latter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

RenormVariant = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
"""``(x, running_mean, running_var, eps, rmax, dmax, correct, keepdim) -> (x_hat, mean,
unbiased var)``: the normalized input (before the affine map) and the batch statistics that
update the running ones."""


def _corrections(std: torch.Tensor, mean: torch.Tensor, running_mean: torch.Tensor,
                 running_var: torch.Tensor, eps: float, rmax: float, dmax: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``r = std_B / std`` in [1/rmax, rmax], ``d = (mu_B - mu) / std`` in [-dmax, dmax]
    (running std ``sqrt(running_var + eps)``), not differentiated."""
    with torch.no_grad():
        running_std = (running_var + eps).sqrt()
        r = (std / running_std).clamp(1.0 / rmax, rmax)
        d = ((mean - running_mean) / running_std).clamp(-dmax, dmax)
    return r, d


def ioffe_renorm(x: torch.Tensor, running_mean: torch.Tensor, running_var: torch.Tensor,
                 eps: float, rmax: float, dmax: float, correct: bool, keepdim: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ioffe 2017, Algorithm 1: ``(x - mu_B) / sigma_B * r + d`` with ``sigma_B =
    sqrt(biased var + eps)`` (``r = 1, d = 0`` without ``correct``). ``x`` [..., B, H] is
    reduced over -2."""
    mean, var = x.mean(-2, keepdim=keepdim), x.var(-2, unbiased=False, keepdim=keepdim)
    std = (var + eps).sqrt()
    n = x.shape[-2]
    if not correct:
        return (x - mean) / std, mean, var * n / max(n - 1, 1)
    r, d = _corrections(std, mean, running_mean, running_var, eps, rmax, dmax)
    return (x - mean) / std * r + d, mean, var * n / max(n - 1, 1)


def sb3_contrib_renorm(x: torch.Tensor, running_mean: torch.Tensor, running_var: torch.Tensor,
                       eps: float, rmax: float, dmax: float, correct: bool, keepdim: bool
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sb3-contrib's ``BatchRenorm1d`` (2.x): the unbiased batch variance ``v``; corrected,
    ``(x - (mu_B - d sqrt(v) / r)) / sqrt(v / r^2 + eps)`` (equal to Ioffe's only for eps = 0
    and the biased variance). ``x`` [..., B, H] is reduced over -2."""
    mean, var = x.mean(-2, keepdim=keepdim), x.var(-2, keepdim=keepdim)
    custom_mean, custom_var = mean, var
    if correct:
        r, d = _corrections((var + eps).sqrt(), mean, running_mean, running_var, eps, rmax,
                            dmax)
        custom_mean, custom_var = mean - d * var.sqrt() / r, var / r**2
    return (x - custom_mean) / (custom_var + eps).sqrt(), mean, var


RENORM_VARIANTS: dict[str, RenormVariant] = {
    "ioffe": ioffe_renorm,
    "sb3_contrib": sb3_contrib_renorm,
}
"""Training-mode arithmetic of ``BatchRenorm``: name -> function (module docstring)."""


def _stat_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for low-precision inputs (bf16 autocast), else the input's dtype."""
    return torch.promote_types(x.dtype, torch.float32)


class BatchRenorm(nn.Module):
    """Batch Renormalization over the batch dimension (-2) of [B, H] or [E, B, H].

    Args:
        num_features: H.
        members: E for ensemble inputs [E, B, H] (None: [B, H]).
        momentum: rate of the running statistics: ``mean += momentum (batch_mean - mean)``.
        eps: added to variances before the square root.
        warmup_steps: training forwards that use the batch statistics alone (plain batch
            normalization) before the renormalization corrections start.
        rmax, dmax: bounds on the correction ``r = sigma_B / sigma`` (in [1/rmax, rmax]) and
            ``d = (mu_B - mu) / sigma`` (in [-dmax, dmax]).
        variant: a key of ``RENORM_VARIANTS``: the training-mode arithmetic.
    """

    def __init__(self, num_features: int, members: int | None = None, momentum: float = 0.01,
                 eps: float = 1e-3, warmup_steps: int = 100_000, rmax: float = 3.0,
                 dmax: float = 5.0, variant: str = "ioffe") -> None:
        super().__init__()
        if not 0.0 < momentum <= 1.0:
            raise ValueError(f"momentum must be in (0, 1], got {momentum}")
        if variant not in RENORM_VARIANTS:
            raise ValueError(f"unknown Batch Renormalization variant {variant!r}; known: "
                             f"{', '.join(RENORM_VARIANTS)}")
        self.variant = variant
        if eps <= 0 or rmax < 1 or dmax < 0 or warmup_steps < 0:
            raise ValueError(f"need eps > 0, rmax >= 1, dmax >= 0, warmup_steps >= 0; got eps="
                             f"{eps}, rmax={rmax}, dmax={dmax}, warmup_steps={warmup_steps}")
        shape = (num_features,) if members is None else (members, 1, num_features)
        self.num_features, self.members = num_features, members
        self.momentum, self.eps, self.warmup_steps = momentum, eps, warmup_steps
        self.rmax, self.dmax = rmax, dmax
        self.weight = nn.Parameter(torch.ones(shape))
        self.bias = nn.Parameter(torch.zeros(shape))
        self.register_buffer("running_mean", torch.zeros(shape))
        self.register_buffer("running_var", torch.ones(shape))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        """Training forwards so far (checkpointed)."""
        self._steps: int | None = None
        self.register_load_state_dict_post_hook(BatchRenorm._forget_steps)

    @staticmethod
    def _forget_steps(module: nn.Module, _: Any) -> None:
        module._steps = None  # read again from the loaded buffer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.members is not None and x.dim() == 2:  # one input for every member
            x = x.expand(self.members, *x.shape)
        if x.dim() != (2 if self.members is None else 3) or x.shape[-1] != self.num_features:
            expected = "[B, H]" if self.members is None else f"[{self.members}, B, H]"
            raise ValueError(f"BatchRenorm expects {expected} with H = {self.num_features}, got "
                             f"{tuple(x.shape)}")
        if not self.training:
            return self._affine(x, self.running_mean, (self.running_var + self.eps).sqrt())
        if self._steps is None:  # a Python mirror of the buffer: no device read per forward
            self._steps = int(self.steps)
        self._steps += 1
        self.steps += 1
        correct = self._steps > self.warmup_steps
        if not correct and self.variant == "ioffe":  # batch normalization: torch's fused kernels
            return self._batch_norm(x)
        xf = x.to(_stat_dtype(x))
        x_hat, mean, var = RENORM_VARIANTS[self.variant](
            xf, self.running_mean, self.running_var, self.eps, self.rmax, self.dmax, correct,
            self.members is not None)
        with torch.no_grad():
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var, self.momentum)
        return torch.addcmul(self.bias, x_hat, self.weight).to(x.dtype)

    def _batch_norm(self, x: torch.Tensor) -> torch.Tensor:
        """Plain batch normalization with ``F.batch_norm`` (members as extra columns)."""
        if self.members is None:
            return nn.functional.batch_norm(
                x.to(_stat_dtype(x)), self.running_mean, self.running_var, self.weight,
                self.bias, training=True, momentum=self.momentum, eps=self.eps).to(x.dtype)
        e, b, h = x.shape
        flat = x.to(_stat_dtype(x)).transpose(0, 1).reshape(b, e * h)
        y = nn.functional.batch_norm(
            flat, self.running_mean.view(-1), self.running_var.view(-1), self.weight.view(-1),
            self.bias.view(-1), training=True, momentum=self.momentum, eps=self.eps)
        return y.view(b, e, h).transpose(0, 1).to(x.dtype)

    def _affine(self, x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                i: int | None = None) -> torch.Tensor:
        """``weight (x - mean) / std + bias`` (member ``i``'s affine parameters if given)."""
        weight, bias = (self.weight, self.bias) if i is None else (self.weight[i], self.bias[i])
        return torch.addcmul(bias, (x.to(_stat_dtype(x)) - mean) / std, weight).to(x.dtype)

    def member(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """Member ``i`` alone on [B, H], evaluation mode only (running statistics)."""
        if self.training or self.members is None:
            raise RuntimeError("BatchRenorm.member normalizes one ensemble member with running "
                               "statistics: call it in eval mode on an ensemble layer")
        return self._affine(x, self.running_mean[i], (self.running_var[i] + self.eps).sqrt(),
                            i)

    def extra_repr(self) -> str:
        members = "" if self.members is None else f", members={self.members}"
        variant = "" if self.variant == "ioffe" else f", variant={self.variant}"
        return (f"{self.num_features}{members}, momentum={self.momentum}, eps={self.eps}, "
                f"warmup_steps={self.warmup_steps}{variant}")


@contextlib.contextmanager
def training(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` in training mode inside the block (its normalization layers use and update
    batch statistics), back in evaluation mode after it."""
    module.train(True)
    try:
        yield module
    finally:
        module.train(False)
