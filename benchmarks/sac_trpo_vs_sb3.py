"""Our TRPO and SAC next to sb3-contrib's TRPO and Stable-Baselines3's SAC, end to end.

    python benchmarks/sac_trpo_vs_sb3.py --algo trpo                        # HalfCheetah, 200k steps
    python benchmarks/sac_trpo_vs_sb3.py --algo trpo --steps 8192           # smoke test
    python benchmarks/sac_trpo_vs_sb3.py --algo sac                         # updates/s, 30k steps
    python benchmarks/sac_trpo_vs_sb3.py --algo sac --sac-updates 0 --sac-steps 0 --sac-minutes 30
    python benchmarks/sac_trpo_vs_sb3.py --algo both --task hopper --json out.json
    python benchmarks/sac_trpo_vs_sb3.py --algo trpo --seeds 0 1 2 3 4      # IQM and CIs over seeds

TRPO: the same task, env steps, networks and hyperparameters on both sides (ours' TRPOConfig
mapped onto ``sb3_contrib.TRPO``, with ``VecNormalize`` standing in for ours' observation
normalization and reward scaling); we report env-steps/s over the whole ``train``/``learn``
call, the final deterministic evaluation return of each and the ratio of the throughputs.
Target (issue 4): ours >= 3x sb3-contrib's env-steps/s at equal or better return.

SAC: ``sac_section`` of ``benchmarks/sac_bench.py``. Contestants run one after the other.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    CORES,
    banner,
    check,
    fresh_dir,
    json_object,
    machine_meta,
    mean,
    ours_end_to_end,
    print_checks,
    print_end_to_end,
    sb3_end_to_end,
    sb3_policy_kwargs,
    sb3_rollout,
    warn_if_loaded,
    write_json,
)
from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table
from sac_bench import add_arguments as add_sac_arguments
from sac_bench import sac_section

import robotrl.configs
from robotrl.algos.trpo import TRPOConfig
from robotrl.config import TrainConfig, from_dict
from robotrl.envs.registry import task_class
from robotrl.stats import improvement_estimates, interval_estimates, iqm

TRPO_WORLDS = int(OmegaConf.load(Path(robotrl.configs.__file__).parent / "algo" / "trpo.yaml")
                  .num_envs)
"""The worlds ``robotrl train algo=trpo`` runs."""
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
    ``target_kl = kl_bound(act_dim) / act_dim`` (``KL_PER_ACTION_DIM`` for ours' default).
    """
    batch, n_steps, notes = sb3_rollout(algo, num_envs, sb3_envs)
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
        normalize_advantage=algo.normalize_advantages, target_kl=algo.kl_bound(act_dim) / act_dim,
        policy_kwargs=sb3_policy_kwargs(algo),
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

    def trpo_figures(hist: list[dict[str, float]]) -> dict[str, Any]:
        return {"accepted_fraction": mean([m["train/line_search_accepted"] for m in hist]),
                "mean_kl": mean([m["train/kl"] for m in hist])}

    return ours_end_to_end(cfg, "ours TRPO", console, trpo_figures)


def trpo_sb3(task: str, ours: dict[str, Any], args: argparse.Namespace,
             console: Console) -> dict[str, Any]:
    """sb3-contrib's TRPO with ours' hyperparameters (``trpo_sb3_kwargs``) on the *-v5 env."""
    from sb3_contrib import TRPO as SB3TRPO  # noqa: N811

    return sb3_end_to_end(SB3TRPO, "sb3-contrib TRPO", task, ours, trpo_sb3_kwargs, args,
                          console, f"DummyVecEnv x {args.sb3_envs}")


def trpo_seed(args: argparse.Namespace, console: Console) -> tuple[dict, list[dict]]:
    """Ours then sb3-contrib on ``args.task`` with ``args.seed``: table, ratio, two checks."""
    task = args.task
    ours = trpo_ours(task, args.steps, args, console)
    sb3 = trpo_sb3(task, ours, args, console)
    ratio = ours["sps"] / sb3["sps"]
    print_end_to_end(console, f"{task} ({task_class(task).gym_id}): TRPO end to end, "
                     f"{CORES} cores, seed {args.seed}", ours, sb3, "sb3-contrib",
                     args.eval_episodes)
    console.print(f"ours: {ours['collect_s']:.1f} s collecting, {ours['update_s']:.1f} s "
                  f"updating, line search accepted {ours['accepted_fraction']:.0%} of updates, "
                  f"mean KL {ours['mean_kl']:.4f}. sb3-contrib arguments: {sb3['hyperparameters']}")
    for note in sb3["notes"]:
        console.print(f"[yellow]note:[/] {note}")
    ours_ret, sb3_ret = ours["final"]["return_mean"], sb3["final"]["return_mean"]
    checks = [
        check(f"trpo {task}: ours/sb3-contrib env-steps/s >= {TARGET_TRPO_SPEEDUP:g}x", ratio,
              ratio >= TARGET_TRPO_SPEEDUP),
        check(f"trpo {task}: ours final eval return >= sb3-contrib's ({ours_ret:.1f} vs "
              f"{sb3_ret:.1f}, one seed)", ours_ret - sb3_ret, ours_ret >= sb3_ret),
    ]
    return {"ours": ours, "sb3": sb3, "ratio": ratio}, checks


def trpo_section(args: argparse.Namespace, console: Console) -> tuple[dict, list[dict]]:
    """``trpo_seed`` for every seed of ``args.seeds`` (interleaved: the machine's drift hits
    both); with several seeds, the checks are over seeds: the median throughput ratio, and the
    IQM of the final returns with 95% stratified-bootstrap CIs (issue 19)."""
    if len(args.seeds) == 1:
        return trpo_seed(argparse.Namespace(**{**vars(args), "seed": args.seeds[0]}), console)
    runs = [trpo_seed(argparse.Namespace(**{**vars(args), "seed": seed}), console)[0]
            for seed in args.seeds]
    finals = {who: np.array([[r[who]["final"]["return_mean"]] for r in runs])
              for who in ("ours", "sb3")}
    iqms = interval_estimates(finals, iqm, reps=args.bootstrap_reps)
    p_ours = improvement_estimates(finals, [("ours", "sb3")], reps=args.bootstrap_reps)
    ratios = [r["ratio"] for r in runs]
    table = Table(title=f"TRPO {args.task}: final deterministic return over {len(runs)} seeds "
                        f"({args.steps:,} env steps)")
    for col in ("", *(str(s) for s in args.seeds), "IQM [95% CI]", "env-steps/s (median)"):
        table.add_column(col, justify="right")
    for who, label in (("ours", "ours"), ("sb3", "sb3-contrib")):
        point, lo, hi = iqms[who]
        sps = statistics.median(r[who]["sps"] for r in runs)
        table.add_row(label, *(f"{v:.0f}" for v in finals[who][:, 0]),
                      f"{point:.0f} [{lo:.0f}, {hi:.0f}]", f"{sps:,.0f}")
    console.print(table)
    p, p_lo, p_hi = p_ours[("ours", "sb3")]
    console.print(f"P(ours > sb3-contrib) = {p:.2f} [{p_lo:.2f}, {p_hi:.2f}]; throughput ratio "
                  f"per seed {', '.join(f'{x:.2f}x' for x in ratios)}")
    task, median_ratio = args.task, statistics.median(ratios)
    checks = [
        check(f"trpo {task}: ours/sb3-contrib env-steps/s >= {TARGET_TRPO_SPEEDUP:g}x (median "
              f"of {len(runs)} seeds)", round(median_ratio, 2), median_ratio >= TARGET_TRPO_SPEEDUP),
        check(f"trpo {task}: ours IQM >= sb3-contrib's over {len(runs)} seeds "
              f"({iqms['ours'][0]:.0f} vs {iqms['sb3'][0]:.0f})",
              round(iqms["ours"][0] - iqms["sb3"][0], 1), iqms["ours"][0] >= iqms["sb3"][0]),
    ]
    return {"seeds": runs, "iqm": iqms, "p_improvement": p_ours[("ours", "sb3")],
            "ratios": ratios}, checks


# ---------------------------------------------------------------------------- CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--algo", choices=("trpo", "sac", "both"), default="both")
    p.add_argument("--task", default="halfcheetah", help="registry name (default: halfcheetah)")
    p.add_argument("--steps", type=int, default=200_000, help="env steps of each contestant")
    p.add_argument("--seed", type=int, default=0, help="seed of both contestants")
    p.add_argument("--seeds", type=int, nargs="+",
                   help="TRPO: these seeds, with IQM and bootstrap CIs over them (default: --seed)")
    p.add_argument("--bootstrap-reps", type=int, default=50_000,
                   help="stratified-bootstrap resamples of the CIs (several seeds)")
    p.add_argument("--eval-episodes", type=int, default=10, help="final evaluation episodes")
    p.add_argument("--num-envs", type=int, default=TRPO_WORLDS,
                   help=f"ours' worlds (TRPO; default {TRPO_WORLDS}, configs/algo/trpo.yaml's)")
    p.add_argument("--sb3-envs", type=int, default=8, help="SB3 DummyVecEnv sub-envs (TRPO)")
    p.add_argument("--algo-overrides", type=json_object, default={}, metavar="JSON",
                   help='TRPOConfig fields for ours (and mapped to SB3), e.g. \'{"num_steps": 16}\'')
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch.set_num_threads of SB3 (default 1, as ours' config: on a loaded "
                        "2-core machine 2 threads made SB3's small forwards ~10x slower)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"),
                   help="run directories (default: benchmarks/results/)")
    p.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    add_sac_arguments(p)
    args = p.parse_args(argv)
    args.seeds = args.seeds or [args.seed]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=max(Console().width, 100))
    console.print(banner(f"robotrl {args.algo} vs SB3", f"{args.task}, {args.steps:,} steps, "
                         f"seeds {args.seeds}", sb3=True))
    load = warn_if_loaded(console)
    results: dict[str, Any] = {}
    checks: list[dict[str, Any]] = []
    if args.algo in ("trpo", "both"):
        results["trpo"], trpo_checks = trpo_section(args, console)
        checks += trpo_checks
    if args.algo in ("sac", "both"):
        results["sac"], sac_checks = sac_section(args)
        checks += sac_checks
    print_checks(console, checks)
    if args.json:
        meta = {**machine_meta(sb3=True), "load_before": load, "args": vars(args)}
        write_json(args.json, {"meta": meta, "results": results, "checks": checks}, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
