"""One checkpoint's deterministic policy over many episodes: each episode's return, not only
their mean, and which episodes an observation left a range in.

    python benchmarks/episode_returns.py runs/.../checkpoints/last.pt --episodes 150
    python benchmarks/episode_returns.py CKPT --episodes 150 --watch 1 --limit 1.5708

A mean over 150 episodes can sit hundreds below the mean over 10 while every typical episode
scores the same: a few episodes fail. This prints the returns' quantiles and the lowest
returns, and counts the episodes that ended before the task's time limit (a walker that fell),
with their mean return and the others'. With ``--watch I --limit L`` it also counts the episodes
in which component I of the policy observation ever exceeded L in magnitude, and the step it
first did (HalfCheetah-v5's component 1 is the torso's pitch: past pi/2 the cheetah has turned
over). Without ``--seed`` the
worlds start as the run's own evaluation did (``robotrl eval`` without ``seed``), so the mean
printed is the run's final score over the same number of episodes. ``--out FILE`` writes the
per-episode values as JSON.
"""

from __future__ import annotations

import argparse

import torch
from common import machine_meta, write_json
from rich.console import Console

from robotrl.experiment.build import load_trained
from robotrl.runners.evaluation import run_episodes
from robotrl.types import policy_obs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--episodes", type=int, default=150)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--watch", type=int, default=None,
                        help="index of a policy-observation component to watch")
    parser.add_argument("--limit", type=float, default=None,
                        help="magnitude that component must exceed to count an episode")
    parser.add_argument("--lowest", type=int, default=15, help="how many lowest returns to list")
    parser.add_argument("--out")
    args = parser.parse_args()
    if (args.watch is None) != (args.limit is None):
        parser.error("--watch and --limit go together")
    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    torch.set_num_threads(1)
    run = load_trained(args.checkpoint, args.episodes, args.seed)
    env, alg = run.env, run.alg
    n = env.num_envs
    obs = run.reset()
    width = policy_obs(obs).shape[-1]
    if args.watch is not None and not 0 <= args.watch < width:
        raise SystemExit(f"error: --watch {args.watch} is outside the policy observation's "
                         f"{width} components")
    watched: list[torch.Tensor] = []  # per step, every world's |component|

    def policy(obs: torch.Tensor) -> torch.Tensor:
        if args.watch is not None:
            watched.append(policy_obs(obs)[:, args.watch].abs().double().cpu())
        return alg.act_deterministic(obs)

    episodes = run_episodes(env, obs, policy)
    returns, lengths = episodes["return"].cpu(), episodes["length"].cpu()
    if args.watch is not None:  # step t's observation is its episode's while t < length
        values = torch.stack(watched, dim=1)  # [worlds, steps]
        live = torch.arange(values.shape[1]) < lengths[:, None]
        peak = values.masked_fill(~live, 0.0).max(dim=1).values
        over = live & (values > args.limit)
        first = torch.where(over.any(dim=1), over.long().argmax(dim=1), -1)
    order = torch.argsort(returns)
    q = torch.quantile(returns, torch.tensor([0.0, 0.05, 0.25, 0.5, 0.75, 1.0],
                                              dtype=returns.dtype))
    console = Console(soft_wrap=True)
    std = returns.std(correction=0)  # as the runs' evaluations report it
    console.print(f"{run.cfg.env.task}: return {returns.mean():.1f} ± {std:.1f} over {n} "
                  f"episodes; min {q[0]:.0f}, 5% {q[1]:.0f}, 25% {q[2]:.0f}, median "
                  f"{q[3]:.0f}, 75% {q[4]:.0f}, max {q[5]:.0f}")
    for i in order[:args.lowest].tolist():
        line = f"  episode {i}: return {returns[i]:.0f}, length {int(lengths[i])}"
        if args.watch is not None:
            line += (f", max |obs[{args.watch}]| {peak[i]:.2f}"
                     + (f", past {args.limit:g} from step {int(first[i])}" if first[i] >= 0 else ""))
        console.print(line)
    limit = env.spec.max_episode_steps
    early = lengths < limit  # terminated (a fall, a flip the task ends on) before its time limit
    if early.any():
        console.print(f"episodes that ended before {limit} steps: {int(early.sum())} of {n}, at "
                      f"steps {int(lengths[early].min())}-{int(lengths[early].max())}, their mean "
                      f"return {returns[early].mean():.1f}"
                      + (f"; the others' {returns[~early].mean():.1f}" if not early.all() else ""))
    else:
        console.print(f"episodes that ended before {limit} steps: 0 of {n}")
    record = {"meta": machine_meta(), "checkpoint": args.checkpoint, "seed": args.seed,
              "return": returns.tolist(), "length": lengths.tolist(), "max_episode_steps": limit}
    if args.watch is not None:
        crossed = int((first >= 0).sum())
        console.print(f"episodes with |obs[{args.watch}]| past {args.limit:g}: {crossed} of {n}, "
                      f"their mean return {returns[first >= 0].mean():.1f}" if crossed else
                      f"episodes with |obs[{args.watch}]| past {args.limit:g}: 0 of {n}")
        record.update(watch=args.watch, limit=args.limit, peak=peak.tolist(),
                      first_step=first.tolist())
    if args.out:
        write_json(args.out, record, console)


if __name__ == "__main__":
    main()
