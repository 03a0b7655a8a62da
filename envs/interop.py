"""robotrl's batched simulators inside other libraries' loops: a Gymnasium ``VectorEnv`` and a
Stable-Baselines3 ``VecEnv`` over any ``BatchedEnv`` (native MuJoCo, MJX, Gymnasium backend).

    envs = as_gymnasium_vector(make("hopper", 16))          # CleanRL-style loops, Gymnasium API
    vec = as_sb3_vecenv(make("hopper", 16))                 # stable_baselines3.PPO("MlpPolicy", vec)

Both expose the ``policy`` observation group (what a deployed controller sees) as a flat
float32 ``Box`` and the env's action bounds as the action ``Box``; NumPy in and out (the
Gymnasium adapter returns torch tensors on the env's device with ``torch_arrays=True``).

Autoreset: robotrl's backends reset a finished world inside the same ``step`` (the returned
observation is the new episode's first); the observation that ended the episode is kept apart.
That is Gymnasium's ``AutoresetMode.SAME_STEP`` (``metadata["autoreset_mode"]``:
``infos["final_obs"]``, an object array with the final observation of each finished world and
None elsewhere, masked by ``infos["_final_obs"]``; ``infos["final_info"]`` the finished worlds'
step info) and what SB3 expects (``infos[i]["terminal_observation"]``,
``infos[i]["TimeLimit.truncated"]``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from robotrl.envs.base import BatchedEnv

_SPACE = "policy"


def _spaces(env: BatchedEnv) -> tuple[Any, Any]:
    """(single observation space, single action space) of ``env`` as Gymnasium ``Box``es."""
    from gymnasium import spaces

    spec = env.spec
    obs = spaces.Box(-np.inf, np.inf, (spec.obs_dim,), np.float32)
    act = spaces.Box(spec.action_low.cpu().numpy().astype(np.float32),
                     spec.action_high.cpu().numpy().astype(np.float32), dtype=np.float32)
    return obs, act


def _step_info(info: dict[str, Any]) -> dict[str, np.ndarray]:
    """The per-world entries of a robotrl step ``info`` as NumPy arrays: ``success``,
    ``goal_distance`` where the task has them, and ``reward/<term>`` for each reward term."""
    out = {k: info[k].cpu().numpy() for k in ("success", "goal_distance") if k in info}
    out.update({f"reward/{k}": v.cpu().numpy() for k, v in info.get("reward_terms", {}).items()})
    return out


def _actions(env: BatchedEnv, actions: Any) -> torch.Tensor:
    """``actions`` ([N, action_dim], NumPy or torch) as the env's float32 tensor, checked."""
    a = torch.as_tensor(actions, dtype=torch.float32, device=env.device)
    want = (env.num_envs, env.spec.action_dim)
    if a.shape != want:
        raise ValueError(f"actions must have shape {want} (num_envs, action_dim), got "
                         f"{tuple(a.shape)}")
    if not bool(torch.isfinite(a).all()):
        raise ValueError("actions contain NaN or infinite values")
    return a


AUTORESET_MODES = ("same_step", "next_step")


def as_gymnasium_vector(env: BatchedEnv, torch_arrays: bool = False,
                        autoreset_mode: str = "same_step") -> Any:
    """``env`` as a ``gymnasium.vector.VectorEnv``. Observations, rewards, terminations and
    truncations are NumPy arrays ([N, obs_dim] float32, [N] float64, [N] bool), or torch
    tensors on ``env.device`` with ``torch_arrays=True``.

    ``autoreset_mode``: "same_step" (what the backends do; ``final_obs`` in ``infos``) or
    "next_step" (Gymnasium's default, which its vector observation wrappers such as
    ``NormalizeObservation`` require): a finished world returns its final observation, and the
    next step ignores its action and returns the new episode's first observation with reward
    0, emulated by restoring the world's reset snapshot after that step."""
    from gymnasium.utils import seeding
    from gymnasium.vector import AutoresetMode, VectorEnv
    from gymnasium.vector.utils import batch_space

    if autoreset_mode not in AUTORESET_MODES:
        raise ValueError(f"unknown autoreset_mode {autoreset_mode!r}; known: "
                         f"{list(AUTORESET_MODES)}")
    next_step = autoreset_mode == "next_step"

    class _Vector(VectorEnv):
        metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP if next_step
                    else AutoresetMode.SAME_STEP,
                    "render_modes": ["rgb_array"] if hasattr(env, "render") else []}

        def __init__(self) -> None:
            self.env = env
            self.num_envs = env.num_envs
            self.single_observation_space, self.single_action_space = _spaces(env)
            self.observation_space = batch_space(self.single_observation_space, self.num_envs)
            self.action_space = batch_space(self.single_action_space, self.num_envs)
            self.render_mode = "rgb_array" if hasattr(env, "render") else None
            self.torch_arrays = torch_arrays
            self._pending = torch.zeros(env.num_envs, dtype=torch.bool, device=env.device)
            """next_step: worlds whose episode ended at the last step (now at their reset)."""

        def _out(self, x: torch.Tensor, dtype: Any) -> Any:
            return x if self.torch_arrays else x.cpu().numpy().astype(dtype, copy=False)

        def reset(self, *, seed: int | None = None,
                  options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
            if options:
                raise ValueError(f"reset options are not supported (got {sorted(options)}); "
                                 "give task options to robotrl.envs.make")
            if seed is not None:
                self._np_random, self._np_random_seed = seeding.np_random(seed)
            obs = self.env.reset(seed=seed)[_SPACE]
            self._pending.zero_()
            return self._out(obs, np.float32), {}

        def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
            action = _actions(self.env, actions)
            if next_step:
                return self._step_next(action)
            out = self.env.step(action)
            done = (out.terminated | out.truncated).cpu().numpy()
            step = _step_info(out.info)
            infos: dict[str, Any] = {}
            for key, value in step.items():
                infos[key], infos[f"_{key}"] = value, np.ones(self.num_envs, dtype=bool)
            if done.any():
                final = out.info["final_obs"][_SPACE].cpu().numpy().astype(np.float32)
                final_obs = np.full(self.num_envs, None, dtype=object)
                final_info: dict[str, Any] = {}
                for i in np.flatnonzero(done):
                    final_obs[i] = final[i]
                for key, value in step.items():
                    final_info[key] = np.where(done, value, np.zeros_like(value))
                    final_info[f"_{key}"] = done.copy()
                infos.update(final_obs=final_obs, _final_obs=done.copy(),
                             final_info=final_info, _final_info=done.copy())
            return (self._out(out.obs[_SPACE], np.float32), self._out(out.reward, np.float64),
                    self._out(out.terminated, np.bool_), self._out(out.truncated, np.bool_),
                    infos)

        def _step_next(self, action: torch.Tensor) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
            """NEXT_STEP: worlds ended last step are put back at their reset state after this
            step (their action is ignored) and report their first observation, reward 0."""
            pending = self._pending.clone()
            rows = pending.nonzero().flatten()
            if len(rows):
                reset_state = self.env.get_state()[rows]
                reset_obs = self.env.observe()[_SPACE][rows]
            out = self.env.step(action)
            if len(rows):
                self.env.set_state(reset_state, env_ids=rows)
            done = out.terminated | out.truncated
            obs = torch.where(done[:, None], out.info["final_obs"][_SPACE], out.obs[_SPACE])
            reward, terminated, truncated = out.reward.clone(), out.terminated, out.truncated
            if len(rows):
                obs[rows] = reset_obs
                reward[rows] = 0.0
                terminated, truncated = terminated & ~pending, truncated & ~pending
            self._pending = terminated | truncated
            live = (~pending).cpu().numpy()
            infos: dict[str, Any] = {}
            for key, value in _step_info(out.info).items():
                infos[key], infos[f"_{key}"] = np.where(live, value, np.zeros_like(value)), live
            return (self._out(obs, np.float32), self._out(reward, np.float64),
                    self._out(terminated, np.bool_), self._out(truncated, np.bool_), infos)

        def render(self) -> tuple[np.ndarray, ...] | None:
            if self.render_mode is None:
                return None
            return tuple(self.env.render(i) for i in range(self.num_envs))

        def close_extras(self, **kwargs: Any) -> None:
            close = getattr(self.env, "close", None)
            if close is not None:
                close()

    return _Vector()


def as_sb3_vecenv(env: BatchedEnv, monitor: bool = True) -> Any:
    """``env`` as a Stable-Baselines3 ``VecEnv``: NumPy observations [N, obs_dim] float32,
    rewards [N] float32, ``dones`` [N] bool, and per-world infos with ``terminal_observation``
    and ``TimeLimit.truncated`` (truncated and not terminated) where an episode ended, plus the
    step's ``success`` / ``goal_distance`` / ``reward/<term>`` values. ``monitor`` wraps it in
    SB3's ``VecMonitor``, so episode returns reach SB3's logger and ``evaluate_policy``."""
    try:
        from stable_baselines3.common.vec_env import VecEnv, VecMonitor
    except ImportError as err:
        raise ImportError("as_sb3_vecenv needs Stable-Baselines3: pip install "
                          "'robotrl[dev]' (or stable-baselines3)") from err

    class _SB3(VecEnv):
        render_mode = "rgb_array" if hasattr(env, "render") else None

        def __init__(self) -> None:
            self.env = env
            observation_space, action_space = _spaces(env)
            super().__init__(env.num_envs, observation_space, action_space)
            self._actions: torch.Tensor | None = None

        def reset(self) -> np.ndarray:
            seed = self._seeds[0]  # seed(s) gives world i the seed s + i: one stream for all
            obs = self.env.reset(seed=seed)[_SPACE].cpu().numpy().astype(np.float32)
            self._reset_seeds()
            self._reset_options()
            return obs

        def step_async(self, actions: np.ndarray) -> None:
            self._actions = _actions(self.env, actions)

        def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
            if self._actions is None:
                raise RuntimeError("step_wait() called without step_async()")
            out = self.env.step(self._actions)
            self._actions = None
            terminated = out.terminated.cpu().numpy()
            truncated = out.truncated.cpu().numpy()
            done = terminated | truncated
            step = _step_info(out.info)
            infos: list[dict[str, Any]] = [{k: v[i] for k, v in step.items()}
                                           for i in range(self.num_envs)]
            if done.any():
                final = out.info["final_obs"][_SPACE].cpu().numpy().astype(np.float32)
                for i in np.flatnonzero(done):
                    infos[i]["terminal_observation"] = final[i]
                    infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            return (out.obs[_SPACE].cpu().numpy().astype(np.float32),
                    out.reward.cpu().numpy().astype(np.float32), done, infos)

        def close(self) -> None:
            close = getattr(self.env, "close", None)
            if close is not None:
                close()

        def get_images(self) -> list[np.ndarray | None]:
            if self.render_mode is None:
                return [None] * self.num_envs
            return [self.env.render(i) for i in range(self.num_envs)]

        def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
            value = getattr(self, attr_name) if attr_name == "render_mode" else getattr(
                self.env, attr_name)
            return [value for _ in self._get_indices(indices)]

        def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
            raise AttributeError(f"set_attr({attr_name!r}): the worlds of a robotrl env share "
                                 "one simulator; change it with robotrl.envs.make options")

        def env_method(self, method_name: str, *method_args: Any, indices: Any = None,
                       **method_kwargs: Any) -> list[Any]:
            raise AttributeError(f"env_method({method_name!r}): the worlds of a robotrl env "
                                 "are one batched simulator, not separate Gymnasium envs")

        def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
            return [False for _ in self._get_indices(indices)]

    vec = _SB3()
    return VecMonitor(vec) if monitor else vec
