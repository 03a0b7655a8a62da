"""GRPO vs PPO on the same initial states, and GRPO fine-tuning of an under-trained PPO policy.

    python benchmarks/grpo_vs_ppo.py                       # reacher + inverted_double_pendulum
    python benchmarks/grpo_vs_ppo.py --seeds 3 --tasks reacher --evals 8

Part 1, for each task and seed: ``robotrl train algo=grpo`` and ``algo=ppo`` with the same
budget of env steps (each algorithm's defaults; GRPO on inverted_double_pendulum with rounds of
``--idp-horizon`` steps, as its episodes last 1000 steps). Both are evaluated ``--evals`` times
(deterministic, full episodes) on the GRPO run's train and test initial states
(``robotrl.runners.group.GroupEvaluator``), with the env steps and training wall clock at each
point. Reported: mean and 95% Student-t CI over seeds at equal env steps (the end) and at equal
wall clock (the last evaluation of each run within the faster algorithm's median time).

Part 2 (reacher): PPO trained for ``--pretrain-steps``, then ``algo=grpo algo.outcome=success
init=<its checkpoint>`` for ``--finetune-steps``: test-state success before vs after.

Writes ``--out`` and, in its folder, figures (learning curves by steps and by seconds, the
fine-tuning bars).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import banner, compose_ours, fresh_dir, machine_meta, ours_runner, write_json
from rich.console import Console

from robotrl.envs import make
from robotrl.runners.group import GroupEvaluator
from robotrl.stats import mean_interval

console = Console()
METRICS = ("train/return", "test/return", "train/success", "test/success")


def train_and_evaluate(task: str, algo: str, seed: int, steps: int, evals: int, run_dir: Path,
                       states: dict[str, Any] | None, extra: list[str]) -> dict[str, Any]:
    """One run, trained in ``evals`` chunks; after each, the GroupEvaluator on ``states`` (the
    run's own for GRPO). Returns its curve and states."""
    args = argparse.Namespace(seed=seed, eval_episodes=10)
    cfg = compose_ours(task, 0, run_dir, args, [f"algo={algo}", f"total_steps={steps}", *extra])
    runner = ours_runner(cfg)
    if states is None:
        states = runner.states
    env = make(task, len(states["test"]), seed=seed)
    evaluator = GroupEvaluator(env, states, runner.device)
    curve = []

    def point() -> None:
        metrics = evaluator(runner.alg)
        curve.append({"step": runner.global_step, "seconds": runner.train_seconds,
                      **{k.removeprefix("eval/"): v for k, v in metrics.items()}})

    point()
    for k in range(1, evals + 1):
        runner.settings.total_steps = steps * k // evals
        runner.train()
        point()
        last = curve[-1]
        console.print(f"  {task} {algo} s{seed}: step {last['step']:>9,} {last['seconds']:6.0f}s "
                      f"test return {last['test/return']:8.1f}"
                      + (f" success {last['test/success']:.2f}" if "test/success" in last else ""))
    return {"curve": curve, "states": states}


def at_seconds(curve: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """The last evaluation of ``curve`` within ``seconds`` of training."""
    return [p for p in curve if p["seconds"] <= seconds + 1e-9][-1]


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Mean and 95% CI over seeds of every metric, at the end and at equal wall clock."""
    ends = {a: [r["curve"][-1] for r in rs] for a, rs in runs.items()}
    budget = min(float(np.median([p["seconds"] for p in ends[a]])) for a in runs)
    out: dict[str, Any] = {"equal_seconds": budget}
    for a, rs in runs.items():
        timed = [at_seconds(r["curve"], budget) for r in rs]
        out[a] = {"steps": float(np.mean([p["step"] for p in ends[a]])),
                  "seconds": float(np.mean([p["seconds"] for p in ends[a]]))}
        for m in METRICS:
            if m in ends[a][0]:
                out[a][f"end {m}"] = mean_interval([p[m] for p in ends[a]])
                out[a][f"timed {m}"] = mean_interval([p[m] for p in timed])
    return out


def figures(results: dict[str, Any], out: Path) -> list[str]:
    """Learning curves (test states) per task, by env steps and by seconds; fine-tune bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    out.mkdir(parents=True, exist_ok=True)
    for task, runs in results["tasks"].items():
        metric = "test/success" if task == "reacher" else "test/return"
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for algo, rs in runs.items():
            for ax, x in zip(axes, ("step", "seconds"), strict=True):
                xs = np.array([[p[x] for p in r["curve"]] for r in rs]).mean(0)
                ys = np.array([[p[metric] for p in r["curve"]] for r in rs])
                mean, sem = ys.mean(0), ys.std(0, ddof=1) / np.sqrt(len(ys)) if len(ys) > 1 \
                    else np.zeros(ys.shape[1])
                ax.plot(xs, mean, label=algo.upper())
                ax.fill_between(xs, mean - 1.96 * sem, mean + 1.96 * sem, alpha=0.2)
                ax.set_xlabel("env steps" if x == "step" else "training seconds")
                ax.set_ylabel(f"{metric} (deterministic)")
        axes[0].legend()
        fig.suptitle(f"{task}: GRPO vs PPO on the GRPO run's test initial states "
                     f"({len(next(iter(runs.values())))} seeds, mean ± 95% CI)")
        fig.tight_layout()
        path = out / f"grpo_vs_ppo_{task}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(str(path))
    if results.get("finetune"):
        ft = results["finetune"]
        fig, ax = plt.subplots(figsize=(5, 3.6))
        for i, key in enumerate(("before", "after")):
            vals = [r[key]["test/success"] for r in ft["runs"]]
            ax.bar(i, np.mean(vals), color=f"C{i}")
            ax.scatter([i] * len(vals), vals, color="k", zorder=3, s=12)
            ax.text(i, np.mean(vals), f"{100 * np.mean(vals):.0f}%", ha="center", va="bottom")
        ax.set_xticks([0, 1], ["PPO (pretrained)", "+ GRPO (success)"])
        ax.set_ylabel("reacher test-state success")
        ax.set_title("Fine-tuning with the binary success reward")
        fig.tight_layout()
        path = out / "grpo_finetune_reacher.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(str(path))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["reacher", "inverted_double_pendulum"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=json.loads, default={"reacher": 1_000_000,
                                                            "inverted_double_pendulum": 1_000_000},
                        help='JSON: env steps per task, e.g. \'{"reacher": 500000}\'')
    parser.add_argument("--evals", type=int, default=8, help="evaluations per run")
    parser.add_argument("--idp-horizon", type=int, default=100,
                        help="GRPO's round length on inverted_double_pendulum")
    parser.add_argument("--pretrain-steps", type=int, default=500_000)
    parser.add_argument("--finetune-steps", type=int, default=1_000_000)
    parser.add_argument("--finetune-log-std", type=float, default=-1.5)
    parser.add_argument("--out", type=Path, help="the JSON written; the figures go beside it",
                        default=Path("benchmarks/figures/grpo/grpo_vs_ppo.json"))
    parser.add_argument("--runs", type=Path, default=Path("runs/bench_grpo"))
    args = parser.parse_args()
    console.print(banner("GRPO vs PPO", f"{args.seeds} seeds, tasks {args.tasks}"))
    fresh_dir(args.runs, console)
    start = time.perf_counter()
    results: dict[str, Any] = {"meta": machine_meta(), "settings": vars(args) | {
        "out": str(args.out), "runs": str(args.runs)}, "tasks": {}, "summary": {}}
    for task in args.tasks:
        steps = int(args.steps[task])
        grpo_extra = [f"algo.horizon={args.idp_horizon}"] if task != "reacher" else []
        runs: dict[str, list[dict[str, Any]]] = {"grpo": [], "ppo": []}
        for seed in range(args.seeds):
            grpo = train_and_evaluate(task, "grpo", seed, steps, args.evals,
                                      args.runs / task / f"grpo_s{seed}", None, grpo_extra)
            ppo = train_and_evaluate(task, "ppo", seed, steps, args.evals,
                                     args.runs / task / f"ppo_s{seed}", grpo["states"], [])
            runs["grpo"].append({"curve": grpo["curve"]})
            runs["ppo"].append({"curve": ppo["curve"]})
        results["tasks"][task] = runs
        results["summary"][task] = summarize(runs)
        console.print(results["summary"][task])
    if args.finetune_steps > 0:
        ft_runs = []
        for seed in range(args.seeds):
            base = args.runs / "finetune" / f"s{seed}"
            pretrain = compose_ours("reacher", 0, base / "ppo", argparse.Namespace(
                seed=seed, eval_episodes=10), ["algo=ppo", f"total_steps={args.pretrain_steps}"])
            ppo = ours_runner(pretrain)
            ppo.train()
            # the first evaluation of the GRPO run is the pretrained policy's (its init)
            grpo = train_and_evaluate(
                "reacher", "grpo", seed, args.finetune_steps, 4, base / "grpo", None,
                ["algo.outcome=success", f"init={ppo.checkpoint_path}",
                 f"algo.init_log_std={args.finetune_log_std}"])
            ft_runs.append({"before": grpo["curve"][0], "after": grpo["curve"][-1],
                            "curve": grpo["curve"]})
        results["finetune"] = {
            "runs": ft_runs,
            "before test/success": mean_interval([r["before"]["test/success"] for r in ft_runs]),
            "after test/success": mean_interval([r["after"]["test/success"] for r in ft_runs]),
            "before train/success": mean_interval([r["before"]["train/success"] for r in ft_runs]),
            "after train/success": mean_interval([r["after"]["train/success"] for r in ft_runs]),
        }
        console.print({k: v for k, v in results["finetune"].items() if k != "runs"})
    results["seconds"] = time.perf_counter() - start
    results["figures"] = figures(results, args.out.parent)
    write_json(args.out, results, console)


if __name__ == "__main__":
    main()
