"""Data-parallel training (``robotrl.distributed``) with 2 CPU processes on gloo, launched by
``torchrun`` as a user would: ranks keep identical learners, see different worlds, resume
exactly, and a 2-process run learns like a 1-process run with twice the worlds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from robotrl.checkpoint import load_checkpoint
from robotrl.distributed import Rank, rank_path

ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}


def _torchrun(nproc: int, *overrides: str, timeout: int = 180) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           "--standalone", "-m", "robotrl.cli.main", "train", "distributed=true",
           "logger.progress=false", *overrides]
    run = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stderr[-4000:]


def _tensors(tree: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a nested checkpoint entry, keyed by its path."""
    if torch.is_tensor(tree):
        return {prefix: tree}
    items = (tree.items() if isinstance(tree, dict) else
             enumerate(tree) if isinstance(tree, list | tuple) else [])
    out: dict[str, torch.Tensor] = {}
    for k, v in items:
        out.update(_tensors(v, f"{prefix}/{k}"))
    return out


def _load(path: Path) -> dict[str, Any]:
    return load_checkpoint(path)


# per-world state (PPO's running discounted return of each world, SAC's replay of its own
# worlds) and each rank's sampling generator differ between ranks by design; everything else
# of the learner must agree
PER_RANK = ("/generator", "/discounted_return")


def _per_rank(key: str) -> bool:
    return key.endswith(PER_RANK) or key.startswith("/replay/")

ALGOS = {  # (overrides, total_steps, global_step at the end)
    "ppo": (("env=inverted_pendulum", "num_envs=8", "algo.rollout_steps=32"), 2048, 2048),
    "sac": (("algo=sac", "env=inverted_pendulum", "num_envs=4", "algo.collect_steps=8",
             "algo.learning_starts=128", "algo.batch_size=64", "algo.actor_hidden=[32]",
             "algo.critic_hidden=[32]"), 512, 512),  # 128 updates per rank after warm-up
    # 2 ranks x 8 worlds x 50-step reacher episodes: 800 steps a round, 2 rounds
    "grpo": (("algo=grpo", "env=reacher", "num_envs=8", "algo.group_size=4",
              "algo.train_states=16", "algo.test_states=8", "algo.actor_hidden=[32,32]",
              "algo.num_epochs=2", "algo.num_minibatches=2"), 1200, 1600),
}


@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_ranks_keep_identical_learners_on_different_worlds(tmp_path: Path, algo: str) -> None:
    overrides, steps, counted = ALGOS[algo]
    _torchrun(2, *overrides, f"total_steps={steps}", f"run_dir={tmp_path}", "eval_episodes=2")
    main = _load(tmp_path / "checkpoints" / "last.pt")
    other = _load(rank_path(tmp_path / "checkpoints" / "last.pt", Rank(1, 2)))
    ours, theirs = _tensors(main["algo"]), _tensors(other["algo"])
    assert ours.keys() == theirs.keys()
    shared = [k for k in ours if not _per_rank(k)]
    assert len(shared) > 10
    different = [k for k in shared if not torch.equal(ours[k], theirs[k])]
    assert not different, different  # parameters, optimizer moments, normalizer statistics
    # ...trained on different worlds: the ranks' observations are not the same
    assert not torch.equal(main["obs"]["policy"], other["obs"]["policy"])
    assert main["global_step"] == other["global_step"] == counted  # counted over both ranks
    if algo == "grpo":  # the ranks drew their rounds with their own streams
        assert not torch.equal(main["group_generator"], other["group_generator"])
    assert (tmp_path / "checkpoints" / "best.pt").exists()  # rank 0 evaluated
    assert not list(tmp_path.glob("checkpoints/best.rank*"))  # the others did not


@pytest.mark.slow  # three torchrun launches (18-25 s on 2 cores, mostly start-up); the default
# run keeps exact resume in one process (tests/app/test_train.py) and the two-rank runs above
def test_two_ranks_resume_exactly(tmp_path: Path) -> None:
    args = ("env=inverted_pendulum", "num_envs=4", "algo.rollout_steps=32", "eval_episodes=2",
            "eval_interval=0")
    _torchrun(2, *args, "total_steps=1024", f"run_dir={tmp_path / 'whole'}")
    _torchrun(2, *args, "total_steps=512", f"run_dir={tmp_path / 'cut'}")
    _torchrun(2, f"resume={tmp_path / 'cut' / 'checkpoints' / 'last.pt'}", "total_steps=1024",
              f"run_dir={tmp_path / 'cut'}")
    for rank in (Rank(0, 2), Rank(1, 2)):
        whole = _load(rank_path(tmp_path / "whole" / "checkpoints" / "last.pt", rank))
        cut = _load(rank_path(tmp_path / "cut" / "checkpoints" / "last.pt", rank))
        a, b = _tensors(whole["algo"]), _tensors(cut["algo"])
        differ = [k for k in a if not torch.equal(a[k], b[k])]
        assert not differ, differ
        assert torch.equal(whole["obs"]["policy"], cut["obs"]["policy"])


def test_distributed_without_torchrun_is_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in ENV.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    run = subprocess.run([sys.executable, "-m", "robotrl.cli.main", "train", "distributed=true",
                          "env=inverted_pendulum", "num_envs=2", "total_steps=64",
                          f"run_dir={tmp_path / 'run'}"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode != 0
    assert "torchrun --nproc-per-node" in run.stderr, run.stderr[-2000:]


@pytest.mark.slow  # 6 learning runs, ~2 min
def test_two_ranks_learn_like_one_process_with_twice_the_worlds(tmp_path: Path) -> None:
    """The same total batch (2 x 8 worlds vs 1 x 16) and steps: mean final evaluation over 3
    seeds agrees within the seeds' spread (both learn: far above a random policy's ~5)."""
    import json
    import statistics

    # ~tuned: PPO's own defaults, not configs/tuned/ppo_inverted_pendulum.yaml (rl-zoo's
    # one-world recipe, which learns far less in 12k steps: 55 here): the claim is about ranks
    common = ("env=inverted_pendulum", "~tuned", "algo.rollout_steps=32", "total_steps=12288",
              "eval_episodes=8", "eval_interval=0", "algo.actor_hidden=[64,64]",
              "algo.critic_hidden=[64,64]", "backend.num_threads=1")
    returns: dict[str, list[float]] = {"two": [], "one": []}
    for seed in (0, 1, 2):
        two, one = tmp_path / f"two{seed}", tmp_path / f"one{seed}"
        _torchrun(2, *common, "num_envs=8", f"seed={seed}", f"run_dir={two}")
        run = subprocess.run([sys.executable, "-m", "robotrl.cli.main", "train", *common,
                              "num_envs=16", f"seed={seed}", f"run_dir={one}",
                              "logger.progress=false"], env=ENV, capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        for name, d in (("two", two), ("one", one)):
            returns[name].append(_load(d / "checkpoints" / "last.pt")["evaluations"][-1][
                "return_mean"])
    print(json.dumps(returns))  # shown with pytest -s -n 0
    mean2, mean1 = statistics.mean(returns["two"]), statistics.mean(returns["one"])
    spread = max(statistics.stdev(returns["two"]), statistics.stdev(returns["one"]), 50.0)
    assert min(mean1, mean2) > 100, returns
    assert abs(mean2 - mean1) <= 2 * spread, returns
