"""Large CPU tensors from a heap that keeps freed memory (glibc's ``mallopt``).

A training step on the CPU allocates and frees the same large tensors every update (CQL's
sampled-action activations: 15.7 MB each at batch 256, 30 actions a state, 256 wide, two
critics). glibc serves blocks above its mmap threshold with fresh ``mmap`` pages and gives the
top of its heap back to the kernel once more than its trim threshold is free, so every update
faults its pages in again and the kernel zeroes them: CQL made 710k minor page faults in 10 +
28 updates against 109k with the thresholds below, and ran 1.1-1.4x the updates per second
(2-core Xeon, 2026-12-05; ``benchmarks/offline_speed.py``). ``keep_freed_memory`` raises the
mmap threshold to glibc's largest (32 MiB on 64-bit) and the trim threshold to 1 GiB, as the
``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` environment variables would; where
either variable is set, the user's choice stands. Freed memory then stays with the process
(its peak resident size is unchanged; it is not returned until exit), as a caching allocator
keeps it on a GPU.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""glibc's ``mallopt`` parameters (malloc.h)."""
MMAP_THRESHOLD = 32 << 20
"""Blocks up to this size come from the heap: glibc's largest (``DEFAULT_MMAP_THRESHOLD_MAX``
on 64-bit)."""
TRIM_THRESHOLD = 1 << 30
"""Free memory at the heap's top kept before any is given back to the kernel."""
_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Set glibc's thresholds (see the module docstring) once per process; whether they are
    set (False off Linux/glibc, or where the environment already sets them)."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if (not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ
            or "MALLOC_TRIM_THRESHOLD_" in os.environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
    return _applied
