"""Our PPO next to RSL-RL's (``rsl-rl-lib``, the batched-torch PPO behind Isaac Lab, Legged Gym,
mjlab and MuJoCo Playground's torch path), both on *our* batched simulator (issue 19).

    pip install rsl-rl-lib==5.5.1          # benchmark only; not a robotrl dependency
    python benchmarks/ppo_vs_rsl_rl.py                            # HalfCheetah, 3 seeds, 1M steps
    python benchmarks/ppo_vs_rsl_rl.py --task hopper --seeds 0 1 2 3 4
    python benchmarks/ppo_vs_rsl_rl.py --steps 20000 --seeds 0        # smoke test

Both contestants get the same worlds (``robotrl.envs`` native MuJoCo, built by ``build_env``
exactly as ``robotrl train`` builds ours, same seed), rollout length, networks, PPO
hyperparameters (ours' composed config, ``configs/tuned/`` included, mapped onto RSL-RL's
``PPO``), torch threads and env steps. RSL-RL sees the worlds through its ``VecEnv`` interface
(``RslVecEnv`` below, in this benchmark only): observation group ``policy`` in a
``TensorDict``, done = terminated or truncated, ``time_outs`` = truncated and not terminated,
actions clipped to the bounds before the simulator as ours clips them. Both log to TensorBoard
and checkpoint every ``checkpoint_interval`` iterations, as a user's run does.

What the mapping cannot make equal, and what ours gives up to match:
* ours' reward scaling is turned off (``algo.reward_scaling=false``): RSL-RL has none;
* RSL-RL's value loss is the squared error times ``value_loss_coef``, ours half of it times
  ``value_coef``: RSL-RL gets ``value_coef / 2``;
* RSL-RL clips the actor's and the critic's gradient norms separately, ours their joint norm;
  RSL-RL's adaptive lr uses the closed-form Gaussian KL, ours the k3 estimate; Adam eps 1e-8
  (RSL-RL) against 1e-5 (ours): since issue 43 each is a ``PPOConfig`` switch
  (``clip_grad_per_network``, ``kl_estimator=gaussian``, ``adam_eps``) that
  ``tests/reference/test_rsl_rl.py`` sets to match RSL-RL's update exactly; these timed runs
  keep ours' defaults, as the figures below were measured. RSL-RL updates its observation
  normalizer after each update from the rollout, ours while acting; default torch
  initialisation against ours' orthogonal one.

Reported per seed and over seeds: env-steps/s over the whole training (evaluations excluded,
``TimedEvals``), the ratio ours / RSL-RL of the same seed, deterministic evaluation returns at
equal env steps (the end of both runs) and at equal wall clock (the last evaluation of each at
or before the time the faster run finished).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: no spin-wait stalls

import torch
from common import (
    CORES,
    TimedEvals,
    banner,
    check,
    fresh_dir,
    machine_meta,
    ours_eval,
    ours_wallclock,
    print_checks,
    write_json,
)
from rich.console import Console
from rich.table import Table

from robotrl.config import TrainConfig, from_dict
from robotrl.envs import BatchedEnv
from robotrl.experiment.build import build_env

TARGET_SPEEDUP = 1.3
"""Issue 19: ours' end-to-end env-steps/s over RSL-RL's on the same env and settings."""
RSL_VERSION = "5.5.1"
"""The rsl-rl-lib release this benchmark was written against (its config schema changes)."""

try:
    from rsl_rl.env import VecEnv
    from tensordict import TensorDict
except ImportError as exc:  # a benchmark-only peer: say how to get it
    raise SystemExit(f"this benchmark needs RSL-RL: pip install rsl-rl-lib=={RSL_VERSION} "
                     f"({exc})") from exc


class RslVecEnv(VecEnv):
    """Our ``BatchedEnv`` behind RSL-RL's ``VecEnv`` interface (see the module docstring)."""

    def __init__(self, env: BatchedEnv) -> None:
        self.env = env
        self.num_envs = env.num_envs
        self.num_actions = env.spec.action_dim
        self.max_episode_length = env.spec.max_episode_steps
        self.episode_length_buf = torch.zeros(env.num_envs, dtype=torch.long)
        self.device = env.device
        self.cfg: dict[str, Any] = {"task": env.spec.task}
        self.low, self.high = env.spec.action_low, env.spec.action_high
        self.obs = self._wrap(env.reset())

    def _wrap(self, obs: dict[str, torch.Tensor]) -> TensorDict:
        return TensorDict({"policy": obs["policy"]}, batch_size=[self.num_envs])

    def get_observations(self) -> TensorDict:
        return self.obs

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        out = self.env.step(torch.clamp(actions, self.low, self.high))
        done = out.terminated | out.truncated
        self.episode_length_buf += 1
        self.episode_length_buf[done] = 0
        self.obs = self._wrap(out.obs)
        return self.obs, out.reward, done, {"time_outs": out.truncated & ~out.terminated}


def rsl_train_cfg(cfg: TrainConfig) -> dict[str, Any]:
    """RSL-RL's ``OnPolicyRunner`` configuration doing what ours' ``cfg`` does (module
    docstring: what differs)."""
    a = cfg.algo
    if a.shared_backbone or a.state_dependent_std or a.critic_obs != ("policy",):
        raise SystemExit("the mapping covers separate actor/critic MLPs with a free std on the "
                         "policy group only")
    if a.clip_low != a.clip_high or a.lr_schedule not in ("adaptive", "fixed"):
        raise SystemExit("RSL-RL has one clip width and the adaptive or fixed lr schedule")
    if not a.normalize_advantages:
        raise SystemExit("RSL-RL always normalizes advantages")
    model = dict(class_name="rsl_rl.models.MLPModel", activation=a.activation,
                 obs_normalization=a.normalize_obs)
    return {
        "num_steps_per_env": a.num_steps,
        "save_interval": cfg.checkpoint_interval,
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "actor": {**model, "hidden_dims": list(a.actor_hidden), "distribution_cfg": dict(
            class_name="rsl_rl.modules.GaussianDistribution", init_std=math.exp(a.init_log_std),
            std_type="log")},
        "critic": {**model, "hidden_dims": list(a.critic_hidden)},
        "algorithm": dict(
            class_name="rsl_rl.algorithms.PPO", num_learning_epochs=a.num_epochs,
            num_mini_batches=a.num_minibatches, clip_param=a.clip_low, gamma=a.gamma,
            lam=a.gae_lambda, value_loss_coef=a.value_coef / 2, entropy_coef=a.entropy_coef,
            learning_rate=a.learning_rate, max_grad_norm=a.max_grad_norm,
            use_clipped_value_loss=a.value_clip > 0, schedule=a.lr_schedule,
            desired_kl=a.desired_kl),
        "logger": "tensorboard",
        "check_for_nan": True,
    }


def rsl_policy(alg: Any, low: torch.Tensor, high: torch.Tensor) -> Any:
    """Deterministic RSL-RL actions for ``evaluate``: the actor's mean (its normalizer
    applied) clipped to the bounds, as in training and as ours' ``act_deterministic`` (the
    tasks charge control cost on the action they are given)."""
    def policy(obs: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.inference_mode():
            td = TensorDict({"policy": obs["policy"]}, batch_size=[len(obs["policy"])])
            return torch.clamp(alg.get_policy()(td, stochastic_output=False), low, high)
    return policy


def rsl_run(cfg: TrainConfig, args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """RSL-RL's ``OnPolicyRunner.learn`` on our worlds for ``cfg.total_steps`` env steps,
    evaluated every ``args.eval_every`` s of training time like ours (``TimedEvals``)."""
    from rsl_rl.runners import OnPolicyRunner
    from torch.utils.tensorboard import SummaryWriter

    run_dir = fresh_dir(Path(args.out) / f"rsl_rl_{cfg.env.task}_s{cfg.seed}", console)
    torch.set_num_threads(cfg.torch_threads or CORES)
    torch.manual_seed(cfg.seed)
    env = RslVecEnv(build_env(cfg, cfg.num_envs, cfg.seed))
    train_cfg = rsl_train_cfg(cfg)
    batch = cfg.algo.num_steps * cfg.num_envs
    iterations = math.ceil(cfg.total_steps / batch)
    console.print(f"[dim]{cfg.env.task}: RSL-RL {RSL_VERSION}, {cfg.num_envs} worlds, "
                  f"{iterations * batch:,} steps, seed {cfg.seed} ...[/]")
    with open(run_dir / "rsl_rl.log", "w") as log, contextlib.redirect_stdout(log):
        runner = OnPolicyRunner(env, train_cfg, log_dir=str(run_dir), device="cpu")
        run_eval = ours_eval(cfg)
        evals = TimedEvals(lambda: run_eval(rsl_policy(runner.alg, env.low, env.high)),
                           SummaryWriter(str(run_dir), filename_suffix=".evals"),
                           args.eval_every, float("inf"))
        done, update_s = [0], [0.0]
        update = runner.alg.update

        def update_then_evaluate() -> dict[str, float]:
            t0 = time.perf_counter()
            metrics = update()
            update_s[0] += time.perf_counter() - t0
            done[0] += 1
            if evals.due():
                evals.evaluate(done[0] * batch)
            return metrics

        runner.alg.update = update_then_evaluate
        evals.begin()
        runner.learn(num_learning_iterations=iterations)
        seconds = evals.finish(iterations * batch)
    return {"label": "RSL-RL", "run_dir": str(run_dir), "train_seconds": seconds,
            "eval_seconds": evals.eval_s, "steps": iterations * batch,
            "update_seconds": update_s[0],
            "final": evals.curve[-1], "curve": evals.curve, "rsl_cfg": train_cfg}


def at_seconds(curve: list[dict[str, float]], seconds: float) -> dict[str, float]:
    """The last evaluation at or before ``seconds`` of training."""
    return [p for p in curve if p["seconds"] <= seconds + 1e-6][-1]


def within_noise(a: list[float], b: list[float]) -> tuple[float, float]:
    """(difference of the means, twice its standard error over seeds): within seed noise when
    the difference is at most that."""
    if len(a) < 2 or len(b) < 2:
        return statistics.mean(a) - statistics.mean(b), float("nan")
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    return statistics.mean(a) - statistics.mean(b), 2 * se


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="halfcheetah", help="registry name (default: halfcheetah)")
    p.add_argument("--steps", type=int, default=1_000_000, help="env steps of each run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--overrides", nargs="*", default=[], metavar="KEY=VALUE",
                   help="`robotrl train` overrides for ours, mapped onto RSL-RL too")
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--eval-every", type=float, default=5.0,
                   help="seconds of training between evaluations")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=max(Console().width, 100))
    extra = ["algo=ppo", f"total_steps={args.steps}", "algo.reward_scaling=false",
             *args.overrides]
    console.print(banner(f"PPO: ours vs RSL-RL {RSL_VERSION} on {args.task}",
                         f"{args.steps:,} steps, seeds {args.seeds}"))
    runs: list[dict[str, Any]] = []
    for seed in args.seeds:  # the two of a seed back to back: the machine's drift hits both
        seed_args = argparse.Namespace(**{**vars(args), "seed": seed})
        name = f"ours_{args.task}_s{seed}"
        ours = ours_wallclock(args.task, 10**4, name, extra, seed_args, console)
        ours["label"] = "ours"
        cfg = from_dict(TrainConfig, ours["config"])
        peer = rsl_run(cfg, seed_args, console)
        t = min(ours["train_seconds"], peer["train_seconds"])
        pair = {"seed": seed, "ours": ours, "rsl": peer, "equal_seconds": t,
                "speedup": (ours["steps"] / ours["train_seconds"])
                / (peer["steps"] / peer["train_seconds"])}
        for key in ("ours", "rsl"):
            pair[key]["sps"] = pair[key]["steps"] / pair[key]["train_seconds"]
            pair[key]["at_equal_seconds"] = at_seconds(pair[key]["curve"], t)
        runs.append(pair)
        console.print(f"seed {seed}: ours {pair['ours']['sps']:,.0f} env-steps/s, RSL-RL "
                      f"{pair['rsl']['sps']:,.0f} ({pair['speedup']:.2f}x); final return "
                      f"{ours['final']['return']:.0f} vs {peer['final']['return']:.0f}; "
                      + "; ".join(f"{who} {r['train_seconds'] - r['update_seconds']:.1f} s "
                                  f"collecting, {r['update_seconds']:.1f} s updating"
                                  for who, r in (("ours", ours), ("RSL-RL", peer))))

    table = Table(title=f"{args.task}: ours PPO vs RSL-RL PPO, same worlds and settings, "
                        f"{runs[0]['ours']['config']['num_envs']} worlds",
                  caption="env-steps/s: env steps / training seconds (evaluations excluded); "
                          f"returns: deterministic, {args.eval_episodes} episodes")
    for col in ("seed", "ours steps/s", "RSL-RL steps/s", "ours/RSL-RL", "ours @ equal steps",
                "RSL-RL @ equal steps", "@ equal wall clock (s)", "ours", "RSL-RL"):
        table.add_column(col, justify="right")
    for r in runs:
        table.add_row(str(r["seed"]), f"{r['ours']['sps']:,.0f}", f"{r['rsl']['sps']:,.0f}",
                      f"{r['speedup']:.2f}x", f"{r['ours']['final']['return']:.0f}",
                      f"{r['rsl']['final']['return']:.0f}", f"{r['equal_seconds']:.0f}",
                      f"{r['ours']['at_equal_seconds']['return']:.0f}",
                      f"{r['rsl']['at_equal_seconds']['return']:.0f}")
    console.print(table)

    ratios = [r["speedup"] for r in runs]
    final = {k: [r[k]["final"]["return"] for r in runs] for k in ("ours", "rsl")}
    equal_t = {k: [r[k]["at_equal_seconds"]["return"] for r in runs] for k in ("ours", "rsl")}
    diff, noise = within_noise(final["ours"], final["rsl"])
    checks = [
        check(f"ours/RSL-RL env-steps/s >= {TARGET_SPEEDUP} (median of {len(ratios)} seeds, "
              f"min {min(ratios):.2f})", round(statistics.median(ratios), 2),
              statistics.median(ratios) >= TARGET_SPEEDUP),
        check(f"ours' return at equal steps not below RSL-RL's beyond seed noise (ours - "
              f"RSL-RL = {diff:.0f}, 2 SE = {noise:.0f})", round(diff, 1),
              None if math.isnan(noise) else diff >= -noise),
    ]
    print_checks(console, checks, lambda c: f" ({c['value']})")
    if args.json:
        write_json(args.json, {"meta": machine_meta(), "args": vars(args), "runs": runs,
                               "final": final, "equal_wall_clock": equal_t, "checks": checks},
                   console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
