"""Dense layers whose large float32 CPU products run on oneDNN instead of torch's BLAS.

Torch sends a float32 CPU matmul to its BLAS, MKL in the official wheels. MKL takes its AVX-512
kernels only on Intel CPUs: on an AMD CPU it runs its AVX2 path. Where the CPU executes AVX-512
at full width (AMD Zen 5, CPU family 26 and later) that path is half the core's float32 peak:
105-113 GFLOP/s on one core of the AMD EPYC the product tables were first measured on, where
oneDNN (also in every x86 wheel, as ``torch.ops.mkldnn``) reached 155-250 GFLOP/s on the same
products, exact float32 arithmetic both (``benchmarks/cpu_linear.py``). Zen 4 (family 25)
splits each AVX-512 instruction into two 256-bit halves, so there MKL's AVX2 path is already
at the peak: on a Zen 4 EPYC (family 25, model 17) both reached 100-110 GFLOP/s, and oneDNN's
fixed cost per call made whole updates slower (PPO's minibatch 0.83-0.84x, SAC 0.90-0.93x,
CRL 0.98x).
``Linear`` is an ``nn.Linear`` (same parameters, same state dict) whose forward and backward
take oneDNN's products on AMD CPUs of family 26 or later with AVX-512, for layers large enough
that its fixed cost per call (~40 us with autograd) is repaid: ``ONEDNN_MIN_MACS``
multiply-accumulates per call (batch x in x out), ``ONEDNN_MIN_MACS_THREADED`` with several
torch threads; ensembles (``ensemble_linear``) only with one thread. Below that, on other CPUs,
in other dtypes, it is torch's BLAS, with one change on MKL for layers with few inputs (a
network's first layer): their weight gradient is computed in the orientation MKL is fast at
(``_skinny_input``). On GPUs, under autocast and while ``torch.export`` or ``torch.jit`` traces
(exported graphs hold the standard ``linear``), it is ``torch.nn.functional.linear``.

MKL's choice of kernels is a vendor check, ``mkl_serv_intel_cpu_true``, which torch's x86 wheels
export: ``benchmarks/mkl_intel_path.c``, preloaded (``LD_PRELOAD``), answers it with yes, and
MKL then runs its AVX-512 kernels on a Zen 5 too, rounding as on an Intel CPU. Measured on the
2-core Zen 5 EPYC, one thread (``benchmarks/cpu_linear.py``, 2026-11-28, load ~4): whole updates
with MKL's Intel kernels against oneDNN's, PPO minibatch 2.64 against 3.75 ms, SAC 378 against
466, CRL 622 against 699; so ``auto`` keeps torch's BLAS where MKL says yes (``mkl_intel_path``).

``ROBOTRL_CPU_LINEAR=onednn|blas`` forces the choice (``auto``, the default: oneDNN on AMD CPUs
of ``ONEDNN_MIN_FAMILY`` or later with AVX-512 whose MKL runs its AMD kernels, when torch has it).
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

ONEDNN_MIN_MACS = 2_000_000
"""Batch x in x out from which a layer takes oneDNN's product (measured: 512 x 64 x 64, 2.1M,
is 1.12x faster forward + backward than MKL on AMD EPYC; 512 x 17 x 128, 1.1M, 0.92x)."""
ONEDNN_MIN_MACS_THREADED = 16_000_000
"""The same with more than one torch thread (measured with two on 2 cores: PPO's 512 x 128 x 128
layers lose there, 0.92x for a whole minibatch, CRL's 256 x 256 x 256 gain, 1.19-1.33x)."""
ONEDNN_MIN_FAMILY = 26
"""The first AMD CPU family (Zen 5) whose AVX-512 runs at full width; ``auto`` picks oneDNN there
(on Zen 4, family 25, it measured no faster than MKL per product and slower per update)."""
SKINNY_MIN_ROWS = 64
"""Rows (batch) from which a layer with few inputs orients its weight gradient
(``_skinny_input``); smaller batches gain nothing, and below 4 rows MKL's forward product of
the copied weight rounds differently from F.linear's."""
COLUMN_MIN_ROWS = 128
"""Rows from which an ensemble layer with one output takes ``_EnsembleColumn`` (forward and
backward, E = 2, in 256, one Zen 4 core: 0.25 against 0.13 ms at 128 rows, 0.15 against 0.12
at 64, 0.07 against 0.11 at 16, where ``baddbmm`` is faster)."""
HEAD_MAX_OUT = 16
"""Under autocast (``precision=bf16``), layers with at most this many outputs (a network's
head: a value, an action's mean and log std, a distributional critic's atoms) keep the
parameters' dtype: the values a loss reads are accumulated and stored in float32, and such
thin products are too small to gain from bfloat16."""


PRECISIONS = ("float32", "bf16")
"""Values of the learners' ``precision`` (``OfflineConfig``, ``OffPolicyConfig``)."""


def precision_autocast(device: torch.device, precision: str) -> torch.autocast:
    """The autocast an update runs under: to bfloat16 for ``precision`` ``"bf16"``
    (``OfflineConfig.precision``, ``OffPolicyConfig.precision``), else disabled."""
    return torch.autocast(device.type, torch.bfloat16, enabled=precision == "bf16")


BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
"""``/proc/cpuinfo`` flags of CPUs with bfloat16 products in hardware (x86 AVX512-BF16, AMX;
``bf16`` on aarch64). Without one, torch's CPU bfloat16 products are emulated: on a 2-core AMD
EPYC with AVX2 only (Zen 2, family 23), a 256 x 256 x 256 product took 33 ms in bfloat16
against 3.5 ms in float32, and a TD3+BC update ran at 4 against 70 updates/s (torch 2.14.1 and
2.13.0 alike)."""


def check_precision(device: torch.device, precision: str) -> None:
    """Refuse ``precision=bf16`` on a CPU without bfloat16 products (``BF16_FLAGS``), where it
    would run several times slower than float32; a CPU whose flags cannot be read is let be."""
    if precision != "bf16" or device.type != "cpu":
        return
    fields = cpu_fields()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    if flags and not flags & set(BF16_FLAGS):
        raise ValueError(
            f"precision=bf16 needs a CPU with bfloat16 products ({' or '.join(BF16_FLAGS[:2])} "
            f"in /proc/cpuinfo's flags); this one ({fields.get('model name', 'unknown')}) has "
            f"none, so its bfloat16 products are emulated, about 10x slower than float32. "
            f"Use precision=float32 (allowed: float32, bf16), or bf16 on a GPU")


def _head_in_own_dtype(x: torch.Tensor, out_dim: int) -> bool:
    """Whether a layer with ``out_dim`` outputs is a head that autocast must leave in its
    parameters' dtype (``HEAD_MAX_OUT``)."""
    return (out_dim <= HEAD_MAX_OUT and not _tracing()
            and torch.is_autocast_enabled(x.device.type))


BACKENDS = ("auto", "onednn", "blas")
"""Values of ``ROBOTRL_CPU_LINEAR``."""


def cpu_fields() -> dict[str, str]:
    """The first CPU's block of ``/proc/cpuinfo`` (``vendor_id``, ``cpu family``, ``model``,
    ``model name``, ``flags``, ...); empty where unreadable."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if not key.strip():
            break  # the first CPU's block ends
        fields.setdefault(key.strip(), value.strip())
    return fields


def _cpu_info() -> tuple[str, int, set[str]]:
    """(vendor id, CPU family, feature flags) of the first CPU; empty (and family -1) where
    ``/proc/cpuinfo`` is unreadable."""
    fields = cpu_fields()
    family = fields.get("cpu family", "")
    return (fields.get("vendor_id", ""), int(family) if family.isdigit() else -1,
            set(fields.get("flags", "").split()))


def full_width_avx512(vendor: str, family: int, flags: set[str]) -> bool:
    """Whether ``auto`` takes oneDNN on this CPU: AMD, family ``ONEDNN_MIN_FAMILY`` or later,
    AVX-512 (see the module docstring; Intel CPUs get AVX-512 from MKL itself)."""
    return vendor == "AuthenticAMD" and family >= ONEDNN_MIN_FAMILY and "avx512f" in flags


def mkl_intel_path() -> bool:
    """Whether MKL's vendor check (``mkl_serv_intel_cpu_true``, as the process resolves it)
    answers yes: on an Intel CPU, or on an AMD one with ``benchmarks/mkl_intel_path.c``
    preloaded; False where no such symbol is loaded."""
    try:
        check = ctypes.CDLL(None).mkl_serv_intel_cpu_true
    except (OSError, AttributeError, TypeError):  # TypeError: no CDLL(None) on Windows
        return False
    check.restype = ctypes.c_int
    return bool(check())


def _onednn_works() -> bool:
    """oneDNN's linear is in this torch build and multiplies correctly."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        op = torch.ops.mkldnn._linear_pointwise
        x, w = torch.randn(3, 5), torch.randn(4, 5)
        return bool(torch.allclose(op(x, w, None, "none", [], ""), x @ w.t(), atol=1e-5))
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


@functools.cache
def onednn_enabled() -> bool:
    """Whether float32 CPU layers of ``ONEDNN_MIN_MACS`` or more take oneDNN's product here."""
    choice = os.environ.get("ROBOTRL_CPU_LINEAR", "auto").strip().lower()
    if choice not in BACKENDS:
        raise ValueError(f"ROBOTRL_CPU_LINEAR={choice!r}; allowed: {', '.join(BACKENDS)}")
    if choice == "blas":
        return False
    if choice == "auto":
        if not full_width_avx512(*_cpu_info()) or mkl_intel_path():
            return False
    return _onednn_works()


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x [B, in] @ weight [out, in]^T + bias`` in oneDNN (strided operands are fine)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    """``linear`` on 2-d float32 CPU tensors with oneDNN products forward and backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return _product(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph (TRPO's Fisher products): differentiable ops
            gx = grad @ weight if need_x else None
            gw = grad.t() @ x if need_w else None
        else:
            gx = _product(grad, weight.t(), None) if need_x else None
            gw = _product(grad.t(), x.t(), None) if need_w else None
        gb = grad.sum(0) if need_b else None  # False where bias is None
        return gx, gw, gb


def _min_macs() -> int:
    return ONEDNN_MIN_MACS if torch.get_num_threads() == 1 else ONEDNN_MIN_MACS_THREADED


def _tracing() -> bool:
    return (torch.jit.is_tracing() or torch.jit.is_scripting()
            or torch.compiler.is_compiling())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: ``x [..., in]``, ``weight [out, in]`` -> ``[..., out]``,
    on oneDNN where that is faster (see the module docstring), else torch's BLAS, with the
    weight's gradient oriented as that BLAS computes it fastest (``_skinny_input``)."""
    out_dim, in_dim = weight.shape
    # tracing first: a size test on a traced symbolic batch would become a guard on it
    if _tracing():
        return F.linear(x, weight, bias)
    if _head_in_own_dtype(x, out_dim):
        with torch.autocast(x.device.type, enabled=False):
            return F.linear(x.to(weight.dtype), weight, bias)
    if x.device.type != "cpu" or torch.is_autocast_enabled("cpu"):
        return F.linear(x, weight, bias)
    if (x.dtype == weight.dtype == torch.float32 and x.numel() * out_dim >= _min_macs()
            and onednn_enabled()):
        flat = x.reshape(-1, in_dim)
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                        or (bias is not None and bias.requires_grad)):
            out = _OneDNNLinear.apply(flat, weight, bias)
        else:
            out = _product(flat, weight, bias)
    elif (in_dim * 2 <= out_dim and x.numel() >= SKINNY_MIN_ROWS * in_dim
          and weight.requires_grad and torch.is_grad_enabled() and _mkl()):
        out = _skinny_input(x.reshape(-1, in_dim), weight, bias)
    else:  # acting and everything else: no reshape, no extra op
        return F.linear(x, weight, bias)
    return out.reshape(*x.shape[:-1], out_dim)


@functools.cache
def _mkl() -> bool:
    """Whether torch's CPU products go to MKL (x86 wheels; ARM wheels use another BLAS, for which
    the weight-gradient orientation was not measured)."""
    return torch.backends.mkl.is_available()


def _skinny_input(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                  ) -> torch.Tensor:
    """``F.linear`` of a layer with few inputs (in <= out / 2, a network's first layer), written
    so that autograd computes the weight's gradient as ``(x^T grad)^T`` rather than
    ``grad^T x``.

    MKL's product for ``grad^T x`` ([out, B] x [B, in]) is slow when its result has few
    columns: PPO's Hopper input layer (B 512, in 11, out 128) took 115 us, the transposed product
    ([in, B] x [B, out]) 28 us; 1.5-5x across the first layers of PPO, SAC and CRL, 0.2-0.9x the
    other way round, hence only for in <= out / 2 and only on MKL (``benchmarks/README.md``, "A
    first layer's weight gradient"). F.linear multiplies by the view ``weight.t()``, and autograd returns a gradient in
    its operand's layout, i.e. computes ``grad^T x``; a contiguous copy of ``weight.t()`` (in x
    out numbers, small for such layers) makes that operand row-major. The forward product is
    the same (bit for bit on MKL from 4 rows; used from ``SKINNY_MIN_ROWS``:
    ``tests/nn/test_linear.py``).
    """
    wt = weight.t().contiguous()
    return torch.addmm(bias, x, wt) if bias is not None else x @ wt


class _OneDNNEnsembleLinear(torch.autograd.Function):
    """``baddbmm(bias, x, weight)`` with one oneDNN product per member, forward and backward:
    ``x`` [E, B, in] or a shared [B, in], ``weight`` [E, in, out], ``bias`` [E, 1, out]."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        shared = x.dim() == 2
        return torch.stack([_product(x if shared else x[e], weight[e].t(), bias[e, 0])
                            for e in range(weight.shape[0])])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        members = range(weight.shape[0])
        xs = [x] * len(members) if x.dim() == 2 else list(x.unbind(0))
        gx = gw = None
        if torch.is_grad_enabled():  # create_graph: differentiable ops
            if need_x:
                gx = torch.bmm(grad, weight.transpose(1, 2))
                gx = gx.sum(0) if x.dim() == 2 else gx
            if need_w:
                gw = torch.stack([xs[e].t() @ grad[e] for e in members])
        else:
            if need_x:
                parts = [_product(grad[e], weight[e], None) for e in members]
                gx = torch.stack(parts).sum(0) if x.dim() == 2 else torch.stack(parts)
            if need_w:
                gw = torch.stack([_product(xs[e].t(), grad[e].t(), None) for e in members])
        gb = grad.sum(1, keepdim=True) if need_b else None
        return gx, gw, gb


class _EnsembleColumn(torch.autograd.Function):
    """``baddbmm(bias, x, weight)`` for one output per member (a critic's last layer), as one
    matrix-vector product per member: ``x`` [E, B, in] or a shared [B, in], ``weight``
    [E, in, 1], ``bias`` [E, 1, 1]. On CPUs a batched product with one output column runs far
    below memory speed, and so do its backward's outer product (the input's gradient) and
    column product (the weight's): measured forward and backward on one Zen 4 core, E = 2, in
    256, 0.46 against 0.15 ms at B = 256, 16.1 against 4.0 ms at B = 7,680 (CQL's sampled
    actions). The input's gradient here is a broadcast product, ``grad * weight^T``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        shared = x.dim() == 2
        return torch.stack([torch.addmv(bias[e, 0], x if shared else x[e], weight[e, :, 0])
                            for e in range(weight.shape[0])])[..., None]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        column = grad[..., 0]  # [E, B]
        gx = gw = gb = None
        if need_x:
            gx = column.t() @ weight[:, :, 0] if x.dim() == 2 else grad * weight.transpose(1, 2)
        if need_w:
            gw = torch.stack([torch.mv((x if x.dim() == 2 else x[e]).t(), column[e])
                              for e in range(weight.shape[0])])[..., None]
        if need_b:
            gb = grad.sum(1, keepdim=True)
        return gx, gw, gb


def stacked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``torch.baddbmm(bias, x, weight)``: S stacked networks' layer (``x`` [S, B, in],
    ``weight`` [S, in, out], ``bias`` broadcasting to [S, B, out]); under autocast a head (at
    most ``HEAD_MAX_OUT`` outputs) keeps the parameters' dtype, as in ``linear``."""
    if _head_in_own_dtype(x, weight.shape[-1]):
        with torch.autocast(x.device.type, enabled=False):
            return torch.baddbmm(bias, x.to(weight.dtype), weight)
    return torch.baddbmm(bias, x, weight)


def ensemble_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """E linear layers at once: ``x`` [E, B, in] or a shared [B, in], ``weight`` [E, in, out],
    ``bias`` [E, 1, out] -> [E, B, out], as ``torch.baddbmm``; on oneDNN where that is faster,
    and one matrix-vector product per member for a single output on CPUs (``_EnsembleColumn``)."""
    members, in_dim, out_dim = weight.shape
    if _head_in_own_dtype(x, out_dim):
        with torch.autocast(x.device.type, enabled=False):
            return ensemble_linear(x.to(weight.dtype), weight, bias)
    if (out_dim == 1 and x.device.type == "cpu" and x.dim() in (2, 3)
            and x.shape[-2] >= COLUMN_MIN_ROWS and not _tracing()):
        return _EnsembleColumn.apply(x, weight, bias)
    if (_tracing() or x.device.type != "cpu" or x.dtype != torch.float32
            or weight.dtype != torch.float32 or x.dim() not in (2, 3)
            or x.numel() * out_dim * (members if x.dim() == 2 else 1) < ONEDNN_MIN_MACS
            # with several threads baddbmm splits the members between them: measured with
            # two, oneDNN's per-member products took SAC's update to 0.92-0.97x
            or torch.get_num_threads() > 1 or torch.is_autocast_enabled("cpu")
            or not onednn_enabled()):
        if x.dim() == 2:  # the same input for every member
            x = x.expand(members, *x.shape)
        return torch.baddbmm(bias, x, weight)
    return _OneDNNEnsembleLinear.apply(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` computed by ``linear`` (same parameters, init and state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
