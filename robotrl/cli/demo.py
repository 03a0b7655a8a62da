"""``robotrl demo``: step a batch of worlds with random actions and print throughput."""

from __future__ import annotations

import time

import torch

from robotrl.cli.args import parse_kv


def demo_main(argv: list[str]) -> None:
    from robotrl.envs import make
    from robotrl.logging import console

    args = parse_kv(argv, {"task": str, "num_envs": int, "steps": int})
    task, n, steps = args.get("task", "halfcheetah"), args.get("num_envs", 256), args.get("steps", 200)
    env = make(str(task), int(n))
    action = torch.rand(int(n), env.spec.action_dim) * 2 - 1
    start = time.perf_counter()
    ret = torch.zeros(int(n))
    for _ in range(int(steps)):
        out = env.step(action)
        ret += out.reward
    elapsed = time.perf_counter() - start
    console.print(f"{task}: {n} worlds x {steps} steps in {elapsed:.2f} s = "
                  f"{int(n) * int(steps) / elapsed:,.0f} env-steps/s; obs {tuple(out.obs['policy'].shape)}, "
                  f"mean reward {ret.mean().item() / int(steps):.3f}")
