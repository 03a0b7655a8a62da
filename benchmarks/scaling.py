"""Beyond one process (issue 18): data-parallel scaling from 1 to N processes, and a seed sweep
through Hydra's joblib launcher against the same runs one after another.

    python benchmarks/scaling.py                      # PPO and SAC, 1 vs 2 processes; 4-seed sweep
    python benchmarks/scaling.py --procs 4 --device cuda --algos ppo   # 4 GPUs

Scaling (weak: every process runs the same ``--num-envs`` worlds): 1 process with all the
cores against N processes under ``torchrun`` (``distributed=true``), each with cores / N
simulator threads; env-steps/s and learner updates/s from the runs' checkpoints (steps over
training seconds); env-step efficiency = rate(N) / (N x rate(1)), update efficiency =
updates/s(N) / updates/s(1) (one synchronized update of N processes learns from N batches).
The sweep: ``robotrl train -m seed=0,1,2,3`` with ``hydra/launcher=local`` (2 parallel jobs, 1 simulator thread each)
against the basic launcher (one job after another, all cores); wall clock of each and their
ratio. Prints a table and writes ``--out`` JSON.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import banner, machine_meta, write_json
from rich.console import Console

from robotrl.checkpoint import load_checkpoint

CORES = os.cpu_count() or 1
ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
ALGOS = {  # per-process settings: a short run long enough for a steady rate
    "ppo": ["algo=ppo", "env=halfcheetah", "algo.rollout_steps=16", "total_steps={steps}"],
    "sac": ["algo=sac", "env=halfcheetah", "algo.collect_steps=8", "algo.learning_starts=2048",
            "total_steps={steps}"],
}
STEPS = {"ppo": 262_144, "sac": 12_288}


def _train(args: list[str], procs: int, run_dir: Path, timeout: int = 1800) -> float:
    """Run ``robotrl train`` (under torchrun when procs > 1); returns its wall-clock seconds."""
    base = ["-m", "robotrl.cli.main", "train", "logger.progress=false", "eval_episodes=2",
            "eval_interval=0", "checkpoint_interval=100000", f"run_dir={run_dir}", *args]
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={procs}", *base, "distributed=true"] if procs > 1
           else [sys.executable, *base])
    t0 = time.perf_counter()
    run = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{run.stderr[-3000:]}")
    return time.perf_counter() - t0


def _rates(run_dir: Path, algo: str) -> dict[str, float]:
    ckpt = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    seconds = float(ckpt["train_seconds"])
    cfg = ckpt["config"]["algo"]
    updates = (ckpt["algo"]["counters"][1] if algo != "ppo"  # PPO: epochs x minibatches
               else ckpt["iteration"] * cfg["num_epochs"] * cfg["num_minibatches"])
    return {"steps": ckpt["global_step"], "seconds": seconds,
            "env_steps_per_s": ckpt["global_step"] / seconds,
            "updates_per_s": float(updates) / seconds}


def scaling(algo: str, procs: int, num_envs: int, device: str, work: Path) -> dict:
    args = [a.format(steps=STEPS[algo]) for a in ALGOS[algo]] + [f"num_envs={num_envs}",
                                                                 f"device={device}"]
    one = work / f"{algo}_1"
    _train([*args, f"backend.num_threads={CORES}"], 1, one)
    many = work / f"{algo}_{procs}"
    _train([*args[:-2], f"total_steps={STEPS[algo] * procs}", f"num_envs={num_envs}",
            f"device={device}", f"backend.num_threads={max(1, CORES // procs)}"], procs, many)
    r1, rn = _rates(one, algo), _rates(many, algo)
    return {"algo": algo, "procs": procs, "num_envs_per_proc": num_envs, "one": r1, "many": rn,
            "env_steps_efficiency": rn["env_steps_per_s"] / (procs * r1["env_steps_per_s"]),
            # a synchronized update averages N ranks' batches: its samples/s efficiency is
            # updates/s(N) / updates/s(1)
            "updates_efficiency": rn["updates_per_s"] / r1["updates_per_s"]}


def sweep(seeds: int, work: Path) -> dict:
    common = ["-m", "robotrl.cli.main", "train", "-m", "env=hopper", "num_envs=16",
              "total_steps=98304", "logger.progress=false", "eval_episodes=2",
              f"seed={','.join(map(str, range(seeds)))}"]
    walls = {}
    for name, extra in (("sequential", [f"backend.num_threads={CORES}"]),
                        ("joblib", ["hydra/launcher=local", "backend.num_threads=1",
                                    f"hydra.launcher.n_jobs={CORES}"])):
        out = work / f"sweep_{name}"
        cmd = [sys.executable, *common, *extra, f"run_dir={out}/s${{seed}}",
               f"hydra.sweep.dir={out}/sweep"]
        t0 = time.perf_counter()
        run = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=3600)
        if run.returncode != 0:
            raise RuntimeError(f"{name} sweep failed:\n{run.stderr[-3000:]}")
        walls[name] = time.perf_counter() - t0
    return {"seeds": seeds, "wall_s": walls, "speedup": walls["sequential"] / walls["joblib"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algos", default="ppo,sac")
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--num-envs", type=int, default=32, help="worlds per process")
    p.add_argument("--device", default="cpu")
    p.add_argument("--sweep-seeds", type=int, default=4, help="0 skips the sweep")
    p.add_argument("--out", default="benchmarks/figures/scaling.json",
                   help="the JSON written (default: %(default)s)")
    a = p.parse_args()
    console = Console()
    console.print(banner("scaling: 1 vs N processes, seed sweep", f"{a.procs} processes",
                         f"{a.num_envs} worlds each", f"device {a.device}"))
    result: dict = {"meta": machine_meta(), "cores": CORES, "scaling": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for algo in a.algos.split(","):
            row = scaling(algo, a.procs, a.num_envs, a.device, work)
            result["scaling"].append(row)
            print(f"{algo}: 1 process {row['one']['env_steps_per_s']:,.0f} env-steps/s, "
                  f"{row['one']['updates_per_s']:,.1f} updates/s | {a.procs} processes "
                  f"{row['many']['env_steps_per_s']:,.0f} env-steps/s, "
                  f"{row['many']['updates_per_s']:,.1f} updates/s (each rank) | efficiency "
                  f"{row['env_steps_efficiency']:.0%} env steps, {row['updates_efficiency']:.0%} "
                  "updates", flush=True)
        if a.sweep_seeds:
            result["sweep"] = sweep(a.sweep_seeds, work)
            s = result["sweep"]
            print(f"{s['seeds']}-seed sweep: sequential {s['wall_s']['sequential']:.0f} s, "
                  f"joblib {s['wall_s']['joblib']:.0f} s: {s['speedup']:.2f}x", flush=True)
    write_json(a.out, result, console)


if __name__ == "__main__":
    main()
