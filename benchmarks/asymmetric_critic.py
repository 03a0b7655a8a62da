"""PPO on Hopper under mass and friction randomization, with and without a privileged critic.

Both arms train the same actor (policy observations only) with the same seeds, steps and
settings (the tuned Hopper PPO); the asymmetric arm's critic also sees the ``privileged`` group
(true base velocity, each world's body masses and frictions). Returns are compared at equal env
steps: the training return over the last finished episodes at fixed checkpoints, and a final
deterministic evaluation on freshly randomized physics (the training distribution).

    python benchmarks/asymmetric_critic.py                     # 3 seeds x 2 arms x 400k steps
    python benchmarks/asymmetric_critic.py --steps 50000 --seeds 0   # a quick check

Writes ``benchmarks/figures/asymmetric_hopper.json``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import banner, machine_meta, write_json
from rich.console import Console

from robotrl.config import TrainConfig, from_dict
from robotrl.experiment.build import build_env, build_runner
from robotrl.runners.evaluation import evaluate
from robotrl.seeding import derive_seed, seed_everything

RANDOMIZATION = {"body_mass": {"low": 0.5, "high": 1.5}, "friction": {"low": 0.5, "high": 1.5}}
"""Per-body masses x0.5-1.5 and per-geom friction x0.5-1.5, drawn at every episode start."""
ARMS: dict[str, list[str]] = {"symmetric": ["policy"], "privileged": ["policy", "privileged"]}
"""Arm name -> the critic's observation groups."""
OUT = Path(__file__).parent / "figures" / "asymmetric_hopper.json"


def run(arm: str, seed: int, steps: int, checkpoints: list[int], run_dir: Path) -> dict[str, Any]:
    """Train one arm and seed; training returns at ``checkpoints`` and the final evaluation."""
    cfg = from_dict(TrainConfig, {
        # the tuned Hopper PPO (configs/tuned/ppo_hopper.yaml)
        "algo": {"name": "ppo", "init_log_std": -1.0, "gamma": 0.995, "critic_obs": ARMS[arm]},
        "env": {"task": "hopper", "options": {}}, "randomization": RANDOMIZATION,
        "logger": {"tensorboard": False, "progress": False}, "total_steps": steps,
        "seed": seed, "run_dir": str(run_dir), "checkpoint_interval": 10**6, "eval_interval": 0,
    })
    seed_everything(seed)
    runner = build_runner(cfg)
    runner.evaluator = None
    curve: dict[int, float] = {}
    start = time.perf_counter()
    update = runner.alg.update

    def update_and_record(progress: float) -> dict[str, float]:
        metrics = update(progress)
        step = runner.global_step + cfg.algo.rollout_steps * cfg.num_envs
        for mark in checkpoints:
            if mark not in curve and step >= mark and runner.recent_returns:
                curve[mark] = statistics.fmean(runner.recent_returns)
        return metrics

    runner.alg.update = update_and_record
    runner.train()
    seconds = time.perf_counter() - start
    env = build_env(cfg, 20, derive_seed(seed, "eval-env"), train=False,
                    randomization=RANDOMIZATION)
    alg = runner.alg
    result = evaluate(lambda obs: alg.act_deterministic(obs), env,
                      seed=derive_seed(seed, "eval-reset"))
    return {"curve": {str(k): v for k, v in curve.items()}, "eval": result["return_mean"],
            "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=OUT,
                        help="the JSON written (default: %(default)s)")
    args = parser.parse_args()
    console = Console()
    console.print(banner("asymmetric critic: PPO Hopper, mass and friction x0.5-1.5",
                         f"{len(args.seeds)} seeds x {args.steps:,} steps per arm"))
    torch.set_num_threads(1)
    checkpoints = [args.steps // 4, args.steps // 2, 3 * args.steps // 4, args.steps]
    results: dict[str, dict[str, Any]] = {arm: {} for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for arm in ARMS:  # interleaved: machine load hits both arms alike
                results[arm][str(seed)] = run(arm, seed, args.steps, checkpoints,
                                              Path(tmp) / f"{arm}_{seed}")
                r = results[arm][str(seed)]
                print(f"{arm:>10} seed {seed}: eval {r['eval']:7.1f}, training return "
                      f"{r['curve'].get(str(args.steps), float('nan')):7.1f} "
                      f"({r['seconds']:.0f} s)", flush=True)
    print(f"\nPPO Hopper, mass+friction x0.5-1.5, {len(args.seeds)} seeds, mean (per seed):")
    print(f"{'steps':>10} " + " ".join(f"{arm:>30}" for arm in ARMS))
    for mark in [*map(str, checkpoints), "eval"]:
        cells = []
        for arm in ARMS:
            values = [r["eval"] if mark == "eval" else r["curve"].get(mark, float("nan"))
                      for r in results[arm].values()]
            cells.append(f"{statistics.fmean(values):7.0f} ({', '.join(f'{v:.0f}' for v in values)})")
        print(f"{mark:>10} " + " ".join(f"{c:>30}" for c in cells))
    write_json(args.out, {"meta": machine_meta(), "steps": args.steps, "seeds": args.seeds,
                          "randomization": RANDOMIZATION, "critic_obs": ARMS,
                          "results": results}, console)


if __name__ == "__main__":
    main()
