"""SAC section of ``sac_trpo_vs_sb3.py``: our SAC next to Stable-Baselines3's.

Three measurements, contestants one after the other in one process:

* ``updates``: gradient updates/s at the same batch size and networks (256x256 actor and twin
  critics, batch 256), both learning from a replay of the same number of real transitions;
  interleaved repeats, best and median.
* ``same steps``: both train for ``--sac-steps`` env steps at one update per env step
  (SB3: 1 env, ``train_freq=1``; ours: ``--sac-envs`` worlds per step, ``utd_ratio=1``), same
  networks, batch and warm-up; env-steps/s, updates/s and the final deterministic return.
* ``wallclock`` (``--sac-minutes M``): ours from the Hydra configs (``algo=sac``, tuned files
  apply) for M minutes, evaluated on the training clock (``common.ours_wallclock``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from common import best_median, check, ours_evaluation, ours_runner, ours_wallclock, sb3_learn
from rich.console import Console
from rich.table import Table
from stable_baselines3 import SAC as SB3SAC

import robotrl.envs
from robotrl.algos.sac import SAC, SACConfig
from robotrl.config import TrainConfig, from_dict
from robotrl.envs.registry import task_class

BATCH = 256
HIDDEN = (256, 256)
WARMUP = 10_000
"""Random-action transitions before learning (SB3's rl-zoo value for HalfCheetah)."""


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


def same_steps(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """Both train ``--sac-steps`` env steps at UTD 1; throughput and final return."""
    steps, seed = args.sac_steps, args.seed
    algo = {"name": "sac", "batch_size": BATCH, "actor_hidden": list(HIDDEN),
            "critic_hidden": list(HIDDEN), "learning_starts": min(WARMUP, steps // 2),
            "utd_ratio": 1.0, "num_steps": 1}
    cfg = from_dict(TrainConfig, {
        "algo": algo, "env": {"task": args.task}, "num_envs": args.sac_envs,
        "total_steps": steps, "seed": seed, "run_dir": f"{args.out}/sac_same_steps",
        "logger": {"tensorboard": False, "progress": False}, "eval_interval": 0,
        "checkpoint_interval": 10**9, "torch_threads": args.torch_threads,
        "eval_episodes": args.eval_episodes})
    runner = ours_runner(cfg)
    console.print(f"[dim]SAC same steps: ours, {args.sac_envs} worlds, {steps:,} steps ...[/]")
    t0 = time.perf_counter()
    runner.train()
    ours_s = time.perf_counter() - t0
    ours_eval = ours_evaluation(runner, cfg)()
    ours = {"seconds": ours_s, "env_steps_per_s": runner.global_step / ours_s,
            "updates": runner.alg.num_updates, "updates_per_s": runner.alg.num_updates / ours_s,
            "return": ours_eval["return_mean"], "return_std": ours_eval["return_std"]}
    console.print(f"[dim]SAC same steps: SB3, 1 env, {steps:,} steps ...[/]")
    model = _sb3_model(args.task, seed, algo["learning_starts"])
    run = sb3_learn(model, model.get_env(), None, args.task, steps, args, {})
    sb3 = {"seconds": run["seconds"], "env_steps_per_s": run["sps"], "updates": model._n_updates,
           "updates_per_s": model._n_updates / run["seconds"],
           "return": run["final"]["return_mean"], "return_std": run["final"]["return_std"]}
    table = Table(title=f"SAC {args.task}, {steps:,} env steps, UTD 1, batch {BATCH}, {HIDDEN}")
    for col in ("", "env-steps/s", "updates/s", "updates", "final return"):
        table.add_column(col, justify="right")
    for name, r in (("ours", ours), ("SB3", sb3)):
        table.add_row(name, f"{r['env_steps_per_s']:.0f}", f"{r['updates_per_s']:.1f}",
                      f"{r['updates']:,}", f"{r['return']:.0f} ± {r['return_std']:.0f}")
    table.add_row("ratio", f"{ours['env_steps_per_s'] / sb3['env_steps_per_s']:.2f}x",
                  f"{ours['updates_per_s'] / sb3['updates_per_s']:.2f}x", "", "")
    console.print(table)
    return {"ours": ours, "sb3": sb3, "steps": steps, "num_envs": args.sac_envs}


def sac_section(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """All SAC measurements that ``args`` asks for, and their pass/fail checks."""
    console = Console()
    results: dict[str, Any] = {}
    checks: list[dict[str, Any]] = []
    if args.sac_updates:
        results["updates"] = upd = update_rates(args, console)
        checks.append(check("sac: ours/SB3 gradient updates/s >= 2x (best repeats)",
                            upd["ratio_best"], upd["ratio_best"] >= 2.0))
    if args.sac_steps:
        results["same_steps"] = same = same_steps(args, console)
        gap = same["ours"]["return"] - same["sb3"]["return"]
        checks.append(check(f"sac: ours final return >= SB3's after {same['steps']:,} steps "
                            "(one seed)", gap, gap >= 0))
    if args.sac_minutes:
        extra = ["algo=sac", *args.sac_overrides]
        run = ours_wallclock(args.task, args.sac_minutes, f"sac_{args.task}_{args.sac_minutes:g}min",
                             extra, args, console)
        results["wallclock"] = run
        curve = run["curve"]
        for minutes, target in ((10, 5000.0), (30, 7500.0)):
            if args.sac_minutes + 1e-9 >= minutes:
                best = max(p["return"] for p in curve if p["seconds"] <= 60 * minutes + 1)
                checks.append(check(f"sac {args.task}: return >= {target:g} within {minutes} "
                                    f"min (best eval: {best:.0f})", best, best >= target))
        for p in curve:
            console.print(f"  {p['seconds'] / 60:5.1f} min  {p['steps']:>9,} steps  "
                          f"return {p['return']:8.1f} ± {p['std']:.0f}")
    return results, checks


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The SAC options of ``sac_trpo_vs_sb3.py``."""
    p.add_argument("--sac-updates", type=int, default=300,
                   help="updates per timed round of the updates/s comparison (0: skip)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (updates/s)")
    p.add_argument("--sac-steps", type=int, default=30_000,
                   help="env steps of the same-steps comparison (0: skip)")
    p.add_argument("--sac-envs", type=int, default=16, help="our worlds in the same-steps run")
    p.add_argument("--sac-minutes", type=float, default=0.0,
                   help="wall-clock run of ours from the Hydra configs (0: skip)")
    p.add_argument("--sac-overrides", nargs="*", default=[], metavar="KEY=VALUE",
                   help="extra `robotrl train` overrides of the wall-clock run")
    p.add_argument("--eval-every", type=float, default=60.0,
                   help="seconds of training between evaluations (wall-clock run)")
