"""Env-steps/s of robotrl's native MuJoCo envs next to raw MuJoCo and the usual vector envs.

    python benchmarks/env_throughput.py                   # 3 tasks x 64/256/1024 worlds
    python benchmarks/env_throughput.py --quick           # smoke test: halfcheetah, 64 worlds
    python benchmarks/env_throughput.py --tasks ant --worlds 256 --seconds 1 --out out.json
    python benchmarks/env_throughput.py --tasks gymnasium --worlds 256 --no-peers   # every task

Every contestant steps the same pre-generated uniform actions in [-1, 1]; each is timed
``--repeats`` times, the contestants of a task interleaved so that a burst of load from other
processes hits them all alike; we report the best repeat (least time) and the median.

* ``ours``: ``robotrl.envs.make(task, n).step`` with auto-reset, observations, reward terms.
* ``Batch.step``: the same ``mujoco.batch.Batch`` (threads, persistence) stepped ``frame_skip``
  substeps with controls written in and no task layer: our engine alone.
* ``mujoco.rollout``: the physics-only ceiling, on the same MjModel, threads and world count,
  ``nstep = frame_skip * ROLLOUT_CHUNK`` per call, each control held for ``frame_skip`` substeps.
* Gymnasium ``SyncVectorEnv`` / ``AsyncVectorEnv``, SB3 ``DummyVecEnv`` / ``SubprocVecEnv`` of
  the ``*-v5`` env, with a fixed number of sub-envs (their throughput does not grow with the
  world count, so each is timed once per task and shown next to every world count).

Why each choice was made is in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from common import (
    CORES,
    banner,
    best_median,
    check,
    machine_meta,
    print_checks,
    write_json,
)
from env_contestants import (
    POOL,
    ROLLOUT_CHUNK,
    BatchStep,
    Contestant,
    Ours,
    RawRollout,
    VecPeer,
    action_pool,
    gym_vector,
    sb3_vector,
)
from rich.console import Console
from rich.table import Table

GIB = 1 << 30
TARGET_ROLLOUT, TARGET_VEC, TARGET_RSS = 0.95, 2.0, 2 * GIB
"""Targets: ours/rollout (medians) on every task and world count measured; ours/fastest vector
env at 256 HalfCheetah worlds; peak RSS."""
GYMNASIUM = ["halfcheetah", "hopper", "walker2d", "ant", "humanoid", "swimmer", "reacher",
             "inverted_pendulum", "inverted_double_pendulum"]
"""``--tasks gymnasium``: the tasks that reproduce a Gymnasium MuJoCo ``*-v5`` env."""


def peers(args: argparse.Namespace) -> dict[str, tuple[Any, int, bool]]:
    """Row label -> (factory(gym_id, k, subprocess_envs), k, subprocess_envs) of each peer."""
    return {
        f"Gymnasium Sync x{args.sync_envs}": (gym_vector, args.sync_envs, False),
        f"Gymnasium Async x{args.async_envs}": (gym_vector, args.async_envs, True),
        f"SB3 Dummy x{args.sync_envs}": (sb3_vector, args.sync_envs, False),
        f"SB3 Subproc x{args.async_envs}": (sb3_vector, args.async_envs, True),
    }


def time_once(c: Contestant, seconds: float) -> float:
    """Env-steps/s of ``c`` over at least ``seconds`` of wall time."""
    steps, t0 = 0, time.perf_counter()
    while True:
        steps += c.step()
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return steps / dt


def bench_task(task: str, args: argparse.Namespace, console: Console) -> dict[str, Any] | None:
    """Time every contestant on ``task``; rates[label][worlds or "vec"] = [env-steps/s per repeat]."""
    from robotrl.envs.registry import task_class

    try:
        cls = task_class(task)
    except (ImportError, AttributeError, ValueError) as err:
        console.print(f"[yellow]skip task {task}: not available ({err})[/]")
        return None
    gym_id = cls.gym_id
    act_dim = cls.load_model().nu
    timed: list[tuple[str, str, Contestant]] = []
    for label, (factory, k, sub) in (peers(args) if args.peers else {}).items():
        try:
            timed.append((label, "vec", VecPeer(factory(gym_id, k, sub), k,
                                                action_pool(k, act_dim))))
        except ImportError as err:
            package = (err.name or str(err)).split(".")[0]
            console.print(f"[yellow]skip {label}: package {package} missing[/]")
        except Exception as err:  # e.g. gymnasium.error.NameNotFound for an unregistered id
            console.print(f"[yellow]skip {label} on {gym_id}: {type(err).__name__}: {err}[/]")
    threads = 0
    rates: dict[str, dict[str, list[float]]] = {}
    try:
        for n in args.worlds:
            ours = Ours(task, n)
            threads = ours.env.batch.nthread
            timed += [("ours", str(n), ours), ("Batch.step", str(n), BatchStep(ours)),
                      ("mujoco.rollout", str(n), RawRollout(ours))]
        for _, _, c in timed:  # warm-up: first calls pay for page faults and thread start-up
            time_once(c, min(0.2, args.seconds))
        for r in range(args.repeats):
            console.print(f"[dim]{task} ({gym_id}): repeat {r + 1}/{args.repeats}[/]")
            for label, key, c in timed:
                rates.setdefault(label, {}).setdefault(key, []).append(time_once(c, args.seconds))
    finally:
        for _, _, c in timed:
            c.close()
    return {"gym_id": gym_id, "threads": threads, "rates": rates}


def ratios(res: dict[str, Any], n: str) -> dict[str, float | None]:
    """ours / mujoco.rollout, ours / Batch.step, ours / fastest vector env; by best repeats
    (``ours/rollout_median``: by medians, the repeats interleaved)."""
    best = {label: max(v.get(n, v.get("vec", [0.0]))) for label, v in res["rates"].items()}
    median = {label: statistics.median(v.get(n, v.get("vec", [0.0])))
              for label, v in res["rates"].items()}
    ours = best.get("ours", 0.0)
    vec = [v for label, v in best.items() if "vec" in res["rates"][label]]
    return {
        "ours/rollout": ours / best["mujoco.rollout"] if best.get("mujoco.rollout") else None,
        "ours/rollout_median": (median["ours"] / median["mujoco.rollout"]
                                if median.get("mujoco.rollout") and "ours" in median else None),
        "ours/Batch.step": ours / best["Batch.step"] if best.get("Batch.step") else None,
        "ours/fastest_vec": ours / max(vec) if vec else None,
    }


def fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def print_table(task: str, res: dict[str, Any], worlds: list[str], console: Console) -> None:
    table = Table(title=f"{task} ({res['gym_id']}), {res['threads']} threads",
                  caption="env-steps/s: best / median of repeats")
    table.add_column("contestant")
    for n in worlds:
        table.add_column(f"{n} worlds", justify="right")
    for label, by_key in res["rates"].items():
        mark = " †" if "vec" in by_key else ""
        cells = []
        for n in worlds:
            s = best_median(by_key.get(n, by_key.get("vec", [])) or [0.0])
            cells.append(f"{fmt_rate(s['best'])} / {fmt_rate(s['median'])}")
        table.add_row(label + mark, *cells)
    table.add_section()
    for key in ("ours/rollout", "ours/rollout_median", "ours/Batch.step", "ours/fastest_vec"):
        vals = [ratios(res, n)[key] for n in worlds]
        table.add_row(key, *(f"{v:.2f}x" if v is not None else "-" for v in vals))
    console.print(table)


_RSS_CHILD = """
import json, resource, sys, torch
import robotrl.envs as renvs
def hwm():
    try:
        with open('/proc/self/status') as f:
            return next(int(l.split()[1]) for l in f if l.startswith('VmHWM:'))
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
task, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
base = hwm()
env = renvs.make(task, n)
gen = torch.Generator().manual_seed(0)
for _ in range(steps):
    env.step(torch.rand(n, env.spec.action_dim, generator=gen) * 2 - 1)
print(json.dumps({"import_kib": base, "peak_kib": hwm()}))
"""


def peak_rss(task: str, n: int, steps: int) -> dict[str, Any]:
    """Peak resident memory of a fresh process that makes ``n`` worlds and steps them."""
    proc = subprocess.run([sys.executable, "-c", _RSS_CHILD, task, str(n), str(steps)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"task": task, "worlds": n, "steps": steps,
            "import_bytes": out["import_kib"] * 1024, "peak_bytes": out["peak_kib"] * 1024}


def checks(results: dict[str, Any], rss: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The PASS/FAIL targets; a target whose figure was not measured is SKIP."""
    out: list[dict[str, Any]] = []
    for task, res in results.items():
        for n in res["rates"].get("ours", {}):
            v = ratios(res, n)["ours/rollout_median"]
            out.append(check(f"{task}@{n} ours/rollout (medians) >= {TARGET_ROLLOUT}x", v,
                             None if v is None else v >= TARGET_ROLLOUT))
    hc = results.get("halfcheetah")
    v = ratios(hc, "256")["ours/fastest_vec"] if hc and "256" in hc["rates"].get("ours", {}) \
        else None
    out.append(check(f"halfcheetah@256 ours/fastest_vec >= {TARGET_VEC}x", v,
                     None if v is None else v >= TARGET_VEC))
    v = rss["peak_bytes"] if rss else None
    name = f"{rss['task']}@{rss['worlds']}" if rss else "humanoid@1024"
    out.append(check(f"{name} peak RSS < 2 GiB", v, None if v is None else v < TARGET_RSS))
    return out


def measure_rss(args: argparse.Namespace, console: Console) -> dict[str, Any] | None:
    """Run ``peak_rss`` for ``--rss-task`` and print it; None (with a message) if it cannot."""
    from robotrl.envs.registry import task_class

    try:
        task_class(args.rss_task)
    except (ImportError, AttributeError, ValueError) as err:
        console.print(f"[yellow]skip peak RSS: task {args.rss_task} not available ({err})[/]")
        return None
    rss = peak_rss(args.rss_task, args.rss_worlds, args.rss_steps)
    if "error" in rss:
        console.print(f"[red]peak RSS measurement failed: {rss['error']}[/]")
        return None
    console.print(
        f"peak RSS of ours, {args.rss_task} x {args.rss_worlds} worlds after {args.rss_steps} "
        f"steps (fresh process, VmHWM): {rss['peak_bytes'] / GIB:.3f} GiB "
        f"({rss['import_bytes'] / GIB:.3f} GiB of it after imports alone)"
    )
    return rss


def figures(args: argparse.Namespace, results: dict[str, Any], rss: dict[str, Any] | None,
            verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    """Every repeat, best/median, ratios, RSS and checks, with the machine and settings."""
    meta = {**machine_meta(), "seconds": args.seconds, "repeats": args.repeats, "pool": POOL,
            "rollout_chunk": ROLLOUT_CHUNK, "sync_envs": args.sync_envs,
            "async_envs": args.async_envs}
    out = {}
    for task, res in results.items():
        out[task] = {
            **res,
            "summary": {label: {k: best_median(v) for k, v in by_key.items()}
                        for label, by_key in res["rates"].items()},
            "ratios": {n: ratios(res, n) for n in map(str, args.worlds)},
        }
    return {"meta": meta, "results": out, "rss": rss, "checks": verdicts}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tasks", nargs="+", help="registry names (default: halfcheetah ant humanoid)")
    p.add_argument("--worlds", nargs="+", type=int, help="world counts (default: 64 256 1024)")
    p.add_argument("--seconds", type=float, help="wall time per measurement (default: 2)")
    p.add_argument("--repeats", type=int, help="measurements per contestant (default: 5)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: halfcheetah, 64 worlds, 0.3 s x 2, no RSS check")
    p.add_argument("--out", default="benchmarks/figures/env_throughput.json",
                   help="the JSON of every figure (default: %(default)s)")
    p.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True,
                   help="time Gymnasium's and SB3's vector envs too")
    p.add_argument("--sync-envs", type=int, default=16, help="sub-envs of the in-process peers")
    p.add_argument("--async-envs", type=int, default=CORES,
                   help=f"sub-envs of the subprocess peers (default: cores = {CORES})")
    p.add_argument("--rss", action=argparse.BooleanOptionalAction, default=None,
                   help="measure peak RSS of ours in a fresh process (default: on unless --quick)")
    p.add_argument("--rss-task", default="humanoid")
    p.add_argument("--rss-worlds", type=int, default=1024)
    p.add_argument("--rss-steps", type=int, default=50, help="steps taken before reading VmHWM")
    args = p.parse_args(argv)
    quick = {"tasks": ["halfcheetah"], "worlds": [64], "seconds": 0.3, "repeats": 2, "rss": False}
    full = {"tasks": ["halfcheetah", "ant", "humanoid"], "worlds": [64, 256, 1024],
            "seconds": 2.0, "repeats": 5, "rss": True}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.tasks = [t for name in args.tasks for t in (GYMNASIUM if name == "gymnasium" else [name])]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=max(Console().width, 100))
    worlds = [str(n) for n in args.worlds]
    console.print(banner("robotrl env throughput", f"{args.seconds} s x {args.repeats} repeats",
                         f"actions: {POOL} pre-generated batches, uniform [-1, 1]"))
    results: dict[str, Any] = {}
    for task in args.tasks:
        res = bench_task(task, args, console)
        if res is not None:
            results[task] = res
            print_table(task, res, worlds, console)
    if results:
        console.print(
            f"† vector envs have a fixed number of sub-envs ({args.sync_envs} in-process, "
            f"{args.async_envs} subprocess = cores): their throughput does not grow with the "
            "world count, so each is timed once per task and shown in every column.\n"
            f"mujoco.rollout: {ROLLOUT_CHUNK} control steps per call; it and Batch.step restart "
            f"from reset states every {ROLLOUT_CHUNK} steps. Ratios use best repeats."
        )
    rss = measure_rss(args, console) if args.rss else None
    verdicts = checks(results, rss)
    print_checks(console, verdicts, lambda c: f" ({c['value'] / GIB:.3f} GiB)"
                 if "RSS" in c["name"] else f" ({c['value']:.2f}x)")
    write_json(args.out, figures(args, results, rss, verdicts), console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
