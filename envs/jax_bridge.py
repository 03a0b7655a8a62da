"""The torch <-> JAX bridge of the JAX backends (``mjx``, ``brax``): one place that imports JAX.

Importing it sets JAX's GPU allocator to allocate on demand (unless the user chose a policy),
so that JAX and torch share one device, and swaps MJX's plane-capsule collider and RK4 step
for ones that compute as MuJoCo C does (``envs/mjx_fixes.py``). Arrays cross between the
frameworks through DLPack: zero-copy, stream-ordered, no host synchronization.
"""

from __future__ import annotations

import contextlib
import io
import os
from typing import Any

if not any(k in os.environ for k in ("XLA_PYTHON_CLIENT_PREALLOCATE",
                                     "XLA_PYTHON_CLIENT_MEM_FRACTION",
                                     "XLA_PYTHON_CLIENT_ALLOCATOR")):
    # JAX would otherwise take 75% of the GPU at its first array and leave torch (learner,
    # storage) nothing; allocating on demand lets both frameworks share the device
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"

import jax  # noqa: E402 - after the allocator setting, on purpose
import jax.dlpack  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

with contextlib.redirect_stdout(io.StringIO()):  # mjx prints a line when `warp` is absent
    from mujoco import mjx

from robotrl.envs.mjx_fixes import use_c_plane_capsule_frame, use_c_rungekutta4  # noqa: E402

use_c_plane_capsule_frame()
RK4_SCHEME = use_c_rungekutta4()
"""MuJoCo C's RK4 scheme, which MJX now runs too (``envs/mjx_fixes.py``)."""

GPU_LS_ITERATIONS = 8
"""Line-search iterations of the MJX solver on a GPU unless set (Playground uses 4-8)."""


# ---------------------------------------------------------------------- torch <-> JAX
def jax_device(device: torch.device) -> jax.Device:
    """The JAX device holding the same memory as torch's ``device`` (``cpu`` or ``cuda[:i]``)."""
    if device.type == "cpu":
        return jax.devices("cpu")[0]
    if device.type == "cuda":
        try:
            gpus = jax.devices("gpu")
        except RuntimeError as err:
            raise RuntimeError(
                f"device={device} but JAX sees no GPU ({err}); install a CUDA build of jax "
                "(jax[cuda12] or jax[cuda13]) matching the driver, or use device='cpu'"
            ) from None
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= len(gpus):
            raise ValueError(f"device={device} but JAX sees {len(gpus)} GPU(s)")
        return gpus[index]
    raise ValueError(f"JAX backends run on 'cpu' or 'cuda[:N]', got device={device}")


def to_torch(x: jax.Array) -> torch.Tensor:
    """Torch view of ``x`` (DLPack, zero-copy). Read it only: XLA owns and may reuse the buffer.

    Invariant both JAX backends keep: torch reads a JAX buffer only in kernels enqueued before the
    next torch -> JAX hand-off (``to_jax`` of an action or reset tensor), whose stream wait orders
    every later JAX computation (and so any reuse of that buffer) after those reads.
    """
    return torch.from_dlpack(x)


def to_jax(t: torch.Tensor) -> jax.Array:
    """JAX view of ``t`` (DLPack; zero-copy on GPU, JAX may copy on CPU to align). Never write
    ``t`` afterwards."""
    return jax.dlpack.from_dlpack(t.detach().contiguous())


def with_fields(m: Any, fields: dict[str, jax.Array]) -> Any:
    """``m`` (an ``mjx.Model``) with ``fields`` replaced; ``opt.<name>`` keys go into ``m.opt``."""
    top = {k: v for k, v in fields.items() if not k.startswith("opt.")}
    opt = {k[4:]: v for k, v in fields.items() if k.startswith("opt.")}
    m = m.replace(**top)
    return m.replace(opt=m.opt.replace(**opt)) if opt else m


__all__ = ["GPU_LS_ITERATIONS", "jax", "jax_device", "jnp", "mjx", "to_jax", "to_torch",
           "with_fields"]
