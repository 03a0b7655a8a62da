"""Deterministic evaluation: one episode per world, raw environment rewards."""

from __future__ import annotations

from collections.abc import Callable

import torch

from robotrl.envs.base import BatchedEnv, Obs, StepOut

PolicyFn = Callable[[Obs], torch.Tensor]
"""Observation (every group of the env) -> action [N, act_dim]."""


def evaluate(policy: PolicyFn, env: BatchedEnv, seed: int = 0,
             on_step: Callable[[BatchedEnv, StepOut], None] | None = None,
             gamma: float | None = None) -> dict[str, float]:
    """Run the first episode of every world of ``env`` to its end with ``policy``.

    Taking exactly one episode per world avoids the bias toward short episodes that counting
    the first K finished episodes of a batch has. ``on_step`` (e.g. a frame grabber) is called
    after every step with the env and the step's output. Returns ``return_mean``, ``return_std``,
    ``length_mean``, ``episodes``; with ``gamma`` also ``discounted_return_mean`` and
    ``discounted_return_std`` (what off-policy evaluation estimates, ``robotrl.ope``).
    """
    obs = env.reset(seed=seed)
    n = env.num_envs
    ret = torch.zeros(n, dtype=torch.float64, device=env.device)
    length = torch.zeros(n, dtype=torch.long, device=env.device)
    finished = torch.zeros(n, dtype=torch.bool, device=env.device)
    disc = torch.zeros_like(ret)
    weight = 1.0
    with torch.inference_mode():
        while not bool(finished.all()):
            out = env.step(policy(obs))
            running = ~finished
            reward = out.reward.to(torch.float64) * running
            ret += reward
            if gamma is not None:
                disc += weight * reward
                weight *= gamma
            length += running.long()
            finished |= out.terminated | out.truncated
            obs = out.obs
            if on_step is not None:
                on_step(env, out)
    result = {
        "return_mean": ret.mean().item(),
        "return_std": ret.std(unbiased=False).item(),
        "length_mean": length.double().mean().item(),
        "episodes": n,
    }
    if gamma is not None:
        result["discounted_return_mean"] = disc.mean().item()
        result["discounted_return_std"] = disc.std(unbiased=False).item()
    return result
