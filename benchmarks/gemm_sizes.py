"""GFLOP/s of the matrix products a seed batch runs, at each size and thread count: what bounds
``benchmarks/seed_batch.py`` on a CPU.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/gemm_sizes.py           # about a minute
    OMP_WAIT_POLICY=PASSIVE python benchmarks/gemm_sizes.py --hidden 256 --batch 256 --repeats 7

The products of one hidden layer's update (forward ``x @ W``, and the backward's two:
``grad @ W^T`` and ``x^T @ grad``) for a 256-wide layer at batch 256:

* ``solo``: one seed, one network: ``[B, H] @ [H, H]`` (``torch.mm``), one thread: what each of
  the separate processes runs, two at a time on two cores;
* ``batch k``: ``k`` stacked networks (S seeds x E critics), ``torch.bmm`` of ``[k, B, H]`` by
  ``[k, H, H]``, at one and at two threads: what one seed-batched process runs;
* ``wide``: the same arithmetic as one large product, ``[k B, H] @ [H, H]``, the best a batch
  could hope for if its products became one.

Each figure is the median GFLOP/s of ``--repeats`` timings of at least ``--seconds`` each (the
three products in turn), interleaved across sizes. The seed batch's ceiling on products against
S processes is ``two-thread batch GFLOP/s / (2 x one-thread solo GFLOP/s)``: below 1.5, 1.5x
cannot come from the products (the rest of an update is per-operation overhead, which batching
does save). OpenMP's wait policy is the environment's (set it before running: PASSIVE, as runs
use it, or ACTIVE).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch, as the learners' processes

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from common import machine_meta, write_json  # noqa: E402
from rich.console import Console  # noqa: E402


def rate(fn: Any, flops: float, seconds: float) -> float:
    """GFLOP/s of ``fn`` (``flops`` a call) over at least ``seconds``."""
    calls, t0 = 0, time.perf_counter()
    while (dt := time.perf_counter() - t0) < seconds or calls < 3:
        fn()
        calls += 1
    return calls * flops / dt / 1e9


def products(k: int, b: int, h: int, wide: bool) -> tuple[Any, float]:
    """A callable running the layer's three products for ``k`` networks (``wide``: as one
    [k b, h] product; ``k`` = 1 and not wide: ``torch.mm``), and its FLOPs."""
    g = torch.Generator().manual_seed(0)
    if wide or k == 1:
        x, w, gy = (torch.randn(k * b, h, generator=g), torch.randn(h, h, generator=g),
                    torch.randn(k * b, h, generator=g))

        def run() -> None:
            torch.mm(x, w)
            torch.mm(gy, w.t())
            torch.mm(x.t(), gy)
    else:
        x, w, gy = (torch.randn(k, b, h, generator=g), torch.randn(k, h, h, generator=g),
                    torch.randn(k, b, h, generator=g))

        def run() -> None:
            torch.bmm(x, w)
            torch.bmm(gy, w.transpose(1, 2))
            torch.bmm(x.transpose(1, 2), gy)
    return run, 3 * 2.0 * k * b * h * h


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--stacks", type=int, nargs="+", default=[2, 5, 10],
                   help="networks in a batch (S seeds x E critics: 5 x 2 = 10)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seconds", type=float, default=0.5)
    p.add_argument("--out", default="benchmarks/figures/gemm_sizes.json")
    args = p.parse_args()
    console = Console()
    b, h = args.batch, args.hidden
    cases = [("solo", 1, False, 1)] + [
        (f"{kind} {k}", k, kind == "wide", t)
        for k in args.stacks for kind in ("batch", "wide") for t in (1, 2)]
    runs: dict[str, list[float]] = {}
    built = {name: products(k, b, h, wide) for name, k, wide, _ in cases}
    for _ in range(args.repeats):  # interleaved: load hits every size alike
        for name, _, _, threads in cases:
            torch.set_num_threads(threads)
            fn, flops = built[name]
            fn()
            runs.setdefault(f"{name}, {threads}t", []).append(rate(fn, flops, args.seconds))
    gflops = {key: statistics.median(v) for key, v in runs.items()}
    solo = gflops["solo, 1t"]
    console.print(f"[bold]GFLOP/s, forward + backward products of a {h}-wide layer at batch {b}"
                  f"[/] (median of {args.repeats}; OMP_WAIT_POLICY="
                  f"{os.environ.get('OMP_WAIT_POLICY')})")
    ceilings = {}
    for key, value in gflops.items():
        note = ""
        if key.endswith("2t") and key.startswith("batch"):
            ceilings[key] = value / (2 * solo)
            note = f"  ceiling vs 2 solo processes: {ceilings[key]:.2f}x"
        console.print(f"  {key:>14}: {value:6.1f}{note}")
    write_json(args.out, {"meta": {**machine_meta(),
                                   "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                                   "hidden": h, "batch": b, "repeats": args.repeats,
                                   "seconds": args.seconds},
                          "runs": runs, "gflops": gflops, "ceilings": ceilings}, console)


if __name__ == "__main__":
    main()
