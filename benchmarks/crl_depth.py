"""CRL per network depth: what one update costs, and what depth buys in success.

    python benchmarks/crl_depth.py                         # depths 4 8 16 32 64, width 256, batch 256
    python benchmarks/crl_depth.py --depths 4 16 64 --threads 1 --checkpoint
    python benchmarks/crl_depth.py --depths 4 16 64 --threads 1 \
        --jaxgcrl-python /work/venvs/jaxgcrl/bin/python    # and JaxGCRL's update, same run
    python benchmarks/crl_depth.py --learning              # success vs depth (see below)

One CRL update (critic InfoNCE + actor + temperature) on ``reacher_goal``'s shapes, critic and
actor at the same depth (``algo.critic_depth`` = ``algo.actor_depth``, the paper's axis), from a
trajectory replay filled with random-policy steps. Reported per depth: updates/s (median of
``--repeats`` timings of ``--updates`` updates, after a warm-up), parameters of the three
networks, FLOPs per update (dense layers, forward + backward) and the memory one update needs:
parameters + Adam state (16 bytes per parameter) and the activations autograd keeps (the
``DeepResNet.cost`` estimate; ``--checkpoint`` keeps one block's). ``--jaxgcrl-python``: then
JaxGCRL's update at the same depths, width, batch and timing plan on one thread
(``crl_jaxgcrl.py``, in its own venv: the recipe is there), and the ratio. Ours includes
sampling the batch from the trajectory replay; JaxGCRL's is timed on a ready minibatch.

``--learning``: success rate against depth, the paper's finding. Per depth and seed, ``robotrl
train algo=crl env=<--task>`` with critic and actor at that depth (``--learn-width``, batch
``--batch``, one torch thread, ``--parallel`` runs at a time), evaluated every ``--eval-every``
iterations (deterministic, ``--eval-episodes`` episodes). Reported: success at equal environment
steps (the paper's axis: the last evaluation, at ``--steps``) and at equal wall clock (the
user's axis: each run's last evaluation within the training time of the fastest depth's runs),
mean over seeds; figure ``--out`` with ``.png``: success against steps and against training
seconds, one line per depth. Runs (in ``--runs``) resume when the benchmark is interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from common import banner, machine_meta, train_subprocess, write_json
from rich.console import Console
from rich.table import Table

from robotrl.algos.crl import CRL, CRLConfig
from robotrl.checkpoint import load_checkpoint
from robotrl.envs import make

console = Console()


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--depths", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--updates", type=int, default=10, help="updates per timing")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    p.add_argument("--checkpoint", action="store_true", help="activation checkpointing")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    p.add_argument("--jaxgcrl-python", default="",
                   help="python of a JaxGCRL venv (see crl_jaxgcrl.py): time its CRL update at "
                        "the same depths, width and batch in this run (needs --threads 1)")
    p.add_argument("--out", help="the JSON written (default: benchmarks/figures/crl/"
                   "crl_depth.json, with --learning crl_depth_learning.json)")
    learn = p.add_argument_group("--learning: success against depth")
    learn.add_argument("--learning", action="store_true", help="measure success per depth")
    learn.add_argument("--task", default="reacher_goal")
    learn.add_argument("--steps", type=int, default=24576, help="env steps per run")
    learn.add_argument("--learn-width", type=int, default=128, help="critic and actor width")
    learn.add_argument("--seeds", type=int, default=2)
    learn.add_argument("--parallel", type=int, default=2, help="runs at a time (1 thread each)")
    learn.add_argument("--eval-every", type=int, default=16, help="iterations between evals")
    learn.add_argument("--eval-episodes", type=int, default=64)
    learn.add_argument("--runs", default="runs/bench/crl_depth_learning", help="run directories")
    args = p.parse_args()
    name = "crl_depth_learning" if args.learning else "crl_depth"
    args.out = args.out or f"benchmarks/figures/crl/{name}.json"
    return args


def measure(depth: int, args: argparse.Namespace) -> dict[str, float]:
    env = make("reacher_goal", 64, seed=0)
    cfg = CRLConfig(critic_depth=depth, actor_depth=depth, critic_width=args.width,
                    actor_width=args.width, batch_size=args.batch, learning_starts=10**9,
                    checkpoint_activations=args.checkpoint, bf16=args.bf16)
    alg = CRL(env.spec, cfg, 64, seed=0)  # random actions throughout; updates set by hand
    obs = env.reset(seed=0)
    for _ in range(100):  # two episodes in every world
        out = env.step(alg.act(obs))
        alg.process_env_step(out.reward, out.terminated, out.truncated, out.info["final_obs"])
        obs = out.obs
    alg.owed_updates = 2.0
    alg.update()  # warm-up
    rates = []
    for _ in range(args.repeats):
        alg.owed_updates = float(args.updates)
        t0 = time.perf_counter()
        alg.update()
        rates.append(args.updates / (time.perf_counter() - t0))
    cost = alg.network_cost()
    params = sum(c["params"] for c in cost.values())
    return {"depth": depth, "updates_per_s": statistics.median(rates), "best": max(rates),
            "params": params, "gflops_per_update": sum(c["flops"] for c in cost.values()) / 1e9,
            "state_mb": params * 16 / 2**20,
            "activation_mb": sum(c["activation_bytes"] for c in cost.values()) / 2**20}


def learn_one(args: argparse.Namespace, depth: int, seed: int) -> dict[str, Any]:
    """One CRL run at ``depth``; its evaluations (step, training seconds, success)."""
    run = Path(args.runs) / f"d{depth}_s{seed}"
    _, failed = train_subprocess(
        ["algo=crl", f"env={args.task}", f"seed={seed}", f"total_steps={args.steps}",
         f"algo.critic_depth={depth}", f"algo.actor_depth={depth}",
         f"algo.critic_width={args.learn_width}", f"algo.actor_width={args.learn_width}",
         f"algo.batch_size={args.batch}", f"eval_interval={args.eval_every}",
         f"eval_episodes={args.eval_episodes}", "torch_threads=1", "logger.progress=false"],
        run, f"depth {depth} seed {seed}")
    if failed:
        raise RuntimeError(f"CRL depth {depth} seed {seed} failed")
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    curve = [{"step": e["step"], "seconds": e["seconds"], "success": e["success"]}
             for e in ckpt["evaluations"]]
    console.print(f"depth {depth:>3} seed {seed}: success {curve[-1]['success']:.2f} at "
                  f"{curve[-1]['step']:,} steps, {ckpt['train_seconds']:.0f} s")
    return {"depth": depth, "seed": seed, "seconds": float(ckpt["train_seconds"]),
            "curve": curve}


def at_time(curve: list[dict[str, float]], seconds: float) -> float:
    """Success of the last evaluation within ``seconds`` of training (0 before the first)."""
    within = [e["success"] for e in curve if e["seconds"] <= seconds]
    return within[-1] if within else 0.0


def learning(args: argparse.Namespace) -> None:
    console.print(banner("CRL success against depth",
                         f"{args.task}, {args.steps:,} steps, width {args.learn_width}, batch "
                         f"{args.batch}, {args.seeds} seeds, depths {args.depths}"))
    jobs = [(d, s) for s in range(args.seeds) for d in args.depths]
    with ThreadPoolExecutor(args.parallel) as pool:
        runs = list(pool.map(lambda job: learn_one(args, *job), jobs))
    # the fastest depth's slowest seed: every run of that depth is evaluated to its end
    budget = min(max(r["seconds"] for r in runs if r["depth"] == d) for d in args.depths)
    rows = []
    for d in args.depths:
        mine = [r for r in runs if r["depth"] == d]
        rows.append({"depth": d,
                     "success_equal_steps": [r["curve"][-1]["success"] for r in mine],
                     "success_equal_time": [at_time(r["curve"], budget) for r in mine],
                     "seconds": [r["seconds"] for r in mine]})
    table = Table("depth", f"success at {args.steps:,} steps", f"success at {budget:.0f} s",
                  "training seconds")
    for r in rows:
        table.add_row(str(r["depth"]), f"{statistics.mean(r['success_equal_steps']):.2f}",
                      f"{statistics.mean(r['success_equal_time']):.2f}",
                      f"{statistics.mean(r['seconds']):.0f}")
    console.print(table)
    out = Path(args.out)
    learning_figure(runs, args.depths, budget, out.with_suffix(".png"))
    write_json(out, {"meta": machine_meta(), "args": vars(args), "wall_clock_budget_s": budget,
                     "rows": rows, "runs": runs}, console)


def learning_figure(runs: list[dict[str, Any]], depths: list[int], budget: float,
                    path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    colours = plt.get_cmap("viridis")
    for k, d in enumerate(depths):
        colour = colours(k / max(1, len(depths) - 1))
        mine = [r for r in runs if r["depth"] == d]
        for ax, x in zip(axes, ("step", "seconds"), strict=True):
            for i, r in enumerate(mine):
                ax.plot([e[x] for e in r["curve"]], [e["success"] for e in r["curve"]],
                        color=colour, alpha=0.8, lw=1.5,
                        label=f"depth {d}" if i == 0 and x == "step" else None)
    axes[0].set_xlabel("environment steps (all worlds)")
    axes[0].set_ylabel(f"success rate (deterministic), {len(runs) // len(depths)} seeds")
    axes[0].set_title("equal environment steps")
    axes[1].axvline(budget, color="gray", ls="--", lw=1)
    axes[1].set_xlabel("training seconds (one core per run; dashed: equal-time budget)")
    axes[1].set_title("equal wall clock")
    axes[0].set_ylim(0, 1)
    axes[0].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    console.print(f"wrote {path}")


def main() -> None:
    args = parse()
    if args.learning:
        learning(args)
        return
    torch.set_num_threads(args.threads or torch.get_num_threads())
    console.print(banner("CRL cost per depth", f"width {args.width}, batch {args.batch}, "
                         f"{torch.get_num_threads()} threads"
                         + (", checkpointing" if args.checkpoint else "")
                         + (", bf16" if args.bf16 else "")))
    if args.jaxgcrl_python and args.threads != 1:
        raise SystemExit("the JaxGCRL comparison runs on one thread: pass --threads 1")
    rows = [measure(d, args) for d in args.depths]
    peer = jaxgcrl(args) if args.jaxgcrl_python else None
    columns = ["depth", "updates/s (median)", "params", "GFLOP/update", "params+Adam MB",
               "activations MB"]
    if peer:
        columns += ["JaxGCRL updates/s", "ours / JaxGCRL"]
    table = Table(*columns)
    for r in rows:
        cells = [str(r["depth"]), f"{r['updates_per_s']:.1f}", f"{r['params'] / 1e6:.2f}M",
                 f"{r['gflops_per_update']:.2f}", f"{r['state_mb']:.0f}",
                 f"{r['activation_mb']:.0f}"]
        if peer:
            theirs = peer["depths"][str(r["depth"])]
            r["jaxgcrl_updates_per_s"] = theirs["updates_per_s"]
            r["ratio_vs_jaxgcrl"] = r["updates_per_s"] / theirs["updates_per_s"]
            cells += [f"{theirs['updates_per_s']:.1f}", f"{r['ratio_vs_jaxgcrl']:.2f}x"]
        table.add_row(*cells)
    console.print(table)
    write_json(args.out, {"meta": machine_meta(), "args": vars(args), "rows": rows,
                          "jaxgcrl": peer}, console)


def jaxgcrl(args: argparse.Namespace) -> dict[str, Any]:
    """JaxGCRL's CRL update at the same depths, width, batch and timing plan, on one thread
    (``crl_jaxgcrl.py`` in its own venv); its JSON report."""
    script = Path(__file__).with_name("crl_jaxgcrl.py")
    cmd = [args.jaxgcrl_python, str(script), "--depths", *map(str, args.depths),
           "--width", str(args.width), "--batch", str(args.batch),
           "--updates", str(args.updates), "--repeats", str(args.repeats)]
    env = {**os.environ, "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false",
           "OMP_NUM_THREADS": "1"}
    console.print("JaxGCRL's update, same depths, one thread ...")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"crl_jaxgcrl.py failed (exit {proc.returncode}):\n{proc.stderr[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
