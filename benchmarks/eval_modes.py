"""One checkpoint's policy evaluated twice: its mean action (what ``robotrl eval`` and the
runs' evaluations use) and its sampled actions (what it trained with), on the same worlds.

    python benchmarks/eval_modes.py runs/.../checkpoints/last.pt --episodes 10 --seed 0

For the off-policy learners whose actor samples from a distribution (SAC, CrossQ). Each mode
resets the same worlds (the ``eval-env``/``eval-reset`` streams of ``--seed``, as ``robotrl eval
seed=S``), and both feed the actor the same input as ``act_deterministic``, so a gap between the
two lines is the policy's, not the worlds'. Prints one line a mode; ``--out FILE`` writes them
as JSON.
"""

from __future__ import annotations

import argparse

import torch
from common import machine_meta, write_json
from rich.console import Console

from robotrl.experiment.build import load_trained
from robotrl.runners.evaluation import run_episodes, summarize_episodes
from robotrl.types import policy_obs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = load_trained(args.checkpoint, args.episodes, args.seed)
    cfg, env, alg = run.cfg, run.env, run.alg
    actor = getattr(alg, "actor", None)
    if not hasattr(actor, "sample") or not hasattr(alg, "_to_env"):
        raise SystemExit(f"error: {type(alg).__name__} has no actor that samples actions; "
                         "eval_modes.py takes SAC and CrossQ checkpoints")
    generator = torch.Generator().manual_seed(args.seed)

    def sampled(obs: torch.Tensor) -> torch.Tensor:
        action, _ = actor.sample(policy_obs(obs).to(torch.float32), generator)
        return alg._to_env(action)

    console, results = Console(), {}
    for mode, policy in (("mean", alg.act_deterministic), ("sampled", sampled)):
        obs = run.reset()
        with torch.no_grad():
            result = summarize_episodes(run_episodes(env, obs, policy))
        results[mode] = result
        console.print(f"{cfg.env.task} {mode} actions: return {result['return_mean']:.1f} ± "
                      f"{result['return_std']:.1f}, length {result['length_mean']:.1f} over "
                      f"{result['episodes']} episodes")
    if args.out:
        write_json(args.out, {"meta": machine_meta(), "checkpoint": args.checkpoint,
                              "seed": args.seed, **results}, console)


if __name__ == "__main__":
    main()
