"""Seed-batched learners (``robotrl.algos.seed_batch``) against separate processes.

    python benchmarks/seed_batch.py                      # TD3+BC, S=5, 500 updates per seed
    python benchmarks/seed_batch.py --algo iql --seeds 5 --updates 1000 --repeats 5
    python benchmarks/seed_batch.py --algo sac           # bc, cql, rebrac, awac, crossq, fasttd3

The same work both ways: S seeds of the learner with its default sizes on a synthetic dataset
with Hopper's shapes (obs 11, act 3, 100k rows; no files; the off-policy learners' replays hold
its rows), each seed ``--updates`` gradient updates:

* ``separate``: S single-seed processes (one torch thread each), ``--parallel`` (2: the cores
  here) at a time;
* ``batched``: one process training the S seeds as one batch, with 1 and with 2 torch threads
  (``batched_2threads_active``: 2 threads with ``OMP_WAIT_POLICY=ACTIVE``, whatever the
  environment says; the other workers inherit the environment's policy).

Each configuration runs as fresh subprocesses, interleaved within a repeat so that they share
the host's load; the figure is seed-updates per second of wall clock (S x updates / wall
time from the first launch to the last exit, process start-up included), with the in-loop rate
(timed inside the workers, after 20 warm-up updates) beside it. Min and median over repeats.

On a GPU (``--device cuda``; issue 46's target: 5 seeds of TD3+BC at 1M updates in <= 9 minutes
on one H100, after JAX-CORL's ~9 minutes for one seed on a GTX 1080 Ti), one process times, after
one warm-up call of 1,000 updates: a single seed alone (``solo``), the batch of S with eager
kernels (``batched_eager``), replayed from CUDA graphs (``batched_graphs``, the default on a GPU)
and the same with TF32 matrix products (``batched_graphs_tf32``). The figure is updates per
second of the batch (every seed advances one update) and the minutes 1M updates of all S seeds
take at that rate.

    python benchmarks/seed_batch.py --device cuda --algo td3bc --seeds 5 --updates 5000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from common import (
    banner,
    check,
    machine_meta,
    print_checks,
    synthetic_dataset,
    warn_if_loaded,
    write_json,
)
from rich.console import Console

console = Console()
WARMUP = 20


ONLINE = ("sac", "crossq", "fasttd3")
"""Replay learners: their replays filled with the synthetic rows, updates owed instead of an
update count per call."""


def build(args: argparse.Namespace, seeds: list[int], device: Any = "cpu",
          cuda_graphs: bool | None = None) -> Any:
    """The learner of ``seeds[0]`` alone (one seed) or the batch of ``seeds``, on the synthetic
    data, ``WARMUP`` updates owed."""
    import torch

    from robotrl.registry import algorithm, resolve
    from robotrl.seeding import seed_everything

    data = synthetic_dataset(args.rows, args.obs_dim, args.act_dim)
    low, high = -torch.ones(args.act_dim), torch.ones(args.act_dim)
    entry = algorithm(args.algo)
    if args.algo not in ONLINE:
        cfg = entry.config_class()(updates_per_iteration=WARMUP)
        if len(seeds) == 1:
            seed_everything(seeds[0])
            learner: Any = entry.learner_class()(args.obs_dim, low, high, cfg, device,
                                                 seed=seeds[0])
        else:
            learner = resolve(entry.seed_batch).create(args.obs_dim, low, high, cfg, seeds,
                                                       device, cuda_graphs=cuda_graphs)
        learner.attach(data)
        return learner
    cfg = entry.config_class()()
    learners = []
    for seed in seeds:
        seed_everything(seed)
        one = entry.learner_class()(args.obs_dim, low, high, 1, cfg, device, seed=seed)
        n = len(data)
        one.buffer.add(data.observations, data.actions.clamp(-0.99, 0.99), data.rewards,
                       data.next_observations, data.terminations, data.truncations)
        one.transitions = n
        learners.append(one)
    learner = learners[0] if len(seeds) == 1 else resolve(entry.seed_batch)(learners,
                                                                           cuda_graphs)
    owe(learner, WARMUP)
    return learner


def owe(learner: Any, updates: int) -> None:
    """Make the next ``update`` call run ``updates`` updates of every seed."""
    for one in getattr(learner, "learners", [learner]):
        if hasattr(one, "owed_updates"):
            one.owed_updates = float(updates)
        else:
            one.cfg.updates_per_iteration = updates


def worker(args: argparse.Namespace) -> None:
    """One measured process: a single seed (``--seed``) or the batch of ``--seeds``."""
    import torch

    torch.set_num_threads(args.threads)
    seeds = [args.seed] if args.worker == "solo" else list(range(args.seeds))
    learner = build(args, seeds)
    learner.update()
    owe(learner, args.updates)
    t0 = time.perf_counter()
    learner.update()
    print(json.dumps({"loop_s": time.perf_counter() - t0}))


def gpu(args: argparse.Namespace) -> dict[str, Any]:
    """In-process timings on a CUDA device (see the module docstring)."""
    import torch

    dev = torch.device(args.device)

    def build_kind(kind: str) -> Any:
        seeds = [0] if kind == "solo" else list(range(args.seeds))
        learner = build(args, seeds, dev,
                        cuda_graphs=kind != "batched_eager" and dev.type == "cuda")
        owe(learner, 1000)
        return learner

    def sync() -> None:  # (--device cpu:0 runs the same timings on the CPU, graphs off)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    runs: dict[str, list[float]] = {}
    kinds = ("solo", "batched_eager", "batched_graphs", "batched_graphs_tf32")
    for r in range(args.repeats):
        for kind in kinds:
            torch.backends.cuda.matmul.allow_tf32 = kind.endswith("tf32")
            learner = build_kind(kind)
            learner.update()  # warm-up: allocations, cuBLAS handles, the first graph records
            owe(learner, args.updates)
            sync()
            t0 = time.perf_counter()
            learner.update()
            sync()
            rate = args.updates / (time.perf_counter() - t0)
            runs.setdefault(kind, []).append(rate)
            console.print(f"repeat {r}: {kind:22s} {rate:8.1f} updates/s")
            del learner
    torch.backends.cuda.matmul.allow_tf32 = False
    summary = {}
    for kind, rates in runs.items():
        seeds = 1 if kind == "solo" else args.seeds
        med = statistics.median(rates)
        summary[kind] = {"seeds": seeds, "min": min(rates), "median": med, "max": max(rates),
                         "seed_updates_per_s": seeds * med,
                         "minutes_1m_updates_all_seeds": 1e6 / med / 60 * (args.seeds / seeds)}
        console.print(f"{kind:22s} median {med:8.1f} updates/s ({seeds} seed(s)): 1M updates of "
                      f"{args.seeds} seeds in {summary[kind]['minutes_1m_updates_all_seeds']:.1f}"
                      " min")
    best = min((k for k in summary if k != "solo"),
               key=lambda k: summary[k]["minutes_1m_updates_all_seeds"])
    minutes = summary[best]["minutes_1m_updates_all_seeds"]
    checks = [check(f"{args.seeds} seeds x 1M updates <= 9 min ({best})", round(minutes, 2),
                    minutes <= 9.0)]
    print_checks(console, checks, lambda c: f": {c['value']} min")
    return {"meta": {**machine_meta(), "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "",
                     "torch": torch.__version__},
            "args": {k: v for k, v in vars(args).items()
                     if k not in ("worker", "seed", "threads")},
            "runs": runs, "summary": summary, "checks": checks}


def launch(args: argparse.Namespace, extra: list[str], threads: int,
           wait_policy: str | None = None) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "--algo", args.algo, "--updates", str(args.updates),
           "--rows", str(args.rows),
           "--threads", str(threads), *extra]
    env = dict(os.environ)
    if wait_policy is not None:
        env["OMP_WAIT_POLICY"] = wait_policy
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)


def finish(proc: subprocess.Popen) -> float:
    out, _ = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"worker {proc.args} failed ({proc.returncode})")
    return float(json.loads(out.strip().splitlines()[-1])["loop_s"])


def separate(args: argparse.Namespace) -> dict[str, float]:
    """S single-seed processes, ``args.parallel`` at a time."""
    t0 = time.perf_counter()
    pending = list(range(args.seeds))
    running: list[subprocess.Popen] = []
    loops: list[float] = []
    while pending or running:
        while pending and len(running) < args.parallel:
            running.append(launch(args, ["--worker", "solo", "--seed", str(pending.pop(0))], 1))
        done = next((p for p in running if p.poll() is not None), None)
        if done is None:
            time.sleep(0.01)
            continue
        running.remove(done)
        loops.append(finish(done))
    wall = time.perf_counter() - t0
    work = args.seeds * args.updates
    # in-loop: the seeds' loops spread over the parallel slots
    return {"wall_s": wall, "seed_updates_per_s": work / wall,
            "loop_seed_updates_per_s": work / (sum(loops) / args.parallel)}


def batched(args: argparse.Namespace, threads: int,
            wait_policy: str | None = None) -> dict[str, float]:
    t0 = time.perf_counter()
    loop = finish(launch(args, ["--worker", "batch", "--seeds", str(args.seeds)], threads,
                         wait_policy))
    wall = time.perf_counter() - t0
    work = args.seeds * args.updates
    return {"wall_s": wall, "seed_updates_per_s": work / wall,
            "loop_seed_updates_per_s": work / loop}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", choices=("td3bc", "iql", "bc", "cql", "rebrac", "awac", *ONLINE),
                   default="td3bc")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--updates", type=int, default=500, help="gradient updates per seed")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--parallel", type=int, default=2, help="separate processes at a time")
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--obs-dim", type=int, default=11)
    p.add_argument("--act-dim", type=int, default=3)
    p.add_argument("--device", default="cpu", help="cuda: in-process GPU timings (docstring)")
    p.add_argument("--out", default="", help="default: benchmarks/figures/seed_batch[_iql]"
                                             "[_cuda].json")
    p.add_argument("--worker", choices=("solo", "batch"), help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    suffix = ("" if args.algo == "td3bc" else f"_{args.algo}") + (
        "" if args.device == "cpu" else "_cuda")
    args.out = args.out or f"benchmarks/figures/seed_batch{suffix}.json"
    if args.device != "cpu":
        console.print(banner(f"seed-batched {args.algo} on {args.device}",
                             f"S={args.seeds}, {args.updates} timed updates, {args.rows} rows"))
        write_json(args.out, gpu(args), console)
        return
    console.print(banner(f"seed-batched {args.algo} vs separate processes",
                         f"S={args.seeds}, {args.updates} updates per seed, 256x256, batch 256",
                         f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}"))
    load_before = warn_if_loaded(console)
    configs = {"separate": lambda: separate(args), "batched_1thread": lambda: batched(args, 1),
               "batched_2threads": lambda: batched(args, 2),
               "batched_2threads_active": lambda: batched(args, 2, "ACTIVE")}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
    for r in range(args.repeats):
        for name, run in configs.items():
            result = run()
            runs[name].append(result)
            console.print(f"repeat {r}: {name:24s} {result['seed_updates_per_s']:7.1f} "
                          f"seed-updates/s (wall {result['wall_s']:.1f} s; in-loop "
                          f"{result['loop_seed_updates_per_s']:.1f})")
    summary: dict[str, dict[str, float]] = {}
    for name, results in runs.items():
        rates = [x["seed_updates_per_s"] for x in results]
        loops = [x["loop_seed_updates_per_s"] for x in results]
        summary[name] = {"min": min(rates), "median": statistics.median(rates),
                         "max": max(rates), "loop_median": statistics.median(loops)}
    base = summary["separate"]["median"]
    loop_base = summary["separate"]["loop_median"]
    contestants = [name for name in summary if name != "separate"]
    best = max(contestants, key=lambda n: summary[n]["median"])
    ratio = summary[best]["median"] / base
    loop_best = max(contestants, key=lambda n: summary[n]["loop_median"])
    loop_ratio = summary[loop_best]["loop_median"] / loop_base
    for name, s in summary.items():
        console.print(f"{name:24s} median {s['median']:7.1f} seed-updates/s (min {s['min']:.1f});"
                      f" x{s['median'] / base:.2f} of separate | in-loop median "
                      f"{s['loop_median']:.1f}, x{s['loop_median'] / loop_base:.2f}")
    # wall clock counts each process's start-up (imports, dataset): S of them against one, so
    # the wall ratio grows as --updates shrinks; the in-loop ratio is the training itself
    checks = [check(f"wall clock: batched ({best}) >= 1.5x separate processes",
                    round(ratio, 3), ratio >= 1.5),
              check(f"in-loop: batched ({loop_best}) >= 1.5x separate processes",
                    round(loop_ratio, 3), loop_ratio >= 1.5)]
    print_checks(console, checks, lambda c: f": x{c['value']}")
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    write_json(args.out, {"meta": {**machine_meta(), "load_before": load_before,
                                   "load_after": load_after,
                                   "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")},
                          "args": {k: v for k, v in vars(args).items()
                                   if k not in ("worker", "seed", "threads")},
                          "runs": runs, "summary": summary, "ratio": ratio,
                          "loop_ratio": loop_ratio, "checks": checks},
               console)


if __name__ == "__main__":
    main()
