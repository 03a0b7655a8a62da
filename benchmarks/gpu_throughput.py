"""Env-steps/s of the JAX backends (``mjx``, ``brax``) and of PPO end to end on them.

    python benchmarks/gpu_throughput.py                          # on a GPU: the full grid
    python benchmarks/gpu_throughput.py --quick --device cpu     # smoke test
    python benchmarks/gpu_throughput.py --out out.json --profile

* env: ``robotrl.envs.make(task, n, backend, device).step`` with pre-generated uniform actions on
  the device (auto-reset, observations, reward terms included), timed between
  ``torch.cuda.synchronize()`` calls after a warm-up (compilation) of ``--warmup`` steps.
* ppo: ``robotrl.experiment.build.build_runner`` with ``backend.name`` = the backend and
  ``device`` = the learner's device; env-steps/s of whole iterations (collect + update) after the
  first one (compilation), from the runner's ``perf/sps``.
* profile (``--profile``): ``torch.profiler`` over ``--profile-steps`` env steps (and one PPO
  collection) counting device-to-host copies (CUPTI sees JAX's and torch's alike).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
from common import banner, machine_meta, write_json
from rich.console import Console

POOL = 16
"""Pre-generated action batches cycled through."""


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()})"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


LS_ITERATIONS = 0
"""mjx line-search iterations (0: the backend's default); set from --ls-iterations."""


def env_options(backend: str, iterations: int, randomization: str = "none") -> dict[str, Any]:
    """mjx solver settings: ``iterations`` solver iterations (0: the backend's default), and a
    randomization preset (``none``: nominal physics)."""
    out: dict[str, Any] = {"iterations": iterations} if backend == "mjx" and iterations else {}
    if backend == "mjx" and LS_ITERATIONS:
        out["ls_iterations"] = LS_ITERATIONS
    if randomization != "none":
        out["randomization"] = randomization
    return out


def bench_env(backend: str, task: str, n: int, device: torch.device, steps: int, warmup: int,
              repeats: int, iterations: int, randomization: str = "none") -> dict[str, Any]:
    import robotrl.envs as renvs

    t0 = time.perf_counter()
    env = renvs.make(task, n, backend=backend, device=device,
                     **env_options(backend, iterations, randomization))
    gen = torch.Generator(device=device).manual_seed(0)
    low, high = env.spec.action_low.to(device), env.spec.action_high.to(device)
    pool = low + (high - low) * torch.rand(POOL, n, env.spec.action_dim, device=device,
                                           generator=gen)
    for i in range(warmup):
        env.step(pool[i % POOL])
    sync(device)
    build_s = time.perf_counter() - t0
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(steps):
            env.step(pool[i % POOL])
        sync(device)
        rates.append(steps * n / (time.perf_counter() - t0))
    env.close()
    return {"backend": backend, "task": task, "worlds": n, "randomization": randomization,
            "rates": rates, "best": max(rates), "median": statistics.median(rates),
            "build_s": build_s}


def count_d2h(fn: Any, device: torch.device) -> dict[str, Any]:
    """Run ``fn`` under torch.profiler; count device-to-host copies and synchronizations."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        fn()
        sync(device)
    names: dict[str, int] = {}
    for e in prof.events():
        key = e.name
        if "DtoH" in key or "Device -> Pageable" in key or "Device -> Pinned" in key \
                or key in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cuStreamSynchronize",
                           "cudaMemcpy", "cuMemcpyDtoH_v2", "cuMemcpyDtoHAsync_v2"):
            names[key] = names.get(key, 0) + 1
    return names


def profile_env(backend: str, task: str, n: int, device: torch.device, steps: int,
                iterations: int, randomization: str = "none") -> dict[str, Any]:
    import robotrl.envs as renvs

    env = renvs.make(task, n, backend=backend, device=device,
                     **env_options(backend, iterations, randomization))
    action = torch.zeros(n, env.spec.action_dim, device=device)
    for _ in range(3):
        env.step(action)
    sync(device)

    def loop() -> None:
        for _ in range(steps):
            env.step(action)

    found = count_d2h(loop, device)
    env.close()
    return {"backend": backend, "task": task, "worlds": n, "steps": steps,
            "randomization": randomization, "d2h_events": found}


def bench_ppo(backend: str, task: str, n: int, device: torch.device, iters: int, num_steps: int,
              minibatches: int, iterations: int, profile: bool,
              randomization: str = "none") -> dict[str, Any]:
    from robotrl.config import TrainConfig, from_dict, resolve_randomization
    from robotrl.experiment.build import build_runner
    from robotrl.seeding import seed_everything

    with tempfile.TemporaryDirectory() as tmp:
        cfg = from_dict(TrainConfig, {
            "algo": {"name": "ppo", "rollout_steps": num_steps, "num_minibatches": minibatches,
                     "num_epochs": 5, "actor_hidden": [256, 256], "critic_hidden": [256, 256]},
            "env": {"task": task, "options": env_options(backend, iterations)},
            "backend": {"name": backend},
            "logger": {"tensorboard": False, "progress": False, "log_interval": 1},
            "num_envs": n, "total_steps": iters * num_steps * n, "run_dir": tmp,
            "randomization": dataclasses.asdict(resolve_randomization(randomization)),
            "checkpoint_interval": 10**6, "eval_episodes": 1, "device": str(device),
        })
        seed_everything(0)
        runner = build_runner(cfg)
        runner.evaluator = None
        t0 = time.perf_counter()
        runner.train()
        wall = time.perf_counter() - t0
        hist = list(runner.history)
        returns = runner.recent_returns
        sps = [h["perf/sps"] for h in hist[1:]] or [hist[0]["perf/sps"]]
        out: dict[str, Any] = {
            "backend": backend, "task": task, "worlds": n, "iterations": len(hist),
            "randomization": randomization,
            "sps": sps, "median_sps": statistics.median(sps),
            "collect_s": statistics.median(h["perf/collect_s"] for h in hist[1:] or hist),
            "update_s": statistics.median(h["perf/update_s"] for h in hist[1:] or hist),
            "wall_s": wall,
            "final_return": statistics.fmean(returns) if returns else math.nan,
        }
        if profile:
            def collect() -> None:
                with torch.inference_mode():
                    runner.collector.collect(runner.settings.steps_per_env)

            out["collect_d2h_events"] = count_d2h(collect, device)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backends", nargs="+", default=["mjx", "brax"])
    p.add_argument("--tasks", nargs="+", default=["ant", "halfcheetah"])
    p.add_argument("--worlds", nargs="+", type=int)
    p.add_argument("--steps", type=int, default=50, help="timed steps per repeat")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iterations", type=int, default=0,
                   help="mjx solver iterations (0: the backend's default, 1 on GPU)")
    p.add_argument("--ls-iterations", type=int, default=0,
                   help="mjx line-search iterations (0: the backend's default, 8 on GPU)")
    p.add_argument("--randomization", nargs="+", default=["none"],
                   help="presets of configs/randomization/ to time (none: nominal physics)")
    p.add_argument("--env", action=argparse.BooleanOptionalAction, default=True,
                   help="time env.step alone (--no-env: PPO only)")
    p.add_argument("--ppo", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--ppo-task", default="ant")
    p.add_argument("--ppo-envs", type=int, default=8192)
    p.add_argument("--ppo-iters", type=int, default=6)
    p.add_argument("--ppo-steps", type=int, default=16, help="rollout length per iteration")
    p.add_argument("--ppo-minibatches", type=int, default=4)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--profile-steps", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="cpu-sized: 64 worlds, few steps")
    p.add_argument("--out", default="benchmarks/figures/gpu_throughput.json",
                   help="the JSON written, after every measurement (default: %(default)s)")
    p.add_argument("--cache-dir", help="JAX persistent compilation cache (envs of equal shapes, "
                   "e.g. the PPO env and the env benchmark's, then compile once)")
    args = p.parse_args(argv)
    if args.worlds is None:
        args.worlds = [64] if args.quick else [1024, 4096, 8192, 16384, 32768, 65536]
    if args.quick:
        args.steps, args.repeats, args.ppo_envs, args.ppo_iters = 10, 1, 64, 2
    return args


def main(argv: list[str] | None = None) -> int:
    global LS_ITERATIONS
    args = parse_args(argv)
    LS_ITERATIONS = args.ls_iterations
    device = torch.device(args.device)
    torch.set_float32_matmul_precision("high")
    import jax  # after robotrl.envs.jax_bridge set the allocator policy

    import robotrl.envs.jax_bridge  # noqa: F401

    if args.cache_dir:
        jax.config.update("jax_compilation_cache_dir", args.cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

    meta = {**machine_meta(), "device": device_name(device), "jax": jax.__version__,
            "jax_devices": [str(d) for d in jax.devices()],
            "mjx_iterations": args.iterations or "default",
            "mjx_ls_iterations": args.ls_iterations or "default"}
    console = Console()
    console.print(banner("robotrl GPU throughput", meta["device"], f"jax {meta['jax']}",
                         f"solver iterations: {meta['mjx_iterations']}"))
    results: dict[str, Any] = {"meta": meta, "env": [], "ppo": [], "profile": []}
    quiet = Console(quiet=True)

    def dump() -> None:  # after every measurement: a run cut short keeps what it measured
        write_json(args.out, results, quiet)

    for backend in args.backends:
        presets = args.randomization
        for task, preset in [(t, r) for t in args.tasks for r in presets if args.env]:
            label = f"{task}" + ("" if preset == "none" else f" [{preset}]")
            for n in args.worlds:
                try:
                    r = bench_env(backend, task, n, device, args.steps, args.warmup,
                                  args.repeats, args.iterations, preset)
                except Exception as err:  # e.g. out of memory at 64k worlds: report, go on
                    r = {"backend": backend, "task": task, "worlds": n, "randomization": preset,
                         "error": f"{type(err).__name__}: {str(err)[:300]}"}
                results["env"].append(r)
                msg = r.get("error") or (f"{r['best'] / 1e6:.3f}M env-steps/s best, "
                                         f"{r['median'] / 1e6:.3f}M median "
                                         f"(build+compile {r['build_s']:.0f} s)")
                print(f"env  {backend:5s} {label:25s} {n:6d} worlds: {msg}", flush=True)
                dump()
            if args.profile:
                p = profile_env(backend, task, args.worlds[0] if args.quick else 8192, device,
                                args.profile_steps, args.iterations, preset)
                results["profile"].append(p)
                print(f"prof {backend:5s} {label:25s}: device-to-host events in "
                      f"{p['steps']} env steps: {p['d2h_events'] or 'none'}", flush=True)
                dump()
        for preset in presets if args.ppo else []:
            try:
                r = bench_ppo(backend, args.ppo_task, args.ppo_envs, device, args.ppo_iters,
                              args.ppo_steps, args.ppo_minibatches, args.iterations, args.profile,
                              preset)
            except Exception as err:
                r = {"backend": backend, "randomization": preset,
                     "error": f"{type(err).__name__}: {str(err)[:300]}"}
            results["ppo"].append(r)
            msg = r.get("error") or (
                f"{r['median_sps'] / 1e3:.0f}k env-steps/s median (collect {r['collect_s']:.2f} s"
                f", update {r['update_s']:.2f} s per iteration), {r['iterations']} iterations")
            label = "" if preset == "none" else f" [{preset}]"
            print(f"ppo  {backend:5s} {args.ppo_task}{label} x {args.ppo_envs}: {msg}", flush=True)
            if "collect_d2h_events" in r:
                print(f"prof ppo collect ({args.ppo_steps} steps): "
                      f"{r['collect_d2h_events'] or 'none'}", flush=True)
            dump()
    write_json(args.out, results, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
