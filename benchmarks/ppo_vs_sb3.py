"""Our PPO next to Stable-Baselines3's: end-to-end throughput, and return per wall-clock minute.

    python benchmarks/ppo_vs_sb3.py --mode throughput                 # HalfCheetah, 200k steps each
    python benchmarks/ppo_vs_sb3.py --mode throughput --steps 4096    # smoke test
    python benchmarks/ppo_vs_sb3.py --mode wallclock                  # halfcheetah hopper: ours 5 min, SB3 10 min
    python benchmarks/ppo_vs_sb3.py --mode wallclock --long           # + a 15-minute HalfCheetah run of ours
    python benchmarks/ppo_vs_sb3.py --mode wallclock --tasks hopper --ours-minutes 0.1 --sb3-minutes 0.1
    python benchmarks/plot_curves.py --runs benchmarks/results --out benchmarks/results/curves.png

* ``throughput``: the same task, env steps, networks and PPO hyperparameters (ours' config
  mapped onto SB3's ``PPO``, with ``VecNormalize`` for ours' observation and reward
  normalization); env-steps/s over the whole ``learn``/``train`` call, the final deterministic
  evaluation and the mean return of the last training episodes of each.
* ``wallclock``: ours from the Hydra configs (``configs/tuned/`` applies) for ``--ours-minutes``,
  SB3 with the rl-baselines3-zoo hyperparameters for ``--sb3-minutes``; both evaluated every
  ``--eval-every`` seconds of training time (evaluation time is not charged to the budget) and
  logged to TensorBoard under ``--out`` for ``plot_curves.py``.

Contestants run one after the other, never side by side. Why each choice was made is in
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from common import (
    CORES,
    TimedEvals,
    banner,
    check,
    fresh_dir,
    json_object,
    machine_meta,
    ours_end_to_end,
    ours_wallclock,
    plain,
    print_checks,
    print_end_to_end,
    sb3_end_to_end,
    sb3_eval,
    sb3_policy,
    sb3_policy_kwargs,
    sb3_rollout,
    warn_if_loaded,
    write_json,
)
from rich.console import Console
from rich.table import Table
from stable_baselines3 import PPO as SB3PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import SubprocVecEnv, VecNormalize
from torch import nn
from torch.utils.tensorboard import SummaryWriter

from robotrl.algos.ppo import PPOConfig
from robotrl.config import TrainConfig, from_dict
from robotrl.envs.registry import task_class

TARGET_SPEEDUP = 5.0
"""Throughput target: ours / SB3 end-to-end env-steps/s."""
TARGET_HC_5MIN, TARGET_HC_LONG = 5400.0, 6500.0
"""HalfCheetah evaluation returns ours must reach within 5 minutes, and within the long run."""
TIME_MARKS = (0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 15.0)
"""Minutes at which the best evaluation so far is reported."""

# rl-baselines3-zoo hyperparams/ppo.yml (the -v4 entries, the zoo's newest MuJoCo ones);
# normalize=True there means VecNormalize(gamma=gamma) on obs and reward.
ZOO_POLICY: dict[str, Any] = dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU,
                                  net_arch=dict(pi=[256, 256], vf=[256, 256]))
ZOO: dict[str, dict[str, Any]] = {
    "halfcheetah": dict(
        n_envs=1, batch_size=64, n_steps=512, gamma=0.98, learning_rate=2.0633e-05,
        ent_coef=0.000401762, clip_range=0.1, n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8,
        vf_coef=0.58096, policy_kwargs=ZOO_POLICY),
    "hopper": dict(
        n_envs=1, batch_size=32, n_steps=512, gamma=0.999, learning_rate=9.80828e-05,
        ent_coef=0.00229519, clip_range=0.2, n_epochs=5, gae_lambda=0.99, max_grad_norm=0.7,
        vf_coef=0.835671, policy_kwargs=ZOO_POLICY),
}


class StopAtBudget(BaseCallback):
    """SB3 callback: ``TimedEvals`` when due; stop once the training time reaches the budget."""

    def __init__(self, evals: TimedEvals) -> None:
        super().__init__()
        self.evals = evals

    def _on_step(self) -> bool:
        if self.evals.due():
            self.evals.evaluate(self.num_timesteps)
        return not self.evals.out_of_time()


# ---------------------------------------------------------------------------- throughput mode
def sb3_mapping(algo: PPOConfig, num_envs: int, sb3_envs: int,
                act_dim: int = 0) -> tuple[dict[str, Any], list[str]]:
    """SB3 ``PPO`` arguments as close to ours' ``algo`` as SB3 allows, and what differs.

    SB3's value loss is the plain MSE where ours is half of it, hence ``vf_coef = value_coef/2``.
    (``act_dim``, which ``sb3_end_to_end`` passes, changes nothing here.)
    """
    batch, n_steps, notes = sb3_rollout(algo, num_envs, sb3_envs)
    if algo.clip_low != algo.clip_high:
        notes.append(f"SB3 clips symmetrically: clip_range = clip_low = {algo.clip_low}")
    lr: float | Callable[[float], float] = algo.learning_rate
    if algo.lr_schedule == "linear":
        # SB3 passes progress_remaining = 1 - progress, the factor of ours' linear schedule
        lr = lambda remaining: algo.learning_rate * remaining  # noqa: E731
    elif algo.lr_schedule == "adaptive":
        notes.append(f"SB3 has no KL-adaptive learning rate: fixed at {algo.learning_rate}")
    if algo.shared_backbone:
        notes.append("SB3 >= 1.8 has no shared trunk: separate pi/vf networks")
    if algo.state_dependent_std:
        notes.append("SB3's MlpPolicy has a state-independent log std")
    kwargs = dict(
        learning_rate=lr, n_steps=n_steps, batch_size=batch // algo.num_minibatches,
        n_epochs=algo.num_epochs, gamma=algo.gamma, gae_lambda=algo.gae_lambda,
        clip_range=algo.clip_low, clip_range_vf=algo.value_clip or None,
        normalize_advantage=algo.normalize_advantages, ent_coef=algo.entropy_coef,
        vf_coef=algo.value_coef / 2, max_grad_norm=algo.max_grad_norm or math.inf,
        policy_kwargs=sb3_policy_kwargs(algo),
    )
    return kwargs, notes


def ours_throughput(task: str, args: argparse.Namespace, console: Console) -> dict[str, Any]:
    run_dir = fresh_dir(Path(args.out) / "throughput" / f"ours_{task}", console)
    cfg = from_dict(TrainConfig, {
        "algo": {"name": "ppo", **args.algo_overrides}, "env": {"task": task},
        "num_envs": args.num_envs, "total_steps": args.steps, "seed": args.seed,
        "run_dir": str(run_dir), "logger": {"progress": False},
        "eval_episodes": args.eval_episodes})
    return ours_end_to_end(cfg, "ours", console)


def sb3_throughput(task: str, ours: dict[str, Any], args: argparse.Namespace,
                   console: Console) -> dict[str, Any]:
    vec = {"vec_env_cls": SubprocVecEnv, "vec_env_kwargs": {"start_method": "forkserver"}} \
        if args.sb3_vec == "subproc" else {}
    return sb3_end_to_end(SB3PPO, "SB3", task, ours, sb3_mapping, args, console,
                          f"{args.sb3_vec} x {args.sb3_envs}", **vec)


def throughput(args: argparse.Namespace, console: Console) -> tuple[dict, list[dict]]:
    results, checks = {}, []
    for task in args.tasks:
        ours = ours_throughput(task, args, console)
        sb3 = sb3_throughput(task, ours, args, console)
        ratio = ours["sps"] / sb3["sps"]
        results[task] = {"ours": ours, "sb3": sb3, "ratio": ratio}
        print_end_to_end(console, f"{task} ({task_class(task).gym_id}): PPO end to end, "
                         f"{CORES} cores", ours, sb3, "SB3", args.eval_episodes)
        console.print(f"ours: {ours['collect_s']:.1f} s collecting, {ours['update_s']:.1f} s "
                      f"updating. SB3 arguments: {sb3['hyperparameters']}")
        for note in sb3["notes"]:
            console.print(f"[yellow]note:[/] {note}")
        checks.append(check(f"{task}: ours/SB3 end-to-end env-steps/s >= {TARGET_SPEEDUP:g}x",
                            ratio, ratio >= TARGET_SPEEDUP))
    return results, checks


# ---------------------------------------------------------------------------- wallclock mode
def sb3_wallclock(task: str, minutes: float, args: argparse.Namespace,
                  console: Console) -> dict[str, Any]:
    if task not in ZOO:
        raise ValueError(f"no rl-baselines3-zoo hyperparameters for {task!r}; known: {list(ZOO)}")
    run_dir = fresh_dir(Path(args.out) / f"sb3_{task}", console)
    hp = dict(ZOO[task])
    n_envs = hp.pop("n_envs")
    torch.set_num_threads(args.torch_threads)
    norm = VecNormalize(make_vec_env(task_class(task).gym_id, n_envs=n_envs, seed=args.seed),
                        gamma=hp["gamma"])
    model = SB3PPO("MlpPolicy", norm, seed=args.seed, device="cpu", verbose=0, **hp)
    run_eval = sb3_eval(task, args.eval_episodes, args.seed)
    evals = TimedEvals(lambda: run_eval(sb3_policy(model, norm)), SummaryWriter(str(run_dir)),
                       args.eval_every,
                       60 * minutes, lambda: [float(ep["r"]) for ep in model.ep_info_buffer or []])
    console.print(f"[dim]{task}: SB3 (rl-baselines3-zoo), {minutes:g} min ...[/]")
    evals.begin()
    # no schedule depends on total_timesteps here: the callback ends training at the budget
    model.learn(total_timesteps=10**10, callback=StopAtBudget(evals))
    seconds = evals.finish(model.num_timesteps)
    norm.close()
    return {"label": f"SB3 zoo ({minutes:g} min)", "budget_min": minutes, "run_dir": str(run_dir),
            "train_seconds": seconds, "eval_seconds": evals.eval_s, "steps": model.num_timesteps,
            "final": evals.curve[-1], "curve": evals.curve,
            "hyperparameters": plain({"n_envs": n_envs, "normalize": True, **hp})}


def best_by(run: dict[str, Any], minutes: float) -> float | None:
    """Best evaluation within ``minutes`` of training; a run's budget covers its final eval."""
    if minutes > run["budget_min"] + 1e-9:
        return None
    whole = minutes >= run["budget_min"] - 1e-9
    pts = [p["return"] for p in run["curve"] if whole or p["seconds"] <= 60 * minutes]
    return max(pts) if pts else None


def wallclock_table(task: str, runs: dict[str, dict[str, Any]], console: Console) -> None:
    budgets = {r["budget_min"] for r in runs.values()}
    marks = sorted({m for m in TIME_MARKS if m <= max(budgets)} | budgets)
    table = Table(title=f"{task} ({task_class(task).gym_id}): deterministic eval return",
                  caption="training time excludes evaluations; '-' beyond a run's budget")
    table.add_column("")
    for run in runs.values():
        table.add_column(run["label"], justify="right")
    for m in marks:
        cells = [best_by(r, m) for r in runs.values()]
        table.add_row(f"best by {m:g} min", *("-" if c is None else f"{c:.1f}" for c in cells))
    table.add_section()
    rows = [("final eval at budget", lambda r: f"{r['final']['return']:.1f} ± "
                                               f"{r['final']['std']:.1f}"),
            ("env steps", lambda r: f"{r['steps']:,}"),
            ("training s", lambda r: f"{r['train_seconds']:.0f}"),
            ("evaluations (s)", lambda r: f"{len(r['curve'])} ({r['eval_seconds']:.0f} s)")]
    for label, cell in rows:
        table.add_row(label, *(cell(r) for r in runs.values()))
    console.print(table)


def wallclock_checks(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> list[dict]:
    def at_least(name: str, value: float | None, target: float | None) -> dict[str, Any]:
        ok = None if value is None or target is None else value >= target
        return check(name, value, ok, target=target)

    hc, hop = results.get("halfcheetah", {}), results.get("hopper", {})
    out = [at_least(f"halfcheetah: ours best eval within 5 min >= {TARGET_HC_5MIN:g}",
                    best_by(hc["ours"], min(5.0, hc["ours"]["budget_min"])) if "ours" in hc
                    else None, TARGET_HC_5MIN)]
    long = hc.get("ours_long")
    out.append(at_least(f"halfcheetah: ours best eval within {args.long_minutes:g} min >= "
                        f"{TARGET_HC_LONG:g} (--long)",
                        best_by(long, long["budget_min"]) if long else None, TARGET_HC_LONG))
    ours, sb3 = hop.get("ours"), hop.get("sb3")
    out.append(at_least(f"hopper: ours at {args.ours_minutes:g} min >= SB3 zoo at "
                        f"{args.sb3_minutes:g} min",
                        ours["final"]["return"] if ours else None,
                        sb3["final"]["return"] if sb3 else None))
    return out


def wallclock(args: argparse.Namespace, console: Console) -> tuple[dict, list[dict]]:
    results: dict[str, dict[str, Any]] = {}
    for task in args.tasks:
        runs: dict[str, dict[str, Any]] = {}
        if args.only in (None, "ours"):
            runs["ours"] = ours_wallclock(task, args.ours_minutes, f"ours_{task}",
                                          args.ours_overrides, args, console)
        if args.only in (None, "sb3"):
            runs["sb3"] = sb3_wallclock(task, args.sb3_minutes, args, console)
        if args.long and task == "halfcheetah" and args.only in (None, "ours"):
            runs["ours_long"] = ours_wallclock(task, args.long_minutes, f"ours_{task}_long",
                                               args.ours_overrides + args.long_overrides,
                                               args, console)
        results[task] = runs
        wallclock_table(task, runs, console)
        summary = " | ".join(f"{r['label']}: {r['final']['return']:.1f} at its budget"
                             for r in runs.values())
        console.print(f"{task}: {summary}")
    return results, wallclock_checks(results, args)


# ---------------------------------------------------------------------------- CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mode", choices=("throughput", "wallclock"), default="throughput")
    p.add_argument("--tasks", nargs="+",
                   help="registry names (default: halfcheetah; wallclock: halfcheetah hopper)")
    p.add_argument("--seed", type=int, default=0, help="seed of both contestants")
    p.add_argument("--eval-episodes", type=int, default=10, help="episodes per evaluation")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"),
                   help="run directories and TensorBoard events (default: benchmarks/results/)")
    p.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    p.add_argument("--torch-threads", type=int, default=CORES,
                   help=f"torch.set_num_threads of SB3 (default: cores = {CORES}); ours uses "
                        "its config's torch_threads")
    g = p.add_argument_group("throughput mode")
    g.add_argument("--steps", type=int, default=200_000, help="env steps of each contestant")
    g.add_argument("--num-envs", type=int, default=TrainConfig().num_envs, help="ours' worlds")
    g.add_argument("--algo-overrides", type=json_object, default={}, metavar="JSON",
                   help='PPOConfig fields for ours (and mapped to SB3), e.g. \'{"num_steps": 64}\'')
    g.add_argument("--sb3-envs", type=int, default=8, help="SB3 sub-envs")
    g.add_argument("--sb3-vec", choices=("dummy", "subproc"), default="dummy",
                   help="SB3 DummyVecEnv or SubprocVecEnv (forkserver)")
    g = p.add_argument_group("wallclock mode")
    g.add_argument("--ours-minutes", type=float, default=5.0, help="ours' training budget")
    g.add_argument("--sb3-minutes", type=float, default=10.0, help="SB3's training budget")
    g.add_argument("--eval-every", type=float, default=30.0,
                   help="seconds of training between evaluations")
    g.add_argument("--ours-overrides", nargs="*", default=[], metavar="KEY=VALUE",
                   help="extra `robotrl train` overrides for ours, e.g. total_steps=20000000")
    g.add_argument("--long", action="store_true",
                   help="also run ours on HalfCheetah for --long-minutes (target: 6500)")
    g.add_argument("--long-minutes", type=float, default=15.0)
    g.add_argument("--long-overrides", nargs="*", default=[], metavar="KEY=VALUE",
                   help="overrides for the long run only, after --ours-overrides")
    g.add_argument("--only", choices=("ours", "sb3"), help="run one contestant (checks may SKIP)")
    args = p.parse_args(argv)
    if args.tasks is None:
        args.tasks = ["halfcheetah"] if args.mode == "throughput" else ["halfcheetah", "hopper"]
    unknown = [t for t in args.tasks if t not in ZOO]
    if args.mode == "wallclock" and args.only != "ours" and unknown:
        p.error(f"no rl-baselines3-zoo hyperparameters for {unknown}; known: {list(ZOO)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=max(Console().width, 100))
    console.print(banner(f"robotrl PPO vs Stable-Baselines3 ({args.mode})",
                         f"seed {args.seed}, SB3 {args.torch_threads} torch threads, ours "
                         f"{TrainConfig().torch_threads}", sb3=True))
    warn_if_loaded(console)
    results, verdicts = (throughput if args.mode == "throughput" else wallclock)(args, console)

    def value(c: dict[str, Any]) -> str:
        if args.mode == "throughput":
            return f" ({c['value']:.2f}x)"
        target = "" if c["target"] is None else f" vs {c['target']:.1f}"
        return f" ({c['value']:.1f}{target})"

    print_checks(console, verdicts, value)
    if args.json:
        meta = {**machine_meta(sb3=True), "args": vars(args)}
        write_json(args.json, {"meta": meta, "mode": args.mode, "results": results,
                               "checks": verdicts}, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
