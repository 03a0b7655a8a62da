"""CRL cost per network depth: updates/s, parameters, FLOPs and memory of one update.

    python benchmarks/crl_depth.py                         # depths 4 8 16 32 64, width 256, batch 256
    python benchmarks/crl_depth.py --depths 4 16 64 --threads 1 --checkpoint

One CRL update (critic InfoNCE + actor + temperature) on ``reacher_goal``'s shapes, critic and
actor at the same depth (``algo.critic_depth`` = ``algo.actor_depth``, the paper's axis), from a
trajectory replay filled with random-policy steps. Reported per depth: updates/s (median of
``--repeats`` timings of ``--updates`` updates, after a warm-up), parameters of the three
networks, FLOPs per update (dense layers, forward + backward) and the memory one update needs:
parameters + Adam state (16 bytes per parameter) and the activations autograd keeps (the
``DeepResNet.cost`` estimate; ``--checkpoint`` keeps one block's).

Success rate against depth (the paper's finding) is not measured here yet: see
benchmarks/README.md ("Contrastive RL").
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import banner, machine_meta, write_json
from rich.console import Console
from rich.table import Table

from robotrl.algos.crl import CRL, CRLConfig
from robotrl.envs import make

console = Console()


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--depths", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--updates", type=int, default=10, help="updates per timing")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    p.add_argument("--checkpoint", action="store_true", help="activation checkpointing")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    p.add_argument("--out", default="benchmarks/results/crl_depth.json")
    return p.parse_args()


def measure(depth: int, args: argparse.Namespace) -> dict[str, float]:
    env = make("reacher_goal", 64, seed=0)
    cfg = CRLConfig(critic_depth=depth, actor_depth=depth, critic_width=args.width,
                    actor_width=args.width, batch_size=args.batch, learning_starts=10**9,
                    checkpoint_activations=args.checkpoint, bf16=args.bf16)
    alg = CRL(env.spec, cfg, 64, seed=0)  # random actions throughout; updates set by hand
    obs = env.reset(seed=0)
    for _ in range(100):  # two episodes in every world
        out = env.step(alg.act(obs))
        alg.process_env_step(out.reward, out.terminated, out.truncated, out.info["final_obs"])
        obs = out.obs
    alg.owed_updates = 2.0
    alg.update()  # warm-up
    rates = []
    for _ in range(args.repeats):
        alg.owed_updates = float(args.updates)
        t0 = time.perf_counter()
        alg.update()
        rates.append(args.updates / (time.perf_counter() - t0))
    cost = alg.network_cost()
    params = sum(c["params"] for c in cost.values())
    return {"depth": depth, "updates_per_s": statistics.median(rates), "best": max(rates),
            "params": params, "gflops_per_update": sum(c["flops"] for c in cost.values()) / 1e9,
            "state_mb": params * 16 / 2**20,
            "activation_mb": sum(c["activation_bytes"] for c in cost.values()) / 2**20}


def main() -> None:
    args = parse()
    torch.set_num_threads(args.threads or torch.get_num_threads())
    console.print(banner("CRL cost per depth", f"width {args.width}, batch {args.batch}, "
                         f"{torch.get_num_threads()} threads"
                         + (", checkpointing" if args.checkpoint else "")
                         + (", bf16" if args.bf16 else "")))
    rows = [measure(d, args) for d in args.depths]
    table = Table("depth", "updates/s (median)", "params", "GFLOP/update", "params+Adam MB",
                  "activations MB")
    for r in rows:
        table.add_row(str(r["depth"]), f"{r['updates_per_s']:.1f}", f"{r['params'] / 1e6:.2f}M",
                      f"{r['gflops_per_update']:.2f}", f"{r['state_mb']:.0f}",
                      f"{r['activation_mb']:.0f}")
    console.print(table)
    write_json(args.out, {"machine": machine_meta(), "args": vars(args), "rows": rows}, console)


if __name__ == "__main__":
    main()
