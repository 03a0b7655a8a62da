"""Float32 dense layers on the CPU: torch's BLAS against oneDNN (``robotrl.nn.linear``).

    python benchmarks/cpu_linear.py                  # one thread; products, then updates
    python benchmarks/cpu_linear.py --threads 2     # as off-policy runs use both cores here

Torch sends float32 CPU products to MKL, which runs its AVX2 kernels on AMD CPUs even where
they have AVX-512; oneDNN, in the same wheel, does not. That pays only where AVX-512 runs at
full width (Zen 5); on Zen 4 both reach the same peak (``robotrl.nn.linear``). Preloaded,
``benchmarks/mkl_intel_path.c`` makes MKL run its Intel (AVX-512) kernels on AMD too, and the
default is then BLAS: ``LD_PRELOAD=.../libmkl_intel_path.so python benchmarks/cpu_linear.py``
measures that case (``cc -shared -fPIC -o libmkl_intel_path.so benchmarks/mkl_intel_path.c``). Two
measurements, both choices in one process, interleaved, median of ``--repeats`` rounds
(``ROBOTRL_CPU_LINEAR`` switched between rounds):

* ``products``: GFLOP/s of one product ``[B, in] x [in, out]``, forward (``F.linear`` against
  oneDNN's linear) and the two backward products, with NumPy's BLAS (OpenBLAS in its wheels) as
  a third reference;
* ``updates``: what the switch buys a whole update (networks, losses, optimizer): a PPO
  minibatch (``ppo_loss`` forward + backward, the default networks, minibatch 512, Hopper's
  shapes), SAC updates (256x256 actor and twin critics, batch 256, HalfCheetah; as
  ``sac_bench.py``), CRL updates at depth 16 (width 256, batch 256; as ``crl_depth.py``) and
  CQL updates (its defaults: 3x256 actor and twin critics, batch 256, 10 actions from each of
  3 proposals a state; HalfCheetah's shapes, synthetic transitions).

OpenMP's wait policy is left as the environment sets it (a run's own): with ``--threads 2``
``OMP_WAIT_POLICY=PASSIVE`` makes every parallel region wake a sleeping thread, which costs
whole updates more than either product choice saves. The product table is a one-thread figure:
with two threads its small products do not split and NumPy's own threads compete.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from common import banner, check, machine_meta, print_checks, synthetic_dataset, write_json
from rich.console import Console
from rich.table import Table
from torch.nn import functional as F

import robotrl.envs
from robotrl.nn import linear as lin

console = Console()
SHAPES = ((512, 64, 64), (512, 128, 128), (256, 256, 256), (512, 256, 256), (4096, 256, 256))
"""(batch, in, out) of the product table: PPO's, SAC's and CRL's layers."""


def use(backend: str) -> None:
    os.environ["ROBOTRL_CPU_LINEAR"] = backend
    lin.onednn_enabled.cache_clear()


def seconds_per_call(fn: Callable[[], Any], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def contestants(b: int, i: int, o: int) -> dict[str, Callable[[], Any]]:
    """The products of one ``[b, i] x [i, o]`` layer, forward and backward, per choice."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(b, i, generator=g), torch.randn(o, i, generator=g)
    grad = torch.randn(b, o, generator=g)
    xn, wn = x.numpy(), w.t().contiguous().numpy()
    return {
        "blas forward": lambda: F.linear(x, w),
        "onednn forward": lambda: lin._product(x, w, None),
        "blas input grad": lambda: grad @ w,
        "onednn input grad": lambda: lin._product(grad, w.t(), None),
        "blas weight grad": lambda: grad.t() @ x,
        "onednn weight grad": lambda: lin._product(grad.t(), x.t(), None),
        "numpy forward": lambda: xn @ wn,
    }


def products(repeats: int) -> list[dict[str, Any]]:
    rows = []
    for b, i, o in SHAPES:
        fns = contestants(b, i, o)
        flop = 2 * b * i * o
        calls = max(5, int(2e9 / flop))  # ~10-20 ms per timing
        times: dict[str, list[float]] = {k: [] for k in fns}
        for fn in fns.values():
            seconds_per_call(fn, 3)  # warm-up
        for _ in range(repeats):
            for name, fn in fns.items():
                times[name].append(seconds_per_call(fn, calls))
        rate = {k: flop / statistics.median(v) / 1e9 for k, v in times.items()}
        rows.append({"batch": b, "in": i, "out": o, "gflops": rate})
    return rows


def ppo_minibatch() -> Callable[[], None]:
    from robotrl.algos.ppo import PPOConfig, ppo_loss
    from robotrl.nn.policy import GaussianActorCritic

    cfg, n = PPOConfig(), 512
    policy = GaussianActorCritic(11, 3, actor_hidden=cfg.actor_hidden,
                                 critic_hidden=cfg.critic_hidden, activation=cfg.activation)
    g = torch.Generator().manual_seed(0)
    batch = {k: torch.randn(n, generator=g) for k in ("log_prob", "value", "advantages", "returns")}
    batch["obs"], batch["action"] = torch.randn(n, 11, generator=g), torch.randn(n, 3, generator=g)

    def step() -> None:
        policy.zero_grad(set_to_none=True)
        ppo_loss(policy, batch, cfg)[0].backward()
    return step


def sac_updates(k: int) -> Callable[[], None]:
    from robotrl.algos.sac import SAC, SACConfig

    env = robotrl.envs.make("halfcheetah", 16, seed=0)
    cfg = SACConfig(batch_size=256, actor_hidden=(256, 256), critic_hidden=(256, 256),
                    learning_starts=2048, buffer_size=10_000)
    alg = SAC(env.spec.obs_dim, env.spec.action_low, env.spec.action_high, 16, cfg, seed=0)
    obs = env.reset(seed=0)
    while alg.transitions < cfg.learning_starts:
        out = env.step(alg.act(obs))
        alg.process_env_step(out.reward, out.terminated, out.truncated, out.info["final_obs"])
        obs = out.obs

    def step() -> None:
        alg.owed_updates = k
        alg.update()
    return step


def crl_updates(k: int, depth: int) -> Callable[[], None]:
    from robotrl.algos.crl import CRL, CRLConfig

    env = robotrl.envs.make("reacher_goal", 64, seed=0)
    cfg = CRLConfig(critic_depth=depth, actor_depth=depth, critic_width=256, actor_width=256,
                    batch_size=256, learning_starts=10**9)
    alg = CRL(env.spec, cfg, 64, seed=0)
    obs = env.reset(seed=0)
    for _ in range(100):
        out = env.step(alg.act(obs))
        alg.process_env_step(out.reward, out.terminated, out.truncated, out.info["final_obs"])
        obs = out.obs

    def step() -> None:
        alg.owed_updates = float(k)
        alg.update()
    return step


def cql_updates(k: int) -> Callable[[], None]:
    from robotrl.algos.offline.cql import CQL, CQLConfig

    obs_dim, act_dim = 17, 6  # HalfCheetah's shapes
    alg = CQL(obs_dim, -torch.ones(act_dim), torch.ones(act_dim),
              CQLConfig(updates_per_iteration=k), seed=0)
    alg.attach(synthetic_dataset(10_000, obs_dim, act_dim))
    return lambda: alg.update()


def updates(repeats: int) -> list[dict[str, Any]]:
    """Per workload: seconds per call with each choice, interleaved rounds, and the ratio."""
    workloads = {"PPO minibatch (512, 64x64 actor, 128x128 critic)": (ppo_minibatch(), 200),
                 "SAC update (256, 256x256 nets)": (sac_updates(20), 5),
                 "CRL update (256, depth 16, width 256)": (crl_updates(5, 16), 2),
                 "CQL update (256, 3x256 nets, 30 sampled actions a state)": (cql_updates(2), 2)}
    rows = []
    for name, (fn, calls) in workloads.items():
        times: dict[str, list[float]] = {"blas": [], "onednn": []}
        for backend in times:  # warm-up: oneDNN's primitive cache, allocators
            use(backend)
            seconds_per_call(fn, calls)
        for _ in range(repeats):
            for backend in times:
                use(backend)
                times[backend].append(seconds_per_call(fn, calls))
        med = {b: statistics.median(t) for b, t in times.items()}
        rows.append({"workload": name, "ms": {b: 1e3 * m for b, m in med.items()},
                     "all_ms": {b: [1e3 * s for s in t] for b, t in times.items()},
                     "speedup": med["blas"] / med["onednn"]})
        console.print(f"[dim]{name}: {rows[-1]['ms']['blas']:.2f} ms -> "
                      f"{rows[-1]['ms']['onednn']:.2f} ms[/]")
    use("auto")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--skip-updates", action="store_true", help="the product table only")
    p.add_argument("--out", default="benchmarks/figures/cpu_linear.json",
                   help="the JSON written (default: %(default)s)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if not lin._onednn_works():
        raise SystemExit("this torch build has no working oneDNN linear "
                         "(torch.ops.mkldnn._linear_pointwise): nothing to compare")
    vendor, family, _ = lin._cpu_info()
    chosen, mkl_intel = lin.onednn_enabled(), lin.mkl_intel_path()
    fast, slow = ("onednn", "blas") if chosen else ("blas", "onednn")  # the default, the other
    console.print(banner("float32 CPU products: BLAS vs oneDNN", f"{args.threads} thread(s)",
                         f"oneDNN chosen by default here: {chosen} ({vendor}, family {family}; "
                         f"MKL on its Intel kernels: {mkl_intel})"))
    prod = products(args.repeats)
    table = Table(title="GFLOP/s per product (median)")
    table.add_column("B x in x out", no_wrap=True)
    for col in ("forward blas", "onednn", "input grad blas", "onednn",
                "weight grad blas", "onednn", "numpy fwd"):
        table.add_column(col, justify="right")
    for r in prod:
        gf = r["gflops"]
        table.add_row(f"{r['batch']}x{r['in']}x{r['out']}", *(f"{gf[k]:.0f}" for k in (
            "blas forward", "onednn forward", "blas input grad", "onednn input grad",
            "blas weight grad", "onednn weight grad", "numpy forward")))
    console.print(table)
    payload: dict[str, Any] = {"meta": {**machine_meta(), "threads": args.threads,
                                        "vendor": vendor, "family": family,
                                        "mkl_intel_path": mkl_intel, "onednn_default": chosen},
                               "products": prod}
    name = {"onednn": "oneDNN", "blas": "BLAS"}
    checks = [check(f"{name[fast]} (the default here) forward >= {name[slow]} at "
                    f"{r['batch']}x{r['in']}x{r['out']}",
                    round(r["gflops"][f"{fast} forward"] / r["gflops"][f"{slow} forward"], 2),
                    r["gflops"][f"{fast} forward"] >= r["gflops"][f"{slow} forward"])
              for r in prod]
    if not args.skip_updates:
        rows = updates(args.repeats)
        table = Table(title="whole updates, ms per call (median of interleaved rounds)")
        for col in ("workload", "BLAS", "oneDNN", "speed-up"):
            table.add_column(col, justify="right")
        for r in rows:
            table.add_row(r["workload"], f"{r['ms']['blas']:.2f}", f"{r['ms']['onednn']:.2f}",
                          f"{r['speedup']:.2f}x")
        console.print(table)
        payload["updates"] = rows
        gains = [r["speedup"] if chosen else 1 / r["speedup"] for r in rows]
        checks += [check(f"{r['workload']}: {name[fast]} (the default here) not slower",
                         round(g, 2), g >= 1.0) for r, g in zip(rows, gains, strict=True)]
    payload["checks"] = checks
    print_checks(console, checks, lambda c: f" ({c['value']}x)")
    write_json(args.out, payload, console)


if __name__ == "__main__":
    main()
