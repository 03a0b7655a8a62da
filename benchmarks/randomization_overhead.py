"""Env-steps/s of the native backend with and without domain randomization.

    python benchmarks/randomization_overhead.py                  # hopper, halfcheetah; 256 worlds
    python benchmarks/randomization_overhead.py --steps 100 --repeats 3 --out out.json

Each task is stepped with the same pre-generated uniform actions, nominal (``randomization``
none) and with the ``locomotion`` preset (every world redraws masses, inertias, friction,
damping, armature, gains, gravity and COM at each episode start, followed by ``set_const``;
observation and action noise, 0-1 step action delay and pushes every step). Short episodes
(``--episode-steps``, default 100) make resets, and so resampling, frequent: 1% of the worlds
redraw per step, 10x Gymnasium's 1000-step episodes. The two variants are interleaved per repeat
so load from other processes hits both alike; we print the best (min time) and the median
throughput and their ratio. Target: randomization costs <= 15% of the throughput.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import banner, machine_meta, write_json
from rich.console import Console
from rich.table import Table

import robotrl.envs as E

TARGET = 0.15
"""Largest allowed throughput cost of the locomotion preset."""


def time_steps(env: E.BatchedEnv, actions: list[torch.Tensor], steps: int) -> float:
    """Seconds to take ``steps`` steps of ``env``, cycling through ``actions``."""
    start = time.perf_counter()
    for t in range(steps):
        env.step(actions[t % len(actions)])
    return time.perf_counter() - start


def bench(task: str, worlds: int, steps: int, repeats: int, episode_steps: int,
          threads: int) -> dict[str, dict[str, float]]:
    """{variant: {"best": steps/s, "median": steps/s}} for variants "none" and "locomotion"."""
    envs = {name: E.make(task, worlds, num_threads=threads, randomization=name,
                         max_episode_steps=episode_steps) for name in ("none", "locomotion")}
    act_dim = envs["none"].spec.action_dim
    gen = torch.Generator().manual_seed(0)
    actions = [torch.rand(worlds, act_dim, generator=gen) * 2 - 1 for _ in range(40)]
    times: dict[str, list[float]] = {name: [] for name in envs}
    for env in envs.values():
        time_steps(env, actions, 20)  # warm up: bind fields, expand model fields
    for _ in range(repeats):
        for name, env in envs.items():
            times[name].append(time_steps(env, actions, steps))
    total = worlds * steps
    return {name: {"best": total / min(t), "median": total / statistics.median(t)}
            for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["hopper", "halfcheetah"])
    parser.add_argument("--worlds", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200, help="control steps per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--episode-steps", type=int, default=100)
    parser.add_argument("--threads", type=int, default=0, help="simulation threads (0: all)")
    parser.add_argument("--out", default="benchmarks/figures/randomization_overhead.json",
                        help="the JSON written (default: %(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    console = Console()
    console.print(banner("randomization overhead", f"{args.worlds} worlds",
                         f"{args.episode_steps}-step episodes"))
    table = Table(title=f"randomization overhead, {args.worlds} worlds, min/median of "
                        f"{args.repeats} x {args.steps} steps")
    for col in ("task", "none steps/s", "locomotion steps/s", "cost (best)", "cost (median)",
                f"<= {TARGET:.0%}"):
        table.add_column(col, justify="right")
    results = {}
    for task in args.tasks:
        r = bench(task, args.worlds, args.steps, args.repeats, args.episode_steps, args.threads)
        cost_best = 1 - r["locomotion"]["best"] / r["none"]["best"]
        cost_median = 1 - r["locomotion"]["median"] / r["none"]["median"]
        results[task] = {**r, "cost_best": cost_best, "cost_median": cost_median}
        table.add_row(task, f"{r['none']['best']:,.0f} / {r['none']['median']:,.0f}",
                      f"{r['locomotion']['best']:,.0f} / {r['locomotion']['median']:,.0f}",
                      f"{cost_best:.1%}", f"{cost_median:.1%}",
                      "PASS" if cost_best <= TARGET else "FAIL")
    console.print(table)
    write_json(args.out, {"meta": machine_meta(), "worlds": args.worlds, "steps": args.steps,
                          "repeats": args.repeats, "episode_steps": args.episode_steps,
                          "results": results}, console)


if __name__ == "__main__":
    main()
