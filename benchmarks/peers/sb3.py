"""Stable-Baselines3 and sb3-contrib as a ``robotrl bench`` peer: PPO, SAC, TD3 (SB3), TRPO and
CrossQ (sb3-contrib) on the Gymnasium MuJoCo env of the cell's task (``task_class(task).gym_id``,
the ``*-v5`` envs ours reproduce), seeded with the cell's seed, one torch thread.

    python benchmarks/peers/sb3.py CELL.json          # what robotrl bench run does per cell

    peers:                                            # in a grid (benchmarks/grids/*.yaml)
      sb3:
        script: benchmarks/peers/sb3.py
        algos: {ppo: PPO, trpo: TRPO, sac: SAC, crossq: CrossQ}   # TD3 too
        options:
          episodes: 10          # evaluation episodes (default 10, robotrl's eval_episodes)
          eval_every: 100000    # env steps between evaluations (default: budget / 10)
          torch_threads: 1      # (default 1)
          n_envs: 8             # SB3 sub-envs of a matched on-policy config (default: ours' num_envs)
          overrides: {ppo: [algo.reward_scaling=false]}   # our algo -> its cells' overrides
          hyperparams: {SAC: {learning_starts: 10000, tasks: {hopper: {gamma: 0.99}}}}

Hyperparameters, each step over the one before:

1. ``options.overrides`` names our algorithm (PPO and TRPO): SB3 gets *our* config, composed as
   ``robotrl train algo=<ours> env=<task> <overrides>`` composes it (``configs/tuned/``
   included), mapped onto SB3's arguments (``ppo_from_ours``, ``trpo_from_ours``: the same
   networks, rollout batch over ``n_envs`` sub-envs, minibatches, epochs, discount, GAE, clip
   or trust region and its schedule; ``VecNormalize`` for ours' observation normalization and
   reward scaling).
   ``n_envs`` defaults to ours' ``num_envs``, so SB3 collects the same shape of rollout: the
   batch alone is not enough, since GAE stops at the rollout's end and bootstraps from the
   critic there (128 worlds x 16 steps leave about 60% of its weight on Walker2d to the critic,
   8 x 256 about 6%).
   Otherwise rl-baselines3-zoo's MuJoCo hyperparameters (``ZOO_HP`` below, each entry naming
   its file), else SB3's defaults.
2. ``options.hyperparams[ALGO]``, then its ``tasks[<task>]``: SB3 constructor arguments, plus
   ``n_envs``, ``normalize`` (true, or ``VecNormalize`` arguments), ``noise_type: normal`` and
   ``noise_std`` (TD3's action noise, as the zoo writes it); ``policy_kwargs.activation_fn`` is
   a name (``relu``, ``tanh``, ``nn.ReLU``) and ``learning_rate: lin_3e-4`` the zoo's linear
   schedule.

The resolved arguments, where they come from and what the mapping cannot make equal go to
``hyperparams.json`` in the run directory. Evaluations follow robotrl's protocol
(``common.sb3_eval``: ``episodes`` Gymnasium worlds seeded from the run seed's ``eval-env``
stream, resets from ``eval-reset``, deterministic actions, observations normalized with the
frozen ``VecNormalize`` statistics) every ``eval_every`` env steps and at the end;
``result.json`` is written last, atomically (``common.PeerCell``).

An off-policy cell (SAC, TD3, CrossQ; without ``normalize``) saves its state at every evaluation
(``PeerCell.save_state``) and, run again after an interruption, resumes from it exactly, as if
never stopped: the networks, optimizers and entropy coefficient, the replay buffer, the counters,
every random generator, and the worlds mid-episode, put back by replaying the episode in progress
from its reset (``Replayable``; MuJoCo is deterministic), the replayed observation checked
against the saved one bit for bit. An on-policy cell starts over.
"""

from __future__ import annotations

import copy
import math
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: no spin-wait stalls
HERE = Path(__file__).resolve().parent
# benchmarks/ (common) in place of this folder, whose file names shadow packages (rsl_rl.py)
sys.path[:] = [str(HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() != HERE]

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import PeerCell, plain, sb3_eval, sb3_policy  # noqa: E402
from torch import nn  # noqa: E402

from robotrl.envs.registry import task_class  # noqa: E402
from robotrl.nn.mlp import ACTIVATIONS  # noqa: E402

ALGOS = {"PPO": "stable_baselines3", "SAC": "stable_baselines3", "TD3": "stable_baselines3",
         "TRPO": "sb3_contrib", "CrossQ": "sb3_contrib"}
"""The algorithms this peer runs -> the package that has them."""
ON_POLICY = ("PPO", "TRPO")
SPECIAL = ("n_envs", "normalize", "noise_type", "noise_std", "target_kl_schedule")
"""Hyperparameter keys that are not constructor arguments (see the module docstring)."""

# ---------------------------------------------------------------------------- rl-zoo defaults
# rl-baselines3-zoo (github.com/DLR-RM/rl-baselines3-zoo), hyperparams/<algo>.yml, the MuJoCo
# entries (-v4 there, -v5 here: the same tasks); n_timesteps and policy: MlpPolicy left out.
_ZOO_PPO_POLICY = {"log_std_init": -2, "ortho_init": False, "activation_fn": "relu",
                   "net_arch": {"pi": [256, 256], "vf": [256, 256]}}
# hyperparams/trpo.yml: the MuJoCo entries are "<<: *pybullet-defaults" (HalfCheetahBulletEnv-v0)
_ZOO_TRPO = {"normalize": True, "n_envs": 2, "batch_size": 128, "n_steps": 1024, "gamma": 0.99,
             "gae_lambda": 0.95, "sub_sampling_factor": 1, "cg_max_steps": 25, "cg_damping": 0.1,
             "n_critic_updates": 20, "learning_rate": 1e-3}
# hyperparams/td3.yml, "HalfCheetah-v4: &mujoco-defaults"
_ZOO_TD3 = {"learning_starts": 10_000, "noise_type": "normal", "noise_std": 0.1, "train_freq": 1,
            "gradient_steps": 1, "learning_rate": 1e-3, "batch_size": 256,
            "policy_kwargs": {"net_arch": [400, 300]}}
# hyperparams/crossq.yml, "HalfCheetah-v4: &mujoco-defaults"
_ZOO_CROSSQ = {"buffer_size": 1_000_000, "learning_rate": 1e-3, "learning_starts": 5000,
               "policy_delay": 3,
               "policy_kwargs": {"net_arch": {"pi": [256, 256], "qf": [2048, 2048]}}}
_LOCOMOTION = ("ant", "halfcheetah", "hopper", "humanoid", "walker2d")
ZOO_HP: dict[str, dict[str, dict[str, Any]]] = {
    # hyperparams/ppo.yml, the tuned HalfCheetah-v4, Hopper-v4 and Walker2d-v4 entries
    "PPO": {
        "halfcheetah": {"normalize": True, "n_envs": 1, "batch_size": 64, "n_steps": 512,
                        "gamma": 0.98, "learning_rate": 2.0633e-05, "ent_coef": 0.000401762,
                        "clip_range": 0.1, "n_epochs": 20, "gae_lambda": 0.92,
                        "max_grad_norm": 0.8, "vf_coef": 0.58096,
                        "policy_kwargs": _ZOO_PPO_POLICY},
        "hopper": {"normalize": True, "n_envs": 1, "batch_size": 32, "n_steps": 512,
                   "gamma": 0.999, "learning_rate": 9.80828e-05, "ent_coef": 0.00229519,
                   "clip_range": 0.2, "n_epochs": 5, "gae_lambda": 0.99, "max_grad_norm": 0.7,
                   "vf_coef": 0.835671, "policy_kwargs": _ZOO_PPO_POLICY},
        "walker2d": {"normalize": True, "n_envs": 1, "batch_size": 32, "n_steps": 512,
                     "gamma": 0.99, "learning_rate": 5.05041e-05, "ent_coef": 0.000585045,
                     "clip_range": 0.1, "n_epochs": 20, "gae_lambda": 0.95, "max_grad_norm": 1,
                     "vf_coef": 0.871923},
    },
    "TRPO": {**{t: _ZOO_TRPO for t in _LOCOMOTION},
             "halfcheetah": {**_ZOO_TRPO, "target_kl": 0.04},
             "swimmer": {**_ZOO_TRPO, "gamma": 0.9999}},
    # hyperparams/sac.yml, "HalfCheetah-v3: &mujoco-defaults" (SB3's defaults otherwise)
    "SAC": {**{t: {"learning_starts": 10_000} for t in _LOCOMOTION},
            "swimmer": {"learning_starts": 10_000, "gamma": 0.9999}},
    "TD3": {t: _ZOO_TD3 for t in (*_LOCOMOTION, "swimmer")},
    "CrossQ": {**{t: _ZOO_CROSSQ for t in _LOCOMOTION},
               "swimmer": {**_ZOO_CROSSQ, "gamma": 0.999}},
}
"""SB3 algorithm -> task -> rl-baselines3-zoo's hyperparameters (plain values, as in YAML)."""


# ---------------------------------------------------------------------------- ours, mapped
def _rollout(algo: Any, num_envs: int, n_envs: int) -> tuple[int, int, list[str]]:
    """(ours' rollout batch, SB3's ``n_steps`` collecting it over ``n_envs`` sub-envs, notes)."""
    batch = algo.rollout_steps * num_envs
    n_steps = max(1, round(batch / n_envs))
    notes = [] if n_steps * n_envs == batch else [
        f"rollout batch {batch} is not a multiple of n_envs {n_envs}: SB3 collects "
        f"{n_steps * n_envs}"]
    return batch, n_steps, notes


def _on_policy_common(algo: Any, n_envs: int) -> tuple[dict[str, Any], list[str]]:
    """What PPO and TRPO map alike: networks, observation/reward normalization, std."""
    notes = []
    if algo.state_dependent_std:
        notes.append("SB3's MlpPolicy has a state-independent log std")
    if algo.min_action_std > 0:
        notes.append(f"SB3 has no floor on the action std (ours: {algo.min_action_std:.3g})")
    hp: dict[str, Any] = {
        "n_envs": n_envs,
        "policy_kwargs": {"net_arch": {"pi": list(algo.actor_hidden),
                                       "vf": list(algo.critic_hidden)},
                          "activation_fn": algo.activation, "log_std_init": algo.init_log_std,
                          "ortho_init": True},
        # ours' running observation normalization and reward scaling, both clipped at 10
        "normalize": ({"norm_obs": algo.normalize_obs, "norm_reward": algo.reward_scaling,
                       "gamma": algo.gamma, "clip_obs": 10.0, "clip_reward": 10.0}
                      if algo.normalize_obs or algo.reward_scaling else False),
    }
    return hp, notes


def ppo_from_ours(cfg: Any, n_envs: int, act_dim: int = 0) -> tuple[dict[str, Any], list[str]]:
    """SB3 ``PPO`` arguments as close to ours' composed ``cfg`` as SB3 allows, and what
    differs. SB3's value loss is the plain MSE where ours is half of it: ``vf_coef =
    value_coef / 2``."""
    algo = cfg.algo
    hp, notes = _on_policy_common(algo, n_envs)
    batch, n_steps, more = _rollout(algo, cfg.num_envs, n_envs)
    notes += more
    if algo.clip_low != algo.clip_high:
        notes.append(f"SB3 clips symmetrically: clip_range = clip_low = {algo.clip_low}")
    lr: float | str = algo.learning_rate
    if algo.lr_schedule == "linear":  # SB3's progress_remaining is ours' linear factor
        lr = f"lin_{algo.learning_rate}"
    elif algo.lr_schedule == "adaptive":
        notes.append(f"SB3 has no KL-adaptive learning rate: fixed at {algo.learning_rate}")
    if algo.shared_backbone:
        notes.append("SB3 >= 1.8 has no shared trunk: separate pi/vf networks")
    hp.update(learning_rate=lr, n_steps=n_steps, batch_size=batch // algo.num_minibatches,
              n_epochs=algo.num_epochs, gamma=algo.gamma, gae_lambda=algo.gae_lambda,
              clip_range=algo.clip_low, clip_range_vf=algo.value_clip or None,
              normalize_advantage=algo.normalize_advantages, ent_coef=algo.entropy_coef,
              vf_coef=algo.value_coef / 2, max_grad_norm=algo.max_grad_norm or math.inf)
    return hp, notes


def trpo_from_ours(cfg: Any, n_envs: int, act_dim: int) -> tuple[dict[str, Any], list[str]]:
    """``sb3_contrib.TRPO`` arguments equal to ours' composed ``cfg`` where it has them, and
    the notes. One rollout of ours (rollout_steps x num_envs) is one of SB3 (n_steps x n_envs); the
    critic sees the same minibatch size and passes. sb3-contrib averages the KL over action
    dimensions where ours sums them, so its trust region and its Fisher matrix are ours over
    ``act_dim``: ``target_kl = kl_bound(act_dim) / act_dim``, ``cg_damping = ours / act_dim``
    (tests/reference/test_sb3_contrib.py matches the two update for update so)."""
    algo = cfg.algo
    hp, notes = _on_policy_common(algo, n_envs)
    batch, n_steps, more = _rollout(algo, cfg.num_envs, n_envs)
    notes += more
    if algo.fvp_fraction < 1:
        notes.append(f"ours computes the Fisher-vector products on {algo.fvp_fraction:g} of the "
                     "rollout; sb3-contrib on all of it (its sub_sampling_factor would subsample "
                     "the gradient and line search too)")
    if not algo.reverse_kl:
        notes.append("ours' line search bounds KL(old || new), sb3-contrib's KL(new || old) "
                     "(the same Fisher matrix; ours' reverse_kl=true is sb3-contrib's order)")
    hp.update(learning_rate=algo.critic_lr, n_steps=n_steps,
              batch_size=batch // algo.critic_minibatches, gamma=algo.gamma,
              gae_lambda=algo.gae_lambda, cg_max_steps=algo.cg_iters,
              cg_damping=algo.cg_damping / act_dim,
              line_search_shrinking_factor=algo.backtrack,
              line_search_max_iter=algo.line_search_steps, n_critic_updates=algo.critic_epochs,
              normalize_advantage=algo.normalize_advantages,
              target_kl=algo.kl_bound(act_dim) / act_dim)
    if algo.kl_schedule != "fixed":  # applied before each update by anneal_target_kl
        hp["target_kl_schedule"] = algo.kl_schedule
    return hp, notes


def anneal_target_kl(model: Any, hp: dict[str, Any], budget: int) -> None:
    """Set an sb3-contrib TRPO's ``target_kl`` for the update its rollout (just collected) is
    about to make: ``hp['target_kl']`` scaled by ours' ``KL_SCHEDULES[target_kl_schedule]`` at
    the fraction of ``budget`` done, the fraction ours' runner passes to that update."""
    schedule = hp.get("target_kl_schedule")
    if schedule is not None:
        from robotrl.algos.trpo import KL_SCHEDULES

        model.target_kl = hp["target_kl"] * KL_SCHEDULES[schedule](model.num_timesteps / budget)


MAPPINGS: dict[str, Callable[[Any, int, int], tuple[dict[str, Any], list[str]]]] = {
    "PPO": ppo_from_ours, "TRPO": trpo_from_ours}
"""SB3 algorithms that can take our composed config."""


# ---------------------------------------------------------------------------- hyperparameters
def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s keys; ``policy_kwargs`` merged key by key."""
    out = {**base, **over}
    if isinstance(base.get("policy_kwargs"), dict) and isinstance(over.get("policy_kwargs"), dict):
        out["policy_kwargs"] = {**base["policy_kwargs"], **over["policy_kwargs"]}
    return out


def hyperparameters(cell: PeerCell, act_dim: int) -> tuple[dict[str, Any], str, list[str]]:
    """(plain hyperparameters, where they come from, notes) of the cell (module docstring)."""
    algo, task, options = cell.algo, cell.target, cell.options
    given = dict((options.get("hyperparams") or {}).get(algo) or {})
    per_task = dict((given.pop("tasks", None) or {}).get(task) or {})
    given = _merge(given, per_task)
    overrides = (options.get("overrides") or {}).get(cell.our_algo)
    notes: list[str] = []
    if overrides is not None:
        if algo not in MAPPINGS:
            raise SystemExit(f"sb3 peer: {algo} cannot take our config (options.overrides."
                             f"{cell.our_algo}); give options.hyperparams.{algo} instead")
        from robotrl.experiment import compose

        cfg = compose([f"algo={cell.our_algo}", f"env={task}", f"seed={cell.seed}",
                       f"total_steps={cell.budget}", *overrides])
        n_envs = int(given.get("n_envs", options.get("n_envs", cfg.num_envs)))
        hp, notes = MAPPINGS[algo](cfg, n_envs, act_dim)
        source = (f"robotrl's composed config (algo={cell.our_algo} env={task} "
                  f"{' '.join(overrides)}) mapped onto {algo}")
    elif task in ZOO_HP.get(algo, {}):
        hp = copy.deepcopy(ZOO_HP[algo][task])
        source = f"rl-baselines3-zoo hyperparams/{algo.lower()}.yml ({task})"
    else:
        hp, source = {}, f"{ALGOS[algo]} defaults"
    if given:
        source += f", then options.hyperparams.{algo}: {sorted(given)}"
    return _merge(hp, given), source, notes


def _activation(name: Any) -> type[nn.Module]:
    if not isinstance(name, str):
        return name
    key = name.removeprefix("nn.").removeprefix("th.nn.")
    for k, cls in ACTIVATIONS.items():
        if key.lower() in (k, cls.__name__.lower()):
            return cls
    if hasattr(nn, key):
        return getattr(nn, key)
    raise SystemExit(f"sb3 peer: unknown activation {name!r}; known: {sorted(ACTIVATIONS)}")


def constructor_kwargs(hp: dict[str, Any], act_dim: int) -> dict[str, Any]:
    """SB3's constructor arguments of plain ``hp`` (the ``SPECIAL`` keys dropped)."""
    kwargs = {k: copy.deepcopy(v) for k, v in hp.items() if k not in SPECIAL}
    lr = kwargs.get("learning_rate")
    if isinstance(lr, str) and lr.startswith("lin_"):
        initial = float(lr.removeprefix("lin_"))
        kwargs["learning_rate"] = lambda remaining: initial * remaining
    pk = kwargs.get("policy_kwargs")
    if isinstance(pk, dict) and "activation_fn" in pk:
        pk["activation_fn"] = _activation(pk["activation_fn"])
    if hp.get("noise_type"):
        from stable_baselines3.common.noise import NormalActionNoise

        if hp["noise_type"] != "normal":
            raise SystemExit(f"sb3 peer: noise_type {hp['noise_type']!r}: only 'normal'")
        kwargs["action_noise"] = NormalActionNoise(np.zeros(act_dim),
                                                   float(hp.get("noise_std", 0.1)) * np.ones(act_dim))
    return kwargs


def _zoo_ppo() -> dict[str, dict[str, Any]]:
    """``ZOO``: the PPO entries as SB3 arguments plus ``n_envs`` (normalize: always true)."""
    return {t: {**constructor_kwargs(hp, 0), "n_envs": hp["n_envs"]}
            for t, hp in ZOO_HP["PPO"].items()}


ZOO = _zoo_ppo()
"""rl-baselines3-zoo's PPO on our tasks as ``PPO(**ZOO[task] minus n_envs)`` arguments, each
with ``VecNormalize(gamma=gamma)`` (``benchmarks/sb3_interop.py``)."""


# ---------------------------------------------------------------------------- resuming
class Replayable(gym.Wrapper):
    """Passes everything through, keeping what replays the episode in progress on a fresh world
    of the same kind: its reset's seed, options and world RNG state before it, and the actions
    since."""

    def _rng(self, state: Any = None) -> Any:
        """The world RNG's state (``state`` given: restore it). A ``Generator``'s bit generator,
        or a legacy ``RandomState`` (dm_control's task RNG, which Shimmy's envs expose)."""
        rng = self.unwrapped.np_random
        if isinstance(rng, np.random.RandomState):
            return rng.get_state() if state is None else rng.set_state(tuple(state))
        if state is None:
            return copy.deepcopy(rng.bit_generator.state)
        rng.bit_generator.state = state

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.episode = {"seed": seed, "options": options, "rng": self._rng()}
        self.actions: list[np.ndarray] = []
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        self.actions.append(np.array(action, copy=True))
        return self.env.step(action)

    def saved(self) -> dict[str, Any]:
        """This world's episode in progress, as ``replay`` takes it."""
        return {**self.episode, "actions": self.actions}

    def replay(self, episode: dict[str, Any]) -> Any:
        """Reset and step as the ``saved`` episode did; the last observation."""
        self._rng(episode["rng"])
        obs, _ = self.reset(seed=episode["seed"], options=episode["options"])
        for action in episode["actions"]:
            obs = self.step(action)[0]
        return obs


def resumable(model: Any, norm: Any) -> bool:
    """Whether ``sb3_state`` can save ``model`` mid-run: an off-policy learner with a plain
    replay buffer, a fixed number of gradient steps per rollout, unnormalized worlds."""
    from stable_baselines3.common.buffers import ReplayBuffer

    return (type(getattr(model, "replay_buffer", None)) is ReplayBuffer and norm is None
            and model.gradient_steps > 0)


BUFFER = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")


def sb3_state(model: Any) -> dict[str, Any]:
    """What puts an off-policy ``model`` (and its ``DummyVecEnv`` of ``Replayable`` worlds)
    back where it is, at the end of a rollout, as data."""
    from stable_baselines3.common.save_util import recursive_getattr

    modules, variables = model._get_torch_save_params()
    rb = model.replay_buffer
    rows = rb.buffer_size if rb.full else rb.pos
    return {
        "modules": {name: recursive_getattr(model, name).state_dict() for name in modules},
        "variables": {name: recursive_getattr(model, name).detach().clone()
                      for name in variables},
        "buffer": {"pos": int(rb.pos), "full": bool(rb.full),
                   **{f: getattr(rb, f)[:rows] for f in BUFFER if getattr(rb, f, None) is not None}},
        "counters": {"num_timesteps": int(model.num_timesteps), "n_updates": int(model._n_updates),
                     "episode_num": int(model._episode_num),
                     "progress_remaining": float(model._current_progress_remaining)},
        "last_obs": np.array(model._last_obs),
        "worlds": [world.saved() for world in model.get_env().envs],
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                "python": random.getstate(),
                "action_space": copy.deepcopy(model.action_space.np_random.bit_generator.state)},
    }


def restore(model: Any, state: dict[str, Any]) -> None:
    """Put ``model`` and its worlds back as ``sb3_state`` saved them; ``ValueError`` if the
    replayed worlds do not reach the saved observation bit for bit."""
    from stable_baselines3.common.save_util import recursive_getattr

    venv = model.get_env()
    last = np.stack([world.replay(episode) for world, episode in
                     zip(venv.envs, state["worlds"], strict=True)])
    if not np.array_equal(last, state["last_obs"]):
        raise ValueError("the replayed worlds do not reach the saved observation")
    for reset in ("_reset_seeds", "_reset_options"):  # used by a venv.reset() only: once
        getattr(venv, reset, lambda: None)()
    for name, values in state["modules"].items():
        recursive_getattr(model, name).load_state_dict(values)
    for name, value in state["variables"].items():
        with torch.no_grad():
            recursive_getattr(model, name).copy_(value)
    rb, buffer = model.replay_buffer, state["buffer"]
    for field in BUFFER:
        if field in buffer:
            getattr(rb, field)[:len(buffer[field])] = buffer[field]
    rb.pos, rb.full = buffer["pos"], buffer["full"]
    counters = state["counters"]
    model.num_timesteps = counters["num_timesteps"]
    model._n_updates = counters["n_updates"]
    model._episode_num = counters["episode_num"]
    model._current_progress_remaining = counters["progress_remaining"]
    model._last_obs = last
    rng = state["rng"]
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    model.action_space.np_random.bit_generator.state = rng["action_space"]


# ---------------------------------------------------------------------------- the cell
def algorithm_class(algo: str) -> Any:
    if algo not in ALGOS:
        raise SystemExit(f"sb3 peer: unknown algorithm {algo!r} (grid key peers.<name>.algos); "
                         f"known: {sorted(ALGOS)}")
    import importlib

    return getattr(importlib.import_module(ALGOS[algo]), algo)


def main(argv: list[str]) -> int:
    from importlib.metadata import version

    import gymnasium as gym
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    cell = PeerCell.from_argv(argv, "sb3")
    if cell.offline:
        raise SystemExit("sb3 peer: online algorithms only (the grid has datasets)")
    cls = algorithm_class(cell.algo)
    torch.set_num_threads(int(cell.options.get("torch_threads", 1)))
    gym_id = task_class(cell.target).gym_id
    probe = gym.make(gym_id)
    act_dim = int(probe.action_space.shape[0])
    probe.close()
    hp, source, notes = hyperparameters(cell, act_dim)
    off_policy = cell.algo not in ON_POLICY
    venv = make_vec_env(gym_id, n_envs=int(hp.get("n_envs", 1)), seed=cell.seed,
                        wrapper_class=Replayable if off_policy else None)
    norm = None
    if hp.get("normalize"):
        settings = hp["normalize"] if isinstance(hp["normalize"], dict) else {}
        venv = norm = VecNormalize(venv, **{"gamma": hp.get("gamma", 0.99), **settings})
    model = cls("MlpPolicy", venv, seed=cell.seed, device="cpu", verbose=0,
                **constructor_kwargs(hp, act_dim))
    print(f"{cell.algo} ({ALGOS[cell.algo]}) on {gym_id}, seed {cell.seed}, "
          f"{cell.budget:,} steps; hyperparameters: {source}\n{plain(hp)}", flush=True)
    for note in notes:
        print(f"note: {note}", flush=True)
    saves = off_policy and resumable(model, norm)
    saved = cell.load_state() if saves else None
    if saved is not None:
        try:
            restore(model, saved[1])
        except ValueError as err:  # a world that replays otherwise (another MuJoCo build)
            raise SystemExit(f"sb3 peer: cannot resume from {cell.run_dir / cell.STATE}: {err}; "
                             "delete it to start over") from None
    evaluation = sb3_eval(cell.target, cell.episodes, cell.seed)

    def run() -> dict[str, float]:
        return evaluation(sb3_policy(model, norm))

    class Evaluations(BaseCallback):
        save = False

        def _on_training_start(self) -> None:
            # the update the interrupted run made after saving, at the end of its rollout
            if saved is not None and model.num_timesteps > model.learning_starts:
                model.train(batch_size=model.batch_size, gradient_steps=model.gradient_steps)

        def _on_step(self) -> bool:
            if cell.due(self.num_timesteps):
                cell.evaluate(self.num_timesteps, run)
                self.save = saves and self.num_timesteps < cell.budget
            return True

        def _on_rollout_end(self) -> None:
            anneal_target_kl(model, hp, cell.budget)
            if self.save:  # the rollout's transitions stored, its update not yet made
                cell.save_state(self.num_timesteps, sb3_state(model))
                self.save = False

    cell.start()
    model.learn(total_timesteps=cell.budget - model.num_timesteps, callback=Evaluations(),
                reset_num_timesteps=saved is None)
    record = {"algo": cell.algo, "gym_id": gym_id, "source": source, "notes": notes,
              "hyperparams": plain(hp), "package": f"{ALGOS[cell.algo]} {version(ALGOS[cell.algo])}"}
    result = cell.finish(model.num_timesteps, run, files={"hyperparams.json": record})
    venv.close()
    final = result["final"]
    print(f"{model.num_timesteps:,} steps in {result['train_seconds']:.0f} s: return "
          f"{final['return_mean']:.1f} ± {final['return_std']:.1f} (best {final['best']:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
