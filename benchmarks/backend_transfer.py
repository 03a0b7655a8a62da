"""Does a policy trained on MJX keep its return elsewhere? (issue 20)

    python benchmarks/backend_transfer.py --tasks halfcheetah --minutes 8      # CPU JAX, small
    python benchmarks/backend_transfer.py --device cuda --num-envs 4096 --minutes 10  # a GPU
    python benchmarks/backend_transfer.py --tasks ant --train-backend mujoco --minutes 10
                                                    # the other way: trained natively


For each task: ``robotrl train backend=mjx`` (PPO, the task's defaults) for ``--minutes``; the
final actor exported to ONNX (``robotrl export``: normalization and scaling baked in, verified
against torch); the ONNX file run through onnxruntime on ``--episodes`` evaluation episodes of
each of: the mjx backend it was trained on, the native MuJoCo backend, and Gymnasium's own
``*-v5`` env (``backend=gymnasium``), each reset with the same seed. The three draw their
initial states from different random streams (JAX, a torch generator, numpy per sub-env), so
their episodes are independent samples. Prints the three returns side by side and checks that
the native and Gymnasium returns keep >= 90% of the MJX return (issue 20's target); the kept
shares are printed +- 2 standard errors. Runs go to ``<--runs>/<task>`` and resume if
interrupted; the figures to ``--out``.

``--train-backend mujoco`` trains on the native backend instead and reports the shares of the
native return kept on mjx and in Gymnasium: where mjx trains too slowly to learn a task (Ant on
a CPU), a competent policy's return on both simulators still tells whether they agree.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch
from common import banner, check, machine_meta, print_checks, train_subprocess, write_json
from rich.console import Console
from rich.table import Table

KEEP = 0.9
"""The share of its MJX return a policy must keep on the other simulators."""
TASKS = ("halfcheetah", "hopper", "ant")
SIMULATORS = ("mjx", "mujoco", "gymnasium")
"""Where every policy is evaluated; the first the benchmark trains on is the reference."""


def evaluate_onnx(path: Path, task: str, backend: str, episodes: int, seed: int,
                  device: str) -> dict[str, float]:
    import robotrl.envs as E
    from robotrl.runners.evaluation import evaluate
    from robotrl.sim2real.verify import onnx_runner

    run = onnx_runner(path.read_bytes())
    options = {"device": device} if backend == "mjx" else {}
    env = E.make(task, episodes, backend=backend, seed=seed, **options)

    def policy(obs: dict[str, torch.Tensor]) -> torch.Tensor:
        x = obs["policy"].detach().cpu().numpy().astype(np.float32)
        return torch.from_numpy(run(x)).to(obs["policy"].device)

    try:
        return evaluate(policy, env, seed=seed)
    finally:
        env.close()


def ratio_se(other: dict[str, float], base: dict[str, float]) -> float:
    """Standard error of mean(other) / mean(base) over independent episodes (delta method).
    The two simulators' resets come from different random streams, so their episodes are
    independent samples; the table prints the ratio +- 2 standard errors."""
    ratio = other["return_mean"] / base["return_mean"]
    rel = [(r["return_std"] / r["return_mean"]) ** 2 / r["episodes"] for r in (other, base)]
    return abs(ratio) * math.sqrt(sum(rel))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--minutes", type=float, default=8.0, help="training budget per task")
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--device", default="cpu", help="mjx's device (cpu or cuda)")
    parser.add_argument("--train-backend", default="mjx", choices=("mjx", "mujoco"),
                        help="the simulator PPO trains on; the others' returns are its shares")
    parser.add_argument("--episodes", type=int, default=64,
                        help="evaluation episodes per simulator (a weak policy falls over in a "
                             "few percent of episodes: 16 cannot tell 90%% from 100%%)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overrides", nargs="*", default=[], help="more `robotrl train` keys")
    parser.add_argument("--runs", default="runs/bench/backend_transfer", help="run directories")
    parser.add_argument("--out", help="the JSON written (default: benchmarks/figures/"
                        "backend_transfer.json, _<train-backend>.json unless mjx)")
    args = parser.parse_args()
    suffix = "" if args.train_backend == "mjx" else f"_{args.train_backend}"
    args.out = args.out or f"benchmarks/figures/backend_transfer{suffix}.json"
    torch.set_num_threads(1)
    console = Console()
    train = args.train_backend
    others = [b for b in SIMULATORS if b != train]
    console.print(banner(f"{train} -> {' / '.join(others)} transfer", f"mjx on {args.device}",
                         f"{args.minutes:g} min x {args.num_envs} worlds per task"))
    rows, checks = {}, []
    for task in args.tasks:
        run = Path(args.runs) / (task if train == "mjx" else f"{task}_{train}")
        device = args.device if train == "mjx" else "cpu"
        overrides = [f"env={task}", f"backend={train}", f"device={device}",
                     f"num_envs={args.num_envs}", f"max_minutes={args.minutes}",
                     f"seed={args.seed}", "total_steps=1000000000", *args.overrides]
        console.print(f"[bold]{task}[/]: training on {train} ({' '.join(overrides)})")
        wall, failed = train_subprocess(overrides, run, task)
        if failed:
            checks.append(check(f"{task}: trained on {train}", None, False))
            continue
        onnx = run / "policy.onnx"
        from robotrl.experiment.export import export_run

        export_run(str(run), "onnx", onnx)
        row = {"train_seconds": wall, "train_backend": train}
        for backend in SIMULATORS:
            row[backend] = evaluate_onnx(onnx, task, backend, args.episodes, args.seed,
                                         args.device)
        rows[task] = row
        base = row[train]["return_mean"]
        for backend in others:
            kept = row[backend]["return_mean"] / base if base > 0 else None
            row[backend]["kept"] = kept
            row[backend]["kept_se"] = None if kept is None else ratio_se(row[backend], row[train])
            checks.append(check(f"{task}: {backend} keeps >= {KEEP:.0%} of the {train} return",
                                kept, None if kept is None else kept >= KEEP))
    table = Table(title=f"ONNX policy trained on {train}, evaluated on three simulators")
    for col in ("task", *SIMULATORS, *(f"{b} / {train}" for b in others)):
        table.add_column(col, justify="right")
    for task, row in rows.items():
        cells = [f"{row[b]['return_mean']:.0f} +- {row[b]['return_std']:.0f}" for b in SIMULATORS]
        kept = [f"{row[b]['kept']:.3f} +- {2 * row[b]['kept_se']:.3f}"
                if row[b]["kept"] is not None else "-" for b in others]
        table.add_row(task, *cells, *kept)
    console.print(table)
    print_checks(console, checks, lambda c: f": {c['value']:.3f}")
    write_json(args.out, {"meta": {**machine_meta(), "argv": sys.argv[1:]}, "rows": rows,
                          "checks": checks}, console)


if __name__ == "__main__":
    main()
