"""d3rlpy side of the offline-RL update-speed benchmark (standalone; never imports robotrl).

Runs in its own virtual environment, because d3rlpy 2.8.1 pins gymnasium==1.0.0:

    python3.11 -m venv .ci/venv-d3rlpy
    .ci/venv-d3rlpy/bin/pip install torch==2.13.0   # CPU wheel (2.13.0+cpu) from the local index;
    #   elsewhere: pip install torch --index-url https://download.pytorch.org/whl/cpu
    .ci/venv-d3rlpy/bin/pip install d3rlpy==2.8.1 "gymnasium[mujoco]==1.0.0"

Called by benchmarks/offline_speed.py, which writes one .npz (observations [T,obs_dim] f32, actions
[T,act_dim] f32 in [-1,1], rewards [T], terminals [T] bool, timeouts [T] bool) and hands the same
file to both sides:

    OMP_WAIT_POLICY=PASSIVE .ci/venv-d3rlpy/bin/python benchmarks/offline_speed_d3rlpy.py \
        --dataset data.npz --algos td3bc,iql,cql --updates 500 --repeats 3 --warmup 50 --threads 1

Each timed step is exactly what ``QLearningAlgoBase.fitter`` does per step, minus logging and
evaluation: ``batch = dataset.sample_transition_batch(batch_size)`` then ``algo.update(batch)``.
Configs are d3rlpy defaults (paper hyperparameters) with 256x256 MLPs, batch 256, two critics,
CPU, no observation/action/reward scalers. d3rlpy keeps only complete episodes (ending in a
terminal or timeout), and never samples the last step of a timed-out episode (no next obs).
OMP_WAIT_POLICY=PASSIVE is set before torch is imported (spinning OpenMP threads distort
timings on shared CPUs). The last stdout line is one JSON object; d3rlpy logs go to stderr.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import d3rlpy  # noqa: E402
import numpy as np  # noqa: E402
import structlog  # noqa: E402
import torch  # noqa: E402
from d3rlpy.models.encoders import VectorEncoderFactory  # noqa: E402

structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))


def make_algo(name: str, batch_size: int) -> Any:
    enc = VectorEncoderFactory(hidden_units=[256, 256])
    common: dict[str, Any] = dict(
        actor_encoder_factory=enc, critic_encoder_factory=enc, batch_size=batch_size, n_critics=2
    )
    if name == "bc":  # deterministic BC (d3rlpy's default policy_type), no critics
        del common["critic_encoder_factory"], common["n_critics"]
        cfg: Any = d3rlpy.algos.BCConfig(encoder_factory=common.pop("actor_encoder_factory"),
                                         **common)
    elif name == "td3bc":  # alpha=2.5, policy noise 0.2/clip 0.5, update_actor_interval=2
        cfg = d3rlpy.algos.TD3PlusBCConfig(**common)
    elif name == "iql":  # expectile=0.7, weight_temp=3.0, max_weight=100
        cfg = d3rlpy.algos.IQLConfig(value_encoder_factory=enc, **common)
    elif name == "cql":  # continuous CQL: n_action_samples=10, conservative_weight=5, Lagrange alpha
        cfg = d3rlpy.algos.CQLConfig(**common)
    elif name == "awac":  # lam=1, n_action_samples=1 (batch 256 here, d3rlpy's default 1024)
        cfg = d3rlpy.algos.AWACConfig(**common)
    else:
        raise ValueError(f"unknown algo {name!r} (expected bc, td3bc, iql, cql, awac)")
    return cfg.create(device="cpu:0")


def load_dataset(path: str) -> d3rlpy.dataset.ReplayBuffer:
    d = np.load(path)
    return d3rlpy.dataset.MDPDataset(
        observations=d["observations"].astype(np.float32),
        actions=d["actions"].astype(np.float32),
        rewards=d["rewards"].astype(np.float32).reshape(-1, 1),
        terminals=d["terminals"].astype(np.float32),
        timeouts=d["timeouts"].astype(np.float32),
        action_space=d3rlpy.ActionSpace.CONTINUOUS,
    )


def bench(name: str, dataset: Any, updates: int, repeats: int, warmup: int) -> dict[str, Any]:
    algo = make_algo(name, batch_size=256)
    algo.build_with_dataset(dataset)  # what fitter() does before its loop (no scalers to fit)
    bs = algo.config.batch_size

    def steps(n: int) -> None:
        for _ in range(n):
            algo.update(dataset.sample_transition_batch(bs))

    steps(warmup)
    runs: list[float] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        steps(updates)
        runs.append(updates / (time.perf_counter() - t0))
    return {"min": min(runs), "median": statistics.median(runs), "runs": runs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", required=True, help="path to .npz")
    p.add_argument("--algos", default="bc,td3bc,iql,cql,awac")
    p.add_argument("--updates", type=int, default=500, help="gradient updates per timed repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    d3rlpy.seed(a.seed)
    dataset = load_dataset(a.dataset)
    results: dict[str, Any] = {}
    for name in [s.strip() for s in a.algos.split(",") if s.strip()]:
        results[name] = bench(name, dataset, a.updates, a.repeats, a.warmup)
        print(f"{name}: median {results[name]['median']:.1f} updates/s", file=sys.stderr)
    out = {"d3rlpy_version": d3rlpy.__version__, "torch_version": torch.__version__,
           "threads": a.threads, "results": results}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
