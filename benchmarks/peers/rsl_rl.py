"""RSL-RL's PPO (``rsl-rl-lib``, the batched-torch PPO behind Isaac Lab, Legged Gym, mjlab and
MuJoCo Playground's torch path) as a ``robotrl bench`` peer, on *our* batched simulator.

    pip install rsl-rl-lib==5.5.1                      # benchmark only; not a robotrl dependency
    python benchmarks/peers/rsl_rl.py CELL.json        # what robotrl bench run does per cell

    peers:                                             # in a grid (benchmarks/grids/*.yaml)
      rsl_rl:
        script: benchmarks/peers/rsl_rl.py
        algos: {ppo: PPO}
        options:
          episodes: 10                 # evaluation episodes (default 10)
          eval_every: 100000           # env steps between evaluations (default: budget / 10)
          torch_threads: 1             # (default 1)
          overrides: {ppo: [algo.reward_scaling=false]}   # the overrides our PPO cells run with

RSL-RL gets our config, composed as ``robotrl train algo=ppo env=<task> <overrides>`` composes
it (``robotrl.experiment.compose``, ``configs/tuned/`` included), mapped onto its
``OnPolicyRunner`` configuration (``rsl_train_cfg``), and the same worlds: ``build_env`` builds
them exactly as ``robotrl train`` builds ours (native MuJoCo, same seed, same number). RSL-RL
sees them through its ``VecEnv`` interface (``RslVecEnv``): observation group ``policy`` in a
``TensorDict``, done = terminated or truncated, ``time_outs`` = truncated and not terminated,
actions clipped to the bounds before the simulator as ours clips them. It trains
ceil(budget / rollout batch) iterations, logs to TensorBoard and checkpoints every
``checkpoint_interval`` iterations, as a user's run does.

What the mapping cannot make equal:
* RSL-RL has no reward scaling: give ``algo.reward_scaling=false`` to our cells (and here);
* RSL-RL's value loss is the squared error times ``value_loss_coef``, ours half of it times
  ``value_coef``: RSL-RL gets ``value_coef / 2``;
* RSL-RL clips the actor's and the critic's gradient norms separately, ours their joint norm;
  its adaptive lr uses the closed-form Gaussian KL, ours the k3 estimate; Adam eps 1e-8 against
  ours' 1e-5 (``PPOConfig`` switches ``clip_grad_per_network``, ``kl_estimator=gaussian``,
  ``adam_eps`` make ours match, ``tests/reference/test_rsl_rl.py``); it updates its observation
  normalizer after each update from the rollout, ours while acting; default torch
  initialisation against ours' orthogonal one.

Evaluations follow robotrl's protocol (``common.ours_eval``: ``episodes`` of our worlds seeded
from the run seed's ``eval-env`` stream, resets from ``eval-reset``; the actor's mean through
its normalizer, clipped to the bounds) every ``eval_every`` env steps and at the end;
``result.json`` is written last, atomically (``common.PeerCell``).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: no spin-wait stalls
HERE = Path(__file__).resolve().parent
# benchmarks/ (common) in place of this folder: this file would shadow the rsl_rl package
sys.path[:] = [str(HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() != HERE]

import torch  # noqa: E402
from common import PeerCell, ours_eval  # noqa: E402

from robotrl.config import TrainConfig  # noqa: E402
from robotrl.envs import BatchedEnv  # noqa: E402
from robotrl.experiment import build_env, compose, validate  # noqa: E402

RSL_VERSION = "5.5.1"
"""The rsl-rl-lib release this peer was written against (its config schema changes)."""

try:
    from rsl_rl.env import VecEnv
    from tensordict import TensorDict
except ImportError as exc:  # a benchmark-only peer: say how to get it
    raise SystemExit(f"the rsl_rl peer needs RSL-RL: pip install rsl-rl-lib=={RSL_VERSION} "
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
    if a.shared_backbone or a.state_dependent_std or tuple(a.critic_obs) != ("policy",):
        raise SystemExit("rsl_rl peer: the mapping covers separate actor/critic MLPs with a free "
                         "std on the policy group only")
    if a.clip_low != a.clip_high or a.lr_schedule not in ("adaptive", "fixed"):
        raise SystemExit("rsl_rl peer: RSL-RL has one clip width and the adaptive or fixed lr "
                         "schedule")
    if not a.normalize_advantages:
        raise SystemExit("rsl_rl peer: RSL-RL always normalizes advantages")
    model = dict(class_name="rsl_rl.models.MLPModel", activation=a.activation,
                 obs_normalization=a.normalize_obs)
    return {
        "num_steps_per_env": a.rollout_steps,
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


def main(argv: list[str]) -> int:
    from rsl_rl.runners import OnPolicyRunner

    cell = PeerCell.from_argv(argv, "rsl_rl")
    if cell.offline or cell.algo != "PPO":
        raise SystemExit(f"rsl_rl peer: online PPO only (got {cell.algo}"
                         f"{', a dataset' if cell.offline else ''})")
    overrides = list((cell.options.get("overrides") or {}).get(cell.our_algo) or [])
    cfg = compose([f"algo={cell.our_algo}", f"env={cell.target}", f"seed={cell.seed}",
                   f"total_steps={cell.budget}", f"eval_episodes={cell.episodes}",
                   f"run_dir={cell.run_dir}", *overrides])
    validate(cfg)
    if cfg.algo.reward_scaling:
        print("note: ours' config scales rewards (algo.reward_scaling=true); RSL-RL has no "
              "reward scaling, so the two differ there", flush=True)
    torch.set_num_threads(int(cell.options.get("torch_threads", 1)))
    torch.manual_seed(cfg.seed)
    env = RslVecEnv(build_env(cfg, cfg.num_envs, cfg.seed))
    train_cfg = rsl_train_cfg(cfg)
    batch = cfg.algo.rollout_steps * cfg.num_envs
    iterations = math.ceil(cell.budget / batch)
    print(f"RSL-RL {RSL_VERSION} PPO on {cfg.env.task}: {cfg.num_envs} worlds, {iterations} "
          f"iterations x {batch} = {iterations * batch:,} steps, seed {cfg.seed}, our config "
          f"with {overrides}\n{train_cfg}", flush=True)
    with open(cell.run_dir / "rsl_rl.log", "w") as log, contextlib.redirect_stdout(log):
        runner = OnPolicyRunner(env, train_cfg, log_dir=str(cell.run_dir), device="cpu")
        evaluation = ours_eval(cfg)

        def run() -> dict[str, float]:
            return evaluation(rsl_policy(runner.alg, env.low, env.high))

        done = [0]
        update = runner.alg.update

        def update_then_evaluate() -> dict[str, float]:
            metrics = update()
            done[0] += 1
            if cell.due(done[0] * batch):
                cell.evaluate(done[0] * batch, run)
            return metrics

        runner.alg.update = update_then_evaluate
        cell.start()
        runner.learn(num_learning_iterations=iterations)
        result = cell.finish(iterations * batch, run,
                             files={"rsl_rl_cfg.json": {"rsl_rl": RSL_VERSION,
                                                        "overrides": overrides,
                                                        "train_cfg": train_cfg}})
    final = result["final"]
    print(f"{result['step']:,} steps in {result['train_seconds']:.0f} s: return "
          f"{final['return_mean']:.1f} ± {final['return_std']:.1f} (best {final['best']:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
