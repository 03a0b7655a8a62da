"""Seeding and RNG-state capture, so a run is reproducible from its config and resumable.

Every random stream of a run is derived from the run seed and a stream name, never from a
numeric offset (an offset stream of run ``s`` is the root stream of run ``s + offset``):

    derive_seed(cfg.seed, "eval-env")      # the evaluation worlds' reset distribution
    derive_seed(cfg.seed, "rank-3")        # one stream per data-parallel rank

The training worlds and the networks use the run seed itself (the root stream).
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import torch

STREAMS: dict[str, str] = {
    "eval-env": "reset distribution of the evaluation worlds",
    "eval-reset": "reset() seed of each evaluation",
    "export-check": "worlds that record the observations an export is verified on",
    "randomization": "domain-randomization draws of a batch of worlds (from its env seed)",
    "group-train-states": "the fixed set of initial states a group runner (GRPO) trains from",
    "group-test-states": "the disjoint set of initial states it reports apart",
    "group-heldout-states": "initial states of a task's held-out compositions it reports apart",
    "group-draws": "which training initial states each round of group sampling uses",
}
"""Stream names used in robotrl and what each seeds; ``rank-<k>`` streams are per rank."""

SEED_BITS = 31
"""Derived seeds are below 2**31: valid for torch, NumPy, Gymnasium and JAX alike."""


def derive_seed(seed: int, stream: str) -> int:
    """The seed of ``stream`` in a run seeded ``seed``: the first bits of
    sha256("robotrl/<seed>/<stream>"), so streams are independent of each other and of the
    seeds of other runs (no two (seed, stream) pairs are related by an offset).

    ``stream`` is a key of ``STREAMS`` or ``rank-<k>``; anything else raises, naming them.
    """
    if stream not in STREAMS and not (stream.startswith("rank-") and stream[5:].isdigit()):
        raise ValueError(f"unknown seed stream {stream!r}; known: {', '.join(STREAMS)}, rank-<k>")
    digest = hashlib.sha256(f"robotrl/{int(seed)}/{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % 2**SEED_BITS


def seed_streams(seed: int) -> dict[str, int]:
    """Every named stream's seed for run seed ``seed`` (recorded in checkpoints and reports)."""
    return {"run": int(seed), **{name: derive_seed(seed, name) for name in STREAMS}}


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Snapshot of every global generator."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
