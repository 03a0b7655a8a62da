"""glibc's heap thresholds (``robotrl.nn.heap``): a large tensor allocated and freed every update
stops faulting its pages in again, and the user's own setting stands."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import resource, sys, torch
from robotrl.nn.heap import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "1" else False
x = torch.randn(4096, 1024)  # 16 MiB, as CQL's sampled-action activations


def update():  # six 16 MiB activations alive at once, then freed, as in a backward pass
    return sum(float((x * k).sum()) for k in [x * i for i in range(6)])


update()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    update()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(apply: bool, **env: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, "1" if apply else "0"], check=True,
                         capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", **env}).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_tensors_stop_faulting_and_the_environment_wins() -> None:
    applied, kept = faults(True)
    _, plain = faults(False)
    assert applied == "True"
    assert plain > 10 * 4096  # six tensors of 4,096 pages of 4 KiB (fewer with huge pages)
    assert kept < plain / 3, (kept, plain)  # measured: 16k against 70k
    assert faults(True, MALLOC_TRIM_THRESHOLD_="0")[0] == "False"  # the user's setting stands
