"""Test-wide settings."""

from __future__ import annotations

import torch

# One intra-op thread: the tests' tensors are small, and torch's worker threads only contend
# with the simulator's pool and with each other on CI's 2 cores (measured: a 64-block residual
# net export takes 8.7 s with the default threads, 0.5 s with one).
torch.set_num_threads(1)
