"""Env-steps/s of robotrl's native MuJoCo envs next to raw MuJoCo and the usual vector envs.

    python benchmarks/env_throughput.py                   # 3 tasks x 64/256/1024 worlds
    python benchmarks/env_throughput.py --quick           # smoke test: halfcheetah, 64 worlds
    python benchmarks/env_throughput.py --tasks ant --worlds 256 --seconds 1 --json out.json

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
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Protocol

import mujoco
import mujoco.rollout
import numpy as np
import torch
from mujoco.batch import Batch, SimulationError
from rich.console import Console
from rich.table import Table

POOL = 40
"""Pre-generated action batches each contestant cycles through."""
ROLLOUT_CHUNK = 20
"""Control steps per ``mujoco.rollout`` call, and between restarts of the two physics baselines."""
GIB = 1 << 30
TARGET_ROLLOUT, TARGET_VEC, TARGET_RSS = 0.85, 2.0, 2 * GIB
"""Targets: ours/rollout and ours/fastest vector env at 256 HalfCheetah worlds; peak RSS."""
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo, else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def warn_if_loaded(console: Console) -> float:
    """The 1-minute load average; says so when other processes already load the cores (the
    timings would not be representative)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > 0.5:
        console.print(f"[yellow]load average {load:.1f} before starting: other processes share "
                      "the cores, so the timings are not representative[/]")
    return load


def action_pool(n: int, act_dim: int, seed: int = 0) -> np.ndarray:
    """[POOL, n, act_dim] float32 uniform in [-1, 1]; the same seed gives every contestant the same."""
    return np.random.default_rng(seed).uniform(-1, 1, (POOL, n, act_dim)).astype(np.float32)


class Contestant(Protocol):
    def step(self) -> int:
        """Do one unit of work; return the env-steps it made."""

    def close(self) -> None: ...


class Ours:
    """``robotrl.envs.make(task, n)`` stepped with auto-reset."""

    def __init__(self, task: str, n: int) -> None:
        import robotrl.envs as renvs

        self.env = renvs.make(task, n)
        # fresh samples of the reset distribution, where the physics baselines restart every
        # ROLLOUT_CHUNK steps: they have no resets, and a fallen Humanoid left on the floor
        # costs twice the physics of a standing one (random actions end its episodes in ~24)
        self.reset_rows = self.env.batch.state.copy()
        self.reset_state = self.env.get_state().cpu().numpy().copy()  # mjSTATE_FULLPHYSICS
        self.n, self.i = n, 0
        self.actions = torch.from_numpy(action_pool(n, self.env.spec.action_dim))

    def step(self) -> int:
        self.env.step(self.actions[self.i % POOL])
        self.i += 1
        return self.n

    def close(self) -> None:
        self.env.close()


class BatchStep:
    """A copy of ours' ``Batch`` (same threads and persistence) stepped with no task layer.

    Restarts from ours' reset states every ``ROLLOUT_CHUNK`` steps, as ``RawRollout`` does.
    """

    def __init__(self, ours: Ours) -> None:
        src = ours.env.batch
        self.batch = Batch(ours.env.model, src.nsim, src.nthread, persistent=src.persistent)
        self.rows = ours.reset_rows
        self.ctrl = self.batch.bind("ctrl")
        self.frame_skip = ours.env.task.frame_skip
        self.actions = action_pool(src.nsim, ours.env.model.nu)
        self.n, self.i = src.nsim, 0

    def step(self) -> int:
        if self.i % ROLLOUT_CHUNK == 0:
            self.batch.state[:] = self.rows
        self.ctrl[:] = self.actions[self.i % POOL]
        self.i += 1
        try:
            self.batch.step(nstep=self.frame_skip)
        except SimulationError:
            pass  # those worlds kept their state; the benchmark goes on
        return self.n

    def close(self) -> None:
        pass


class RawRollout:
    """``mujoco.rollout.Rollout``: the physics-only ceiling on the same model and threads.

    Each call runs ``ROLLOUT_CHUNK`` control steps from ours' reset states.
    """

    def __init__(self, ours: Ours) -> None:
        env = ours.env
        model, n, fs = env.model, env.num_envs, env.task.frame_skip
        nthread = env.batch.nthread
        self.runner = mujoco.rollout.Rollout(nthread=nthread if nthread > 1 else 0)
        self.data = [mujoco.MjData(model) for _ in range(max(nthread, 1))]
        self.models = [model] * n
        self.nstep = fs * ROLLOUT_CHUNK
        self.initial = np.ascontiguousarray(ours.reset_state)
        acts = action_pool(n, model.nu).astype(np.float64).transpose(1, 0, 2)  # [n, POOL, nu]
        self.controls = [  # [n, nstep, nu]: each control step's action held for fs substeps
            np.ascontiguousarray(np.repeat(acts[:, k:k + ROLLOUT_CHUNK], fs, axis=1))
            for k in range(0, POOL - ROLLOUT_CHUNK + 1, ROLLOUT_CHUNK)
        ]
        self.state = np.empty((n, self.nstep, self.initial.shape[1]))
        self.sensordata = np.empty((n, self.nstep, model.nsensordata))
        self.n, self.i = n, 0

    def step(self) -> int:
        self.runner.rollout(
            self.models, self.data, self.initial, self.controls[self.i % len(self.controls)],
            skip_checks=True, nstep=self.nstep, state=self.state, sensordata=self.sensordata,
        )
        self.i += 1
        return self.n * ROLLOUT_CHUNK

    def close(self) -> None:
        self.runner.close()


class VecPeer:
    """A Gymnasium or SB3 vector env of ``k`` sub-envs, stepped with numpy actions."""

    def __init__(self, env: Any, k: int, act_dim: int) -> None:
        self.env, self.k, self.i = env, k, 0
        self.actions = action_pool(k, act_dim)

    def step(self) -> int:
        self.env.step(self.actions[self.i % POOL])
        self.i += 1
        return self.k

    def close(self) -> None:
        self.env.close()


def gym_vector(gym_id: str, k: int, subprocess_envs: bool) -> Any:
    import gymnasium as gym

    fns = [functools.partial(gym.make, gym_id)] * k
    same_step = gym.vector.AutoresetMode.SAME_STEP
    # forkserver, as SB3's default: forking a process that runs thread pools is unsafe
    if subprocess_envs:
        env = gym.vector.AsyncVectorEnv(fns, autoreset_mode=same_step, context="forkserver")
    else:
        env = gym.vector.SyncVectorEnv(fns, autoreset_mode=same_step)
    env.reset(seed=0)
    return env


def sb3_vector(gym_id: str, k: int, subprocess_envs: bool) -> Any:
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    fns = [functools.partial(gym.make, gym_id)] * k
    env = SubprocVecEnv(fns, start_method="forkserver") if subprocess_envs else DummyVecEnv(fns)
    env.seed(0)
    env.reset()
    return env


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
    for label, (factory, k, sub) in peers(args).items():
        try:
            timed.append((label, "vec", VecPeer(factory(gym_id, k, sub), k, act_dim)))
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


def summary(rates: list[float]) -> dict[str, float]:
    return {"best": max(rates), "median": statistics.median(rates)}


def ratios(res: dict[str, Any], n: str) -> dict[str, float | None]:
    """ours / mujoco.rollout, ours / Batch.step, ours / fastest vector env; by best repeats."""
    best = {label: max(v.get(n, v.get("vec", [0.0]))) for label, v in res["rates"].items()}
    ours = best.get("ours", 0.0)
    vec = [v for label, v in best.items() if "vec" in res["rates"][label]]
    return {
        "ours/rollout": ours / best["mujoco.rollout"] if best.get("mujoco.rollout") else None,
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
            s = summary(by_key.get(n, by_key.get("vec", [])) or [0.0])
            cells.append(f"{fmt_rate(s['best'])} / {fmt_rate(s['median'])}")
        table.add_row(label + mark, *cells)
    table.add_section()
    for key in ("ours/rollout", "ours/Batch.step", "ours/fastest_vec"):
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
    hc = results.get("halfcheetah")
    r = ratios(hc, "256") if hc and "256" in hc["rates"].get("ours", {}) else {}
    for key, target in (("ours/rollout", TARGET_ROLLOUT), ("ours/fastest_vec", TARGET_VEC)):
        v = r.get(key)
        out.append({"name": f"halfcheetah@256 {key} >= {target}x", "value": v,
                    "status": "SKIP" if v is None else "PASS" if v >= target else "FAIL"})
    v = rss["peak_bytes"] if rss else None
    name = f"{rss['task']}@{rss['worlds']}" if rss else "humanoid@1024"
    out.append({"name": f"{name} peak RSS < 2 GiB", "value": v,
                "status": "SKIP" if v is None else "PASS" if v < TARGET_RSS else "FAIL"})
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


def write_json(path: str, args: argparse.Namespace, results: dict[str, Any],
               rss: dict[str, Any] | None, verdicts: list[dict[str, Any]]) -> None:
    """Every repeat, best/median, ratios, RSS and checks, with the machine and settings."""
    meta = {"cores": CORES, "cpu": cpu_name(), "mujoco": mujoco.__version__,
            "torch": torch.__version__, "python": platform.python_version(),
            "seconds": args.seconds, "repeats": args.repeats, "pool": POOL,
            "rollout_chunk": ROLLOUT_CHUNK, "sync_envs": args.sync_envs,
            "async_envs": args.async_envs}
    out = {}
    for task, res in results.items():
        out[task] = {
            **res,
            "summary": {label: {k: summary(v) for k, v in by_key.items()}
                        for label, by_key in res["rates"].items()},
            "ratios": {n: ratios(res, n) for n in map(str, args.worlds)},
        }
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": out, "rss": rss, "checks": verdicts}, f, indent=2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tasks", nargs="+", help="registry names (default: halfcheetah ant humanoid)")
    p.add_argument("--worlds", nargs="+", type=int, help="world counts (default: 64 256 1024)")
    p.add_argument("--seconds", type=float, help="wall time per measurement (default: 2)")
    p.add_argument("--repeats", type=int, help="measurements per contestant (default: 5)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: halfcheetah, 64 worlds, 0.3 s x 2, no RSS check")
    p.add_argument("--json", metavar="FILE", help="write every figure to FILE")
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
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=max(Console().width, 100))
    worlds = [str(n) for n in args.worlds]
    console.print(
        f"robotrl env throughput | {cpu_name()}, {CORES} cores | "
        f"mujoco {mujoco.__version__}, torch {torch.__version__} | {args.seconds} s x "
        f"{args.repeats} repeats | actions: {POOL} pre-generated batches, uniform [-1, 1]"
    )
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
    for c in verdicts:
        value = "" if c["value"] is None else (
            f" ({c['value'] / GIB:.3f} GiB)" if "RSS" in c["name"] else f" ({c['value']:.2f}x)")
        colour = {"PASS": "green", "FAIL": "red", "SKIP": "yellow"}[c["status"]]
        console.print(f"[{colour}]{c['status']}[/] {c['name']}{value}")
    if args.json:
        write_json(args.json, args, results, rss, verdicts)
        console.print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
