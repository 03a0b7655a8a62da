"""Named seed streams: derived from the run seed and a name, recorded with the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from robotrl.checkpoint import load_checkpoint
from robotrl.experiment.build import build_runner
from robotrl.seeding import SEED_BITS, STREAMS, derive_seed, seed_streams


def test_streams_are_stable_distinct_and_named() -> None:
    assert derive_seed(0, "eval-env") == derive_seed(0, "eval-env")
    seeds = [derive_seed(s, name) for s in range(50) for name in [*STREAMS, "rank-0", "rank-1"]]
    assert len(set(seeds)) == len(seeds)  # no two (seed, stream) pairs share a seed
    assert all(0 <= s < 2**SEED_BITS for s in seeds)
    # offsets related streams across runs (seed 0's eval worlds were another run's training
    # worlds); derived streams are not the root of any small seed
    assert derive_seed(0, "eval-env") not in range(100_000)
    with pytest.raises(ValueError, match="unknown seed stream 'eval'; known: eval-env"):
        derive_seed(0, "eval")
    with pytest.raises(ValueError, match="rank-<k>"):
        derive_seed(0, "rank-x")


def test_checkpoint_records_the_streams(tmp_path: Path, make_config) -> None:  # noqa: ANN001
    runner = build_runner(make_config(tmp_path, total_steps=32, seed=5))
    runner.evaluator = None
    runner.train()
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert ckpt["seeds"] == seed_streams(5)
    assert ckpt["seeds"]["run"] == 5 and ckpt["seeds"]["eval-reset"] == derive_seed(5, "eval-reset")
