"""Deterministic evaluation: one episode per world, raw environment rewards."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from robotrl.types import BatchedEnv, Obs, StepOut

if TYPE_CHECKING:
    from robotrl.video import EpisodeRecorder

PolicyFn = Callable[[Obs], torch.Tensor]
"""Observation (every group of the env) -> action [N, act_dim]."""


def run_episodes(env: BatchedEnv, obs: Obs, policy: PolicyFn, max_steps: int | None = None,
                 on_step: Callable[[BatchedEnv, StepOut], None] | None = None,
                 gamma: float | None = None) -> dict[str, torch.Tensor]:
    """From ``obs``, every world at the start of an episode, run each world's episode to its
    end (at most ``max_steps`` steps) with ``policy``; worlds that finish early keep stepping
    (auto-reset) but no longer count.

    Taking exactly one episode per world avoids the bias toward short episodes that counting
    the first K finished episodes of a batch has. ``on_step`` (a frame grabber, a learner
    recording the step) is called after every step with the env and the step's output.

    Returns per world, on ``env.device``: ``return`` [N] float64, ``length`` [N] long;
    ``discounted_return`` [N] with ``gamma``; ``success`` [N] bool (``info["success"]`` at the
    episode's last step) where ``env.spec.has_success``; for goal-conditioned envs
    (``env.spec.goal``) ``final_distance`` [N] (``info["goal_distance"]`` at the last step) and
    ``time_to_goal`` [N] long (steps until the goal was first reached, -1 if never); and
    ``steps`` [] (steps simulated, summed over worlds).
    """
    n = env.num_envs
    ret = torch.zeros(n, dtype=torch.float64, device=env.device)
    length = torch.zeros(n, dtype=torch.long, device=env.device)
    finished = torch.zeros(n, dtype=torch.bool, device=env.device)
    disc = torch.zeros_like(ret)
    success = torch.zeros_like(finished) if env.spec.has_success else None
    goal = env.spec.goal is not None
    distance = torch.zeros_like(ret)
    reached = torch.full_like(length, -1)
    weight, steps = 1.0, 0
    with torch.inference_mode():
        while not bool(finished.all()) and (max_steps is None or steps < max_steps):
            out = env.step(policy(obs))
            running = ~finished
            reward = out.reward.to(torch.float64) * running
            ret += reward
            if gamma is not None:
                disc += weight * reward
                weight *= gamma
            length += running.long()
            if success is not None:
                success = torch.where(running, out.info["success"], success)
            if goal:
                distance = torch.where(running, out.info["goal_distance"].double(), distance)
                first = running & out.info["success"] & (reached < 0)
                reached = torch.where(first, length, reached)
            finished |= out.terminated | out.truncated
            obs = out.obs
            steps += 1
            if on_step is not None:
                on_step(env, out)
    result = {"return": ret, "length": length, "steps": torch.tensor(steps * n)}
    if gamma is not None:
        result["discounted_return"] = disc
    if success is not None:
        result["success"] = success
    if goal:
        result["final_distance"], result["time_to_goal"] = distance, reached
    return result


def summarize_episodes(episodes: dict[str, torch.Tensor]) -> dict[str, float]:
    """``return_mean``, ``return_std``, ``length_mean``, ``episodes`` of ``run_episodes``'
    result, and ``discounted_return_mean``/``_std`` and ``success`` (the rate) where present;
    for goal-conditioned envs ``final_distance`` (mean), ``reached`` (fraction of episodes that
    reached the goal at some step) and ``time_to_goal`` (mean steps to the first success over
    those episodes; NaN if none)."""
    ret = episodes["return"]
    result = {
        "return_mean": ret.mean().item(),
        "return_std": ret.std(unbiased=False).item(),
        "length_mean": episodes["length"].double().mean().item(),
        "episodes": len(ret),
    }
    if "discounted_return" in episodes:
        result["discounted_return_mean"] = episodes["discounted_return"].mean().item()
        result["discounted_return_std"] = episodes["discounted_return"].std(unbiased=False).item()
    if "success" in episodes:
        result["success"] = episodes["success"].double().mean().item()
    if "final_distance" in episodes:
        result["final_distance"] = episodes["final_distance"].mean().item()
        reached = episodes["time_to_goal"]
        hit = reached >= 0
        result["reached"] = hit.double().mean().item()
        result["time_to_goal"] = (reached[hit].double().mean().item() if bool(hit.any())
                                  else float("nan"))
    return result


def evaluate(policy: PolicyFn, env: BatchedEnv, seed: int = 0, gamma: float | None = None,
             recorder: EpisodeRecorder | None = None) -> dict[str, float]:
    """Run the first episode of every world of ``env`` (reset with ``seed``) to its end with
    ``policy`` (``run_episodes``). Returns ``return_mean``, ``return_std``, ``length_mean``,
    ``episodes``; with ``gamma`` also ``discounted_return_mean`` and ``discounted_return_std``
    (what off-policy evaluation estimates, ``robotrl.ope``). ``recorder`` films world 0's
    episode (``robotrl.video``).
    """
    obs = env.reset(seed=seed)
    if recorder is not None:
        recorder.start(env)
    episodes = run_episodes(env, obs, policy, on_step=recorder, gamma=gamma)
    if env.spec.goal is None:  # runs report returns and lengths; goal tasks their success too
        episodes.pop("success", None)
    return summarize_episodes(episodes)
