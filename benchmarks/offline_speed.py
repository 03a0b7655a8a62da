"""Offline RL update speed: robotrl's BC, TD3+BC, IQL, CQL and AWAC next to d3rlpy's, on one dataset.

Measures gradient updates per second on the CPU (``--threads`` torch threads, default 1): ours
is ``learner.update()`` with ``updates_per_iteration = --updates`` (each step samples a batch of the
attached dataset and steps every optimizer), d3rlpy is ``sample_transition_batch`` +
``algo.update`` per step (``offline_speed_d3rlpy.py``, a subprocess in its own venv). Both
sides: 256x256 MLPs for every network, batch 256, two critics, otherwise each library's
defaults; a warmup, then ``--repeats`` timed repeats (min and median). The sides alternate per
algorithm (ours, then d3rlpy) so machine noise hits both. The data is a deterministic synthetic
HalfCheetah-shaped set (obs 17, act 6, 100 episodes x 1000 steps ending in truncation) or
``--dataset REF`` (``robotrl.data.load_dataset``), written once to an .npz that both read.

Ours' process sets glibc's heap thresholds as ``robotrl train`` does (``robotrl.nn.heap``); d3rlpy
runs as installed (the target's ratio) and again with the same thresholds (its environment
variables), so the table says what the allocator setting is worth on each side.

Ours runs at each of ``--precisions`` (``OfflineConfig.precision``: float32, and bf16 under
autocast) and, with ``--compile``, float32 with the update step under ``torch.compile``
(``float32+compile``: the first call's compilation is in the warmup); the target is float32's
ratio, the others are reported beside it.

d3rlpy venv (d3rlpy 2.8.1 pins gymnasium 1.0.0, so it cannot share ours; .ci/run builds the same
one, where ``--d3rlpy-python`` looks by default):

    python3.11 -m venv .ci/venv-d3rlpy
    .ci/venv-d3rlpy/bin/pip install torch==2.13.0   # CPU wheel; elsewhere add
    #   --index-url https://download.pytorch.org/whl/cpu
    .ci/venv-d3rlpy/bin/pip install d3rlpy==2.8.1 "gymnasium[mujoco]==1.0.0"

    OMP_WAIT_POLICY=PASSIVE python benchmarks/offline_speed.py        # 300 updates (CQL 40) x 3
    OMP_WAIT_POLICY=PASSIVE python benchmarks/offline_speed.py --updates 50 --cql-updates 10 --repeats 2

Writes ``benchmarks/figures/offline_speed.json`` (``--out``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: spinning threads skew timings

import argparse  # noqa: E402
import json  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import machine_meta  # noqa: E402

from robotrl.checkpoint import atomic_open  # noqa: E402
from robotrl.data import Dataset, DatasetCard, load_dataset  # noqa: E402
from robotrl.nn.heap import MMAP_THRESHOLD, TRIM_THRESHOLD, keep_freed_memory  # noqa: E402
from robotrl.nn.linear import PRECISIONS, check_precision  # noqa: E402
from robotrl.registry import algorithm  # noqa: E402

ALGOS = ("bc", "td3bc", "iql", "cql", "awac")
"""The offline learners d3rlpy has (``robotrl.registry`` names)."""
TARGET = 2.0
"""Target: ours / d3rlpy median updates/s."""
OUT = Path(__file__).parent / "figures" / "offline_speed.json"
D3RLPY_PY = str(Path(__file__).parents[1] / ".ci" / "venv-d3rlpy" / "bin" / "python")


def synthetic(episodes: int = 100, steps: int = 1000, obs_dim: int = 17, act_dim: int = 6,
              seed: int = 0) -> Dataset:
    """HalfCheetah-shaped data: observations an AR(1) process (smooth, stationary std ~1),
    actions tanh of a fixed linear policy plus noise, reward = obs[8] - 0.1 |a|^2 (HalfCheetah's
    forward velocity minus control cost); every episode ends in truncation."""
    rng = np.random.default_rng(seed)
    obs = np.empty((episodes, steps + 1, obs_dim), np.float32)
    obs[:, 0] = rng.normal(0, 1, (episodes, obs_dim))
    for t in range(steps):
        obs[:, t + 1] = 0.95 * obs[:, t] + 0.31 * rng.normal(0, 1, (episodes, obs_dim))
    w = rng.normal(0, 0.5, (obs_dim, act_dim))
    act = np.tanh(obs[:, :-1] @ w + 0.3 * rng.normal(0, 1, (episodes, steps, act_dim)))
    rew = obs[:, :-1, 8] - 0.1 * np.square(act).sum(-1)
    trunc = np.zeros(steps, bool)
    trunc[-1] = True
    eps = [{"observations": obs[e], "actions": act[e].astype(np.float32),
            "rewards": rew[e].astype(np.float32), "terminations": np.zeros(steps, bool),
            "truncations": trunc} for e in range(episodes)]
    card = DatasetCard(task="HalfCheetah-v5", dataset_id="synthetic/halfcheetah/ar1-v0",
                       kind="synthetic", policy="tanh(linear) + noise", seed=seed)
    return Dataset.from_episodes(eps, card)


def write_npz(data: Dataset, path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The npz ``offline_speed_d3rlpy.py`` reads (actions rescaled to [-1, 1], every episode
    closed by a terminal or a timeout); returns the action bounds ours gets."""
    actions = data.actions
    low = torch.minimum(actions.min(0).values, torch.tensor(-1.0))
    high = torch.maximum(actions.max(0).values, torch.tensor(1.0))
    last = torch.zeros(len(data), dtype=torch.bool)
    last[data.episode_ends() - 1] = True
    np.savez(path, observations=data.observations.numpy(),
             actions=((actions - low) / (high - low) * 2 - 1).numpy(),
             rewards=data.rewards.numpy(), terminals=data.terminations.numpy(),
             timeouts=(data.truncations | (last & ~data.terminations)).numpy())
    return low, high


def ours(name: str, data: Dataset, low: torch.Tensor, high: torch.Tensor, updates: int,
         repeats: int, warmup: int, precision: str = "float32",
         compile: bool = False) -> dict[str, Any]:
    """robotrl's learner at the common sizes: updates/s of ``update()`` calls."""
    entry = algorithm(name)
    cls, cfg_cls = entry.learner_class(), entry.config_class()
    sizes = {"hidden": (256, 256), "batch_size": 256, "updates_per_iteration": max(warmup, 1),
             "precision": precision}
    if name != "bc":
        sizes["num_critics"] = 2
    cfg = cfg_cls(**sizes)
    alg = cls(data.obs_dim, low, high, cfg, device="cpu", seed=0)
    alg.attach(data)
    if compile:
        alg._update_once = torch.compile(alg._update_once)
    alg.update(0.0)  # warmup: allocator, Adam state, first-call costs
    alg.cfg.updates_per_iteration = updates  # read by every update() call
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        alg.update(0.0)
        runs.append(updates / (time.perf_counter() - t0))
    return {"min": min(runs), "median": statistics.median(runs), "runs": runs}


def theirs(args: argparse.Namespace, npz: Path, name: str, updates: int,
           heap: bool = False) -> dict[str, Any]:
    """One ``offline_speed_d3rlpy.py`` run for ``name``: its JSON line; ``heap``: with glibc's
    thresholds set as ours' process sets them (``robotrl.nn.heap``, through the environment
    variables glibc reads at start-up)."""
    cmd = [args.d3rlpy_python, str(Path(__file__).parent / "offline_speed_d3rlpy.py"),
           "--dataset", str(npz), "--algos", name, "--updates", str(updates), "--repeats",
           str(args.repeats), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    if heap:
        env.update(MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD),
                   MALLOC_TRIM_THRESHOLD_=str(TRIM_THRESHOLD))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(f"d3rlpy side failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--algos", default=",".join(ALGOS), help=f"comma-separated: {','.join(ALGOS)}")
    p.add_argument("--updates", type=int, default=300, help="gradient updates per timed repeat")
    for name in ALGOS:
        p.add_argument(f"--{name}-updates", type=int, default=40 if name == "cql" else None,
                       help=f"{name}'s updates per repeat (default: "
                            f"{'40, d3rlpy CQL is slow' if name == 'cql' else '--updates'})")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=50, help="untimed updates before the repeats")
    p.add_argument("--threads", type=int, default=1, help="torch threads of both sides")
    p.add_argument("--precisions", default=None,
                   help=f"ours at each, comma-separated: {','.join(PRECISIONS)} (default: every "
                        "one this CPU runs: bf16 needs bfloat16 products, check_precision)")
    p.add_argument("--compile", action="store_true",
                   help="also ours at float32 with the update under torch.compile")
    p.add_argument("--dataset", help="robotrl dataset (Minari id/dir or .hdf5); default synthetic")
    p.add_argument("--d3rlpy-python", default=D3RLPY_PY, help="python of the d3rlpy venv")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    names = [s.strip() for s in args.algos.split(",") if s.strip()]
    if unknown := set(names) - set(ALGOS):
        p.error(f"unknown algos {sorted(unknown)}; known: {', '.join(ALGOS)}")
    runnable = []
    for precision in PRECISIONS:
        try:
            check_precision(torch.device("cpu"), precision)
            runnable.append(precision)
        except ValueError as err:
            if args.precisions is None:
                print(f"not timing {precision}: {err}", file=sys.stderr)
            elif precision in args.precisions:
                p.error(str(err))
    given = args.precisions if args.precisions is not None else ",".join(runnable)
    precisions = [s.strip() for s in given.split(",") if s.strip()]
    if "float32" not in precisions or (unknown := set(precisions) - set(PRECISIONS)):
        p.error(f"precisions must include float32 (the target's) and be among "
                f"{', '.join(PRECISIONS)}; got {given!r}")
    variants = precisions + ["float32+compile"] * args.compile
    if not Path(args.d3rlpy_python).exists():
        print(f"no d3rlpy python at {args.d3rlpy_python}; set up its venv with:\n\n"
              + __doc__.split("by default):\n\n", 1)[1].split("\n\n", 1)[0], file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(args.threads)
    data = load_dataset(args.dataset) if args.dataset else synthetic()
    print(f"dataset {data.card.dataset_id or args.dataset}: {len(data)} transitions, "
          f"{data.num_episodes} episodes, obs {data.obs_dim}, act {data.act_dim}; "
          f"{args.threads} thread(s)", flush=True)
    results: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        npz = Path(tmp) / "data.npz"
        low, high = write_npz(data, npz)
        for name in names:  # alternate: ours, then d3rlpy, per algorithm
            n = getattr(args, f"{name}_updates") or args.updates
            mine = {}
            for variant in variants:
                mine[variant] = ours(name, data, low, high, n, args.repeats, args.warmup,
                                     variant.split("+")[0], variant.endswith("+compile"))
                print(f"{name}: robotrl {variant} median {mine[variant]['median']:.1f} "
                      f"updates/s", flush=True)
            out = theirs(args, npz, name, n)
            meta = {k: v for k, v in out.items() if k != "results"}
            other = out["results"][name]
            print(f"{name}: d3rlpy  median {other['median']:.1f} updates/s", flush=True)
            same_heap = theirs(args, npz, name, n, heap=True)["results"][name]
            print(f"{name}: d3rlpy, ours' heap thresholds, median {same_heap['median']:.1f} "
                  f"updates/s", flush=True)
            ratios = {k: v["median"] / other["median"] for k, v in mine.items()}
            results[name] = {"updates": n, "robotrl": mine["float32"], "d3rlpy": other,
                             "ratio": ratios["float32"], "target_met": ratios["float32"] >= TARGET,
                             "d3rlpy_same_heap": same_heap,
                             "ratio_same_heap": mine["float32"]["median"] / same_heap["median"],
                             **{f"robotrl_{k}": v for k, v in mine.items() if k != "float32"},
                             **{f"ratio_{k}": v for k, v in ratios.items() if k != "float32"}}
    extra = [k for k in variants if k != "float32"]
    print(f"\n| algo | robotrl updates/s (median, min) | d3rlpy updates/s (median, min) | "
          f"ratio of medians | target >= {TARGET:g}x met? | d3rlpy, ours' heap | ratio |"
          + "".join(f" robotrl {k} (median, min) | {k} ratio |" for k in extra)
          + "\n|---|---:|---:|---:|---|---:|---:|" + "---:|---:|" * len(extra))
    for name, r in results.items():
        a, b = r["robotrl"], r["d3rlpy"]
        print(f"| {name} | {a['median']:.1f} ({a['min']:.1f}) | {b['median']:.1f} "
              f"({b['min']:.1f}) | {r['ratio']:.2f}x | {'yes' if r['target_met'] else 'no'} |"
              f" {r['d3rlpy_same_heap']['median']:.1f} | {r['ratio_same_heap']:.2f}x |"
              + "".join(f" {r[f'robotrl_{k}']['median']:.1f} ({r[f'robotrl_{k}']['min']:.1f}) |"
                        f" {r[f'ratio_{k}']:.2f}x |" for k in extra))
    payload = {"meta": {**machine_meta(), "threads": args.threads,
                        "torch": torch.__version__, "variants": variants,
                        "heap_thresholds": keep_freed_memory(),
                        "d3rlpy": meta.get("d3rlpy_version"),
                        "d3rlpy_torch": meta.get("torch_version"),
                        "command": shlex.join(["python", *sys.argv])},
               "dataset": {"ref": args.dataset or "synthetic", "transitions": len(data),
                           "episodes": data.num_episodes, "obs_dim": data.obs_dim,
                           "act_dim": data.act_dim},
               "repeats": args.repeats, "warmup": args.warmup, "target": TARGET,
               "results": results}
    with atomic_open(args.out, "w") as f:
        json.dump(payload, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
