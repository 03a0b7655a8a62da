"""Our TRPO and SAC next to sb3-contrib's TRPO and Stable-Baselines3's SAC, end to end.

    python benchmarks/sac_trpo_vs_sb3.py --algo trpo                        # HalfCheetah, 200k steps
    python benchmarks/sac_trpo_vs_sb3.py --algo trpo --steps 8192           # smoke test
    python benchmarks/sac_trpo_vs_sb3.py --algo sac                         # updates/s, 30k steps
    python benchmarks/sac_trpo_vs_sb3.py --algo sac --sac-updates 0 --sac-steps 0 --sac-minutes 30
    python benchmarks/sac_trpo_vs_sb3.py --algo both --task hopper --json out.json

TRPO: the same task, env steps, networks and hyperparameters on both sides (ours' TRPOConfig
mapped onto ``sb3_contrib.TRPO``, with ``VecNormalize`` standing in for ours' observation
normalization and reward scaling); we report env-steps/s over the whole ``train``/``learn``
call, the final deterministic evaluation return of each and the ratio of the throughputs.
Target (issue 4): ours >= 3x sb3-contrib's env-steps/s at equal or better return.

SAC: ``sac_section`` of ``benchmarks/sac_bench.py``. Contestants run one after the other.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import mujoco
import stable_baselines3
import torch

# sibling benchmark scripts (this folder is on sys.path when run as a script)
from env_throughput import CORES, cpu_name, warn_if_loaded  # noqa: E402
from ppo_vs_sb3 import (  # noqa: E402
    EVAL_ENV_SEED,
    EVAL_RESET_SEED,
    fresh_dir,
    mean,
    ours_policy,
    plain,
    print_end_to_end,
    sb3_learn,
    sb3_normalize,
)
from rich.console import Console
from sac_bench import add_arguments as add_sac_arguments
from sac_bench import sac_section

from robotrl.algos.trpo import TRPOConfig
from robotrl.cli.build import build_env, build_runner
from robotrl.config import TrainConfig, from_dict, to_dict, validate
from robotrl.envs.registry import task_class
from robotrl.nn.mlp import ACTIVATIONS
from robotrl.runners.evaluation import evaluate
from robotrl.seeding import seed_everything

TARGET_TRPO_SPEEDUP = 3.0
"""Throughput target: ours / sb3-contrib TRPO end-to-end env-steps/s."""


# ---------------------------------------------------------------------------- TRPO
def trpo_sb3_kwargs(algo: TRPOConfig, num_envs: int, sb3_envs: int,
                    act_dim: int) -> tuple[dict[str, Any], list[str]]:
    """``sb3_contrib.TRPO`` arguments equal to ours' ``algo`` where it has them, and the notes.

    One rollout of ours (num_steps x num_envs samples) is one rollout of SB3 (n_steps x
    sb3_envs); the critic sees the same minibatch size and number of passes. sb3-contrib's KL
    is averaged over action dimensions as well as states (``kl_divergence(...).mean()`` on a
    [B, A] tensor) where ours sums over dimensions, so the same trust region is
    ``target_kl = max_kl / act_dim``.
    """
    notes: list[str] = []
    batch = algo.num_steps * num_envs
    n_steps = max(1, round(batch / sb3_envs))
    if n_steps * sb3_envs != batch:
        notes.append(f"rollout batch {batch} is not a multiple of --sb3-envs {sb3_envs}: SB3 "
                     f"collects {n_steps * sb3_envs}")
    if algo.state_dependent_std:
        notes.append("SB3's MlpPolicy has a state-independent log std")
    if algo.fvp_fraction < 1:
        notes.append(f"ours computes the Fisher-vector products on {algo.fvp_fraction:g} of the "
                     "rollout; sb3-contrib on all of it (its sub_sampling_factor would subsample "
                     "the gradient and line search too)")
    kwargs = dict(
        learning_rate=algo.critic_lr, n_steps=n_steps, batch_size=batch // algo.critic_minibatches,
        gamma=algo.gamma, gae_lambda=algo.gae_lambda, cg_max_steps=algo.cg_iters,
        cg_damping=algo.cg_damping, line_search_shrinking_factor=algo.backtrack,
        line_search_max_iter=algo.line_search_steps, n_critic_updates=algo.critic_epochs,
        normalize_advantage=algo.normalize_advantages, target_kl=algo.max_kl / act_dim,
        policy_kwargs=dict(net_arch=dict(pi=list(algo.actor_hidden), vf=list(algo.critic_hidden)),
                           activation_fn=ACTIVATIONS[algo.activation],
                           log_std_init=algo.init_log_std, ortho_init=True),
    )
    return kwargs, notes


def trpo_ours(task: str, steps: int, args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """Ours through the on-policy runner (its config's torch threads); eval after the clock."""
    run_dir = fresh_dir(Path(args.out) / "trpo" / f"ours_{task}", console)
    cfg = from_dict(TrainConfig, {
        "algo": {"name": "trpo", **args.algo_overrides}, "env": {"task": task},
        "num_envs": args.num_envs, "total_steps": steps, "seed": args.seed,
        "run_dir": str(run_dir), "logger": {"progress": False, "tensorboard": False},
        "eval_episodes": args.eval_episodes, "eval_interval": 0})
    validate(cfg)
    torch.set_num_threads(cfg.torch_threads or CORES)
    seed_everything(cfg.seed)
    runner = build_runner(cfg)
    runner.make_eval_env = None  # evaluated below, outside the timed call
    console.print(f"[dim]{task}: ours TRPO, {cfg.num_envs} worlds, {steps:,} steps ...[/]")
    t0 = time.perf_counter()
    runner.train()
    seconds = time.perf_counter() - t0
    eval_env = build_env(cfg, cfg.eval_episodes, cfg.seed + EVAL_ENV_SEED, train=False)
    final = evaluate(ours_policy(runner.alg), eval_env, seed=cfg.seed + EVAL_RESET_SEED)
    hist, returns = runner.history, list(runner.recent_returns)
    accepted = [m["train/line_search_accepted"] for m in hist]
    return {"steps": runner.global_step, "seconds": seconds, "sps": runner.global_step / seconds,
            "final": final, "train_return": mean(returns), "train_episodes": len(returns),
            "collect_s": sum(m["perf/collect_s"] for m in hist),
            "update_s": sum(m["perf/update_s"] for m in hist),
            "accepted_fraction": mean(accepted), "mean_kl": mean([m["train/kl"] for m in hist]),
            "config": to_dict(cfg)}


def trpo_sb3(task: str, cfg: dict[str, Any], args: argparse.Namespace,
             console: Console) -> dict[str, Any]:
    """sb3-contrib's TRPO with ours' hyperparameters (``trpo_sb3_kwargs``) on the *-v5 env."""
    from sb3_contrib import TRPO as SB3TRPO  # noqa: N811
    from stable_baselines3.common.env_util import make_vec_env

    algo = from_dict(TrainConfig, cfg).algo
    torch.set_num_threads(args.torch_threads)
    venv = make_vec_env(task_class(task).gym_id, n_envs=args.sb3_envs, seed=args.seed)
    kwargs, notes = trpo_sb3_kwargs(algo, cfg["num_envs"], args.sb3_envs,
                                    int(venv.action_space.shape[0]))
    venv, norm = sb3_normalize(venv, algo)
    model = SB3TRPO("MlpPolicy", venv, seed=args.seed, device="cpu", verbose=0, **kwargs)
    console.print(f"[dim]{task}: sb3-contrib TRPO, DummyVecEnv x {args.sb3_envs}, n_steps "
                  f"{kwargs['n_steps']}, {cfg['total_steps']:,} steps ...[/]")
    return sb3_learn(model, venv, norm, task, cfg["total_steps"], args,
                     {"hyperparameters": plain(kwargs), "notes": notes,
                      "vec_env": f"DummyVecEnv x {args.sb3_envs}"})


def trpo_section(args: argparse.Namespace, console: Console) -> tuple[dict, list[dict]]:
    """Ours then sb3-contrib on ``args.task``: table, ratio and the two checks."""
    task = args.task
    ours = trpo_ours(task, args.steps, args, console)
    sb3 = trpo_sb3(task, ours["config"], args, console)
    ratio = ours["sps"] / sb3["sps"]
    print_end_to_end(console, f"{task} ({task_class(task).gym_id}): TRPO end to end, "
                     f"{CORES} cores", ours, sb3, "sb3-contrib", args.eval_episodes)
    console.print(f"ours: {ours['collect_s']:.1f} s collecting, {ours['update_s']:.1f} s "
                  f"updating, line search accepted {ours['accepted_fraction']:.0%} of updates, "
                  f"mean KL {ours['mean_kl']:.4f}. sb3-contrib arguments: {sb3['hyperparameters']}")
    for note in sb3["notes"]:
        console.print(f"[yellow]note:[/] {note}")
    ours_ret, sb3_ret = ours["final"]["return_mean"], sb3["final"]["return_mean"]
    checks = [
        {"name": f"trpo {task}: ours/sb3-contrib env-steps/s >= {TARGET_TRPO_SPEEDUP:g}x",
         "value": ratio, "status": "PASS" if ratio >= TARGET_TRPO_SPEEDUP else "FAIL"},
        {"name": f"trpo {task}: ours final eval return >= sb3-contrib's ({ours_ret:.1f} vs "
                 f"{sb3_ret:.1f}, one seed)",
         "value": ours_ret - sb3_ret, "status": "PASS" if ours_ret >= sb3_ret else "FAIL"},
    ]
    return {"ours": ours, "sb3": sb3, "ratio": ratio}, checks


# ---------------------------------------------------------------------------- CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--algo", choices=("trpo", "sac", "both"), default="both")
    p.add_argument("--task", default="halfcheetah", help="registry name (default: halfcheetah)")
    p.add_argument("--steps", type=int, default=200_000, help="env steps of each contestant")
    p.add_argument("--seed", type=int, default=0, help="seed of both contestants")
    p.add_argument("--eval-episodes", type=int, default=10, help="final evaluation episodes")
    p.add_argument("--num-envs", type=int, default=TrainConfig().num_envs,
                   help="ours' worlds (TRPO)")
    p.add_argument("--sb3-envs", type=int, default=8, help="SB3 DummyVecEnv sub-envs (TRPO)")
    p.add_argument("--algo-overrides", type=json.loads, default={}, metavar="JSON",
                   help='TRPOConfig fields for ours (and mapped to SB3), e.g. \'{"num_steps": 16}\'')
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch.set_num_threads of SB3 (default 1, as ours' config: on a loaded "
                        "2-core machine 2 threads made SB3's small forwards ~10x slower)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"),
                   help="run directories (default: benchmarks/results/)")
    p.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    add_sac_arguments(p)
    args = p.parse_args(argv)
    if not isinstance(args.algo_overrides, dict):
        p.error("--algo-overrides must be a JSON object")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=max(Console().width, 100))
    console.print(f"robotrl {args.algo} vs SB3 | {cpu_name()}, {CORES} cores | mujoco "
                  f"{mujoco.__version__}, torch {torch.__version__}, SB3 "
                  f"{stable_baselines3.__version__} | {args.task}, {args.steps:,} steps, "
                  f"seed {args.seed}")
    load = warn_if_loaded(console)
    results: dict[str, Any] = {}
    checks: list[dict[str, Any]] = []
    if args.algo in ("trpo", "both"):
        results["trpo"], trpo_checks = trpo_section(args, console)
        checks += trpo_checks
    if args.algo in ("sac", "both"):
        results["sac"], sac_checks = sac_section(args)
        checks += sac_checks
    for c in checks:
        colour = {"PASS": "green", "FAIL": "red", "SKIP": "yellow"}[c["status"]]
        console.print(f"[{colour}]{c['status']}[/] {c['name']}")
    if args.json:
        meta = {"cores": CORES, "cpu": cpu_name(), "mujoco": mujoco.__version__,
                "torch": torch.__version__, "sb3": stable_baselines3.__version__,
                "python": platform.python_version(), "load_before": load, "args": vars(args)}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results, "checks": checks}, f, indent=2,
                      default=str)
        console.print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
