"""Evaluating a trained run beyond its own evaluations: the off-policy estimate of its value from
a dataset beside the simulator's."""

from __future__ import annotations

import time
from typing import Any


def off_policy_value(checkpoint: str, dataset: str, updates: int = 10_000, gamma: float = 0.99,
                     simulate: bool = True, episodes: int = 10, device: str = "cpu",
                     seed: int = 0) -> dict[str, Any]:
    """FQE estimate of ``checkpoint``'s deterministic policy on ``dataset``; with ``simulate``
    also ``simulated`` (its discounted return over ``episodes`` simulator episodes, resets from
    the run's evaluation stream)."""
    import torch

    from robotrl.data import load_dataset
    from robotrl.experiment.build import load_trained
    from robotrl.ope import FQEConfig, fitted_q_evaluation
    from robotrl.runners.evaluation import evaluate
    from robotrl.types import obs_to

    t0 = time.perf_counter()
    run = load_trained(checkpoint, episodes, seed, device)
    cfg, env, alg = run.cfg, run.env, run.alg
    data = load_dataset(dataset, device)
    data.check_spec(env.spec.obs_dim, env.spec.action_dim, cfg.env.task)
    result: dict[str, Any] = fitted_q_evaluation(
        lambda s: alg.act_deterministic({"policy": s}), data,
        FQEConfig(updates=updates, gamma=gamma, seed=seed))
    if simulate:
        dev = torch.device(device)
        sim = evaluate(lambda obs: alg.act_deterministic(obs_to(obs, dev)).to(env.device), env,
                       seed=run.seeds["eval-reset"], gamma=gamma)
        result.update(simulated=sim["discounted_return_mean"],
                      simulated_std=sim["discounted_return_std"])
    result["seconds"] = time.perf_counter() - t0
    return result
