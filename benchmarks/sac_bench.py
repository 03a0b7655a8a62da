"""Our SAC's gradient updates/s next to Stable-Baselines3's SAC, at the same batch size and
networks (256x256 actor and twin critics, batch 256), both learning from a replay of the same
``WARMUP`` random transitions; interleaved rounds, best and median, one process.

    python benchmarks/sac_bench.py                                 # HalfCheetah, 3 x 300 updates
    python benchmarks/sac_bench.py --torch-threads 2 --out out.json

Learning against SB3 at equal env steps is a grid now (``benchmarks/grids/sac_vs_sb3.yaml``,
``robotrl bench run``), against the wall clock ``offpolicy_wallclock.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch
from common import (
    banner,
    best_median,
    check,
    machine_meta,
    print_checks,
    warn_if_loaded,
    write_json,
)
from rich.console import Console
from stable_baselines3 import SAC as SB3SAC

import robotrl.envs
from robotrl.algos.sac import SAC, SACConfig
from robotrl.envs.registry import task_class

BATCH = 256
HIDDEN = (256, 256)
WARMUP = 10_000
"""Random-action transitions before learning (SB3's rl-zoo value for HalfCheetah)."""
TARGET = 2.0
"""Issue 4's target: ours / SB3 gradient updates/s (best rounds)."""


def _sb3_model(task: str, seed: int, learning_starts: int) -> SB3SAC:
    import gymnasium as gym

    env = gym.make(task_class(task).gym_id)
    return SB3SAC("MlpPolicy", env, batch_size=BATCH, learning_starts=learning_starts,
                  policy_kwargs={"net_arch": list(HIDDEN)}, seed=seed, device="cpu", verbose=0)


def update_rates(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """Gradient updates/s of both on a replay of ``WARMUP`` random HalfCheetah transitions."""
    torch.set_num_threads(args.torch_threads)
    env = robotrl.envs.make(args.task, 16, seed=args.seed)
    cfg = SACConfig(batch_size=BATCH, actor_hidden=HIDDEN, critic_hidden=HIDDEN,
                    learning_starts=WARMUP, buffer_size=100_000)
    ours = SAC(env.spec.obs_dim, env.spec.action_low, env.spec.action_high, 16, cfg, seed=args.seed)
    obs = env.reset(seed=args.seed)
    while ours.transitions < WARMUP:
        out = env.step(ours.act(obs))
        ours.process_env_step(out.reward, out.terminated, out.truncated, out.info["final_obs"])
        obs = out.obs
    sb3 = _sb3_model(args.task, args.seed, WARMUP)
    sb3.learn(WARMUP)  # fills its replay with random actions, no updates yet
    k = args.sac_updates
    rates: dict[str, list[float]] = {"ours": [], "sb3": []}
    for rep in range(args.repeats + 1):  # the first round warms caches and allocators
        t0 = time.perf_counter()
        ours.owed_updates = k
        ours.update()
        t1 = time.perf_counter()
        sb3.train(gradient_steps=k, batch_size=BATCH)
        t2 = time.perf_counter()
        if rep:
            rates["ours"].append(k / (t1 - t0))
            rates["sb3"].append(k / (t2 - t1))
    out = {name: {**best_median(r), "all": r} for name, r in rates.items()}
    out["ratio_best"] = out["ours"]["best"] / out["sb3"]["best"]
    out["ratio_median"] = out["ours"]["median"] / out["sb3"]["median"]
    console.print(f"updates/s (batch {BATCH}, {HIDDEN} nets, {args.torch_threads} torch "
                  f"thread(s), {k} updates x {args.repeats}): ours {out['ours']['best']:.1f} "
                  f"best / {out['ours']['median']:.1f} median, SB3 {out['sb3']['best']:.1f} / "
                  f"{out['sb3']['median']:.1f} -> {out['ratio_best']:.2f}x / "
                  f"{out['ratio_median']:.2f}x")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="halfcheetah", help="registry name (default: halfcheetah)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sac-updates", type=int, default=300, help="updates per timed round")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds")
    p.add_argument("--torch-threads", type=int, default=1, help="torch threads of both")
    p.add_argument("--out", default="benchmarks/figures/sac_updates.json",
                   help="the JSON of every figure (default: %(default)s)")
    args = p.parse_args(argv)
    console = Console()
    console.print(banner("robotrl SAC vs SB3: gradient updates/s", args.task, sb3=True))
    load = warn_if_loaded(console)
    result = update_rates(args, console)
    checks = [check(f"sac: ours/SB3 gradient updates/s >= {TARGET:g}x (best rounds)",
                    result["ratio_best"], result["ratio_best"] >= TARGET)]
    print_checks(console, checks, lambda c: f" ({c['value']:.2f}x)")
    meta = {**machine_meta(sb3=True), "load_before": load, "args": vars(args)}
    write_json(args.out, {"meta": meta, "updates": result, "checks": checks}, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
