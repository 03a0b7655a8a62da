"""Gymnasium backend: any Gymnasium id or ``gymnasium.vector.VectorEnv`` as a ``BatchedEnv``.

    env = GymnasiumEnv("Pendulum-v1", num_envs=8)             # built with gymnasium.make_vec
    env = GymnasiumEnv(my_vector_env, my_vector_env.num_envs)  # a user's own vector env

Gymnasium's vector envs reset finished sub-envs in one of three modes
(https://farama.org/Vector-Autoreset-Mode). The protocol needs the reset in the same ``step``
with the last observation kept, so envs built here use ``AutoresetMode.SAME_STEP``; a supplied
vector env must run in ``SAME_STEP`` (its ``info["final_obs"]`` is used) or ``DISABLED`` (this
adapter resets finished sub-envs with ``reset(options={"reset_mask": done})``). ``NEXT_STEP``
is refused: it spends the next action on a reset, which the protocol has no room for.

Spaces: ``Box`` observations (flattened to ``[N, obs_dim]``) and ``Box`` actions (the policy's
flat ``[N, act_dim]`` is reshaped to the space's shape). Simulation runs in NumPy, so each step
copies actions to the host and observations back to ``device``.

``get_state``/``set_state`` raise ``NotImplementedError``: Gymnasium has no state API. Use the
native ``mujoco`` backend for state snapshots.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv

from robotrl.envs.base import BatchedEnv, EnvSpec, Obs, StepOut, check_action

VECTORIZATIONS: tuple[str, ...] = ("sync", "async")
"""How ``GymnasiumEnv`` vectorizes an env id: ``SyncVectorEnv`` or ``AsyncVectorEnv``."""

# keyword arguments gymnasium.make itself takes, on top of the env constructor's
MAKE_KEYS = ("max_episode_steps", "disable_env_checker", "render_mode")
_REWARD_PREFIX = "reward_"


def find_gym_spec(env_id: str) -> gymnasium.envs.registration.EnvSpec:
    """Gymnasium's spec of ``env_id``; a ValueError naming close registered ids if unknown."""
    try:
        return gymnasium.spec(env_id)
    except gymnasium.error.Error as err:
        ids = list(gymnasium.registry.keys())
        by_lower = {i.lower(): i for i in ids}
        close = [by_lower[m] for m in difflib.get_close_matches(env_id.lower(), by_lower, n=5,
                                                                 cutoff=0.5)]
        hint = f"close registered ids: {', '.join(close)}" if close else (
            f"{len(ids)} ids are registered, e.g. {', '.join(ids[:5])}"
        )
        raise ValueError(f"unknown Gymnasium id {env_id!r}; {hint} ({err})") from None


def constructor_options(creator: Any) -> set[str] | None:
    """Keyword options ``creator`` takes; None when they cannot be known.

    A class whose ``__init__`` forwards ``**kwargs`` (Gymnasium's MuJoCo envs pass them to
    ``MujocoEnv.__init__``) also takes its bases' options, up to the first closed signature.
    """
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    inits = [c.__init__ for c in creator.__mro__ if "__init__" in vars(c)] \
        if inspect.isclass(creator) else [creator]
    options: set[str] = set()
    for fn in inits:
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):  # builtins or C extensions
            return None
        options |= {p.name for p in params if p.kind in named and p.name != "self"}
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return options
    return None


def _check_make_kwargs(gym_spec: gymnasium.envs.registration.EnvSpec,
                       make_kwargs: dict[str, Any]) -> None:
    """Refuse keyword arguments the env's constructor does not take, naming the allowed ones."""
    entry = gym_spec.entry_point
    if not make_kwargs or entry is None:
        return
    creator = gymnasium.envs.registration.load_env_creator(entry) if isinstance(entry, str) \
        else entry
    allowed = constructor_options(creator)
    if allowed is None:  # let the constructor decide
        return
    allowed |= set(MAKE_KEYS)
    unknown = sorted(set(make_kwargs) - allowed)
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for Gymnasium env {gym_spec.id!r}; "
            f"allowed: {sorted(allowed)}"
        )


def _make_vector_env(env_id: str, num_envs: int, vectorization: str,
                     make_kwargs: dict[str, Any]) -> VectorEnv:
    if vectorization not in VECTORIZATIONS:
        raise ValueError(
            f"unknown vectorization {vectorization!r}; allowed: {', '.join(VECTORIZATIONS)}"
        )
    gym_spec = find_gym_spec(env_id)
    _check_make_kwargs(gym_spec, make_kwargs)
    return gymnasium.make_vec(
        gym_spec.id if ":" not in env_id else env_id,
        num_envs=num_envs,
        vectorization_mode=vectorization,
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
        **make_kwargs,
    )


def _box(space: gymnasium.Space, what: str, name: str) -> gymnasium.spaces.Box:
    if not isinstance(space, gymnasium.spaces.Box):
        hint = " (wrap it in gymnasium.wrappers.FlattenObservation)" if what == "observation" \
            else ""
        raise ValueError(
            f"{name} has {what} space {space!r}; GymnasiumEnv supports Box {what} spaces "
            f"only{hint}"
        )
    if what == "action" and not np.issubdtype(space.dtype, np.floating):
        raise ValueError(
            f"{name} has action space {space!r}; GymnasiumEnv supports floating-point Box "
            "action spaces only"
        )
    return space


def _first_attr(vec: VectorEnv, attr: str) -> Any:
    """``attr`` of the first sub-env (through its wrappers), or None when it cannot be read."""
    try:
        value = vec.get_attr(attr)[0]
    except Exception:  # custom vector envs may have no get_attr, or sub-envs no such attr
        return None
    return value


class GymnasiumEnv(BatchedEnv):
    """``num_envs`` copies of a Gymnasium env (or a supplied vector env) as a ``BatchedEnv``.

    ``env_id_or_vector_env``: a registered Gymnasium id (``"Pendulum-v1"``, ``"module:Id-v0"``)
    or a ``gymnasium.vector.VectorEnv`` (owned from then on: ``close`` closes it).
    ``vectorization``: ``"sync"`` or ``"async"`` (ids only). ``make_kwargs``: the env
    constructor's options and ``max_episode_steps`` (ids only). ``spec.reward_terms`` are the
    env's ``reward_*`` info keys, found by one probe step in the constructor; ``spec.control_dt``
    is the env's ``dt`` (NaN when it has none); ``spec.max_episode_steps`` its time limit (0 when
    it has none).
    """

    def __init__(
        self,
        env_id_or_vector_env: str | VectorEnv,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        vectorization: str = "sync",
        **make_kwargs: Any,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if isinstance(env_id_or_vector_env, VectorEnv):
            if make_kwargs:
                raise ValueError(
                    f"options {sorted(make_kwargs)} apply only when GymnasiumEnv makes the env "
                    "from an id; configure a supplied vector env before passing it"
                )
            vec = env_id_or_vector_env
            if vec.num_envs != num_envs:
                raise ValueError(
                    f"num_envs={num_envs} but the supplied vector env has {vec.num_envs} envs"
                )
            name = type(vec.unwrapped).__name__ if vec.spec is None else vec.spec.id
        elif isinstance(env_id_or_vector_env, str):
            vec = _make_vector_env(env_id_or_vector_env, num_envs, vectorization, make_kwargs)
            name = env_id_or_vector_env
        else:
            raise TypeError(
                "env_id_or_vector_env must be a Gymnasium id (str) or a "
                f"gymnasium.vector.VectorEnv, got {type(env_id_or_vector_env).__name__}"
            )
        self.vector_env = vec
        self.num_envs = num_envs
        self.device = torch.device(device)
        try:
            mode = vec.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
            mode = AutoresetMode(mode)
            if mode is AutoresetMode.NEXT_STEP:
                raise ValueError(
                    f"vector env {name!r} autoresets in NEXT_STEP mode (or its "
                    "metadata['autoreset_mode'] is missing); GymnasiumEnv needs SAME_STEP or "
                    "DISABLED, e.g. SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)"
                )
            self._autoreset = mode
            obs_space = _box(vec.single_observation_space, "observation", name)
            act_space = _box(vec.single_action_space, "action", name)
        except Exception:
            if vec is not env_id_or_vector_env:
                vec.close()
            raise
        self._act_shape = act_space.shape
        self._act_dtype = act_space.dtype
        dt = _first_attr(vec, "dt")
        gym_spec = _first_attr(vec, "spec") or vec.spec
        limit = getattr(gym_spec, "max_episode_steps", None)
        low = torch.as_tensor(np.asarray(act_space.low, np.float32).reshape(-1))
        high = torch.as_tensor(np.asarray(act_space.high, np.float32).reshape(-1))
        obs_dim = int(np.prod(obs_space.shape))
        self._probe_low, self._probe_high = low, high
        self.spec = EnvSpec(
            obs_dim=obs_dim,
            action_dim=int(np.prod(self._act_shape)),
            action_low=low,
            action_high=high,
            control_dt=float(dt) if isinstance(dt, (int, float, np.number)) else math.nan,
            max_episode_steps=int(limit) if limit is not None else 0,
            reward_terms=(),
            task=name,
        )
        self.spec = dataclasses.replace(self.spec, reward_terms=self._probe_reward_terms())
        self.reset(seed=seed)

    # ------------------------------------------------------------------ internals
    def _probe_reward_terms(self) -> tuple[str, ...]:
        """Names of the ``reward_*`` info keys, from one step at the action closest to zero."""
        self.vector_env.reset(seed=0)
        zero = torch.zeros(self.spec.action_dim).clamp(self._probe_low, self._probe_high)
        _, _, _, _, info = self.vector_env.step(self._to_gym(zero.expand(self.num_envs, -1)))
        keys = list(info) + list(info.get("final_info", {}))
        names = [k[len(_REWARD_PREFIX):] for k in keys if k.startswith(_REWARD_PREFIX)]
        return tuple(dict.fromkeys(names))

    def _to_gym(self, action: torch.Tensor) -> np.ndarray:
        a = action.detach().to("cpu").numpy().astype(self._act_dtype, copy=False)
        return a.reshape(self.num_envs, *self._act_shape)

    def _to_torch(self, x: Any) -> torch.Tensor:
        """``x`` [N, ...] (NumPy or alike) as float32 ``[N, prod(...)]`` on ``device``."""
        arr = np.array(x, dtype=np.float32).reshape(self.num_envs, -1)  # copy: no aliasing
        return torch.from_numpy(arr).to(self.device)

    def _final_obs(self, obs: np.ndarray, info: dict[str, Any], done: np.ndarray) -> np.ndarray:
        """Last observation of every world: ``info["final_obs"]`` rows where done, else obs."""
        final = np.array(obs, dtype=np.float32).reshape(self.num_envs, -1)
        if not done.any():
            return final
        if "final_obs" not in info:
            raise RuntimeError(
                f"{self.spec.task!r} ended episodes {np.flatnonzero(done).tolist()} in SAME_STEP "
                "autoreset mode without info['final_obs']"
            )
        src = info["final_obs"]
        ids = np.flatnonzero(done)
        if isinstance(src, np.ndarray) and src.dtype == object:  # Gymnasium: one entry per env
            final[ids] = np.stack([np.asarray(src[i], np.float32).reshape(-1) for i in ids])
        else:
            final[ids] = np.asarray(src, np.float32).reshape(self.num_envs, -1)[ids]
        return final

    def _reward_terms(self, info: dict[str, Any], done: np.ndarray) -> dict[str, torch.Tensor]:
        """``reward_*`` info values [N] float32; finished worlds' values sit in ``final_info``."""
        terms: dict[str, torch.Tensor] = {}
        final_info = info.get("final_info", {})
        for name in self.spec.reward_terms:
            key = _REWARD_PREFIX + name
            value = np.zeros(self.num_envs, np.float32)
            for src, rows in ((info, ~done), (final_info, done)):
                if key in src:
                    mask = rows & np.asarray(src.get("_" + key, True), dtype=bool)
                    value[mask] = np.asarray(src[key], np.float32).reshape(self.num_envs)[mask]
            terms[name] = torch.from_numpy(value).to(self.device)
        return terms

    # ------------------------------------------------------------------ protocol
    def reset(self, seed: int | None = None) -> Obs:
        """Reset every world (sub-env ``i`` seeded with ``seed + i`` when given);
        ``{"policy": [N, obs_dim]}``."""
        obs, _ = self.vector_env.reset(seed=seed)
        return {"policy": self._to_torch(obs)}

    def step(self, action: torch.Tensor) -> StepOut:
        check_action(action, self.spec, self.num_envs)
        obs, reward, terminated, truncated, info = self.vector_env.step(self._to_gym(action))
        terminated = np.asarray(terminated, dtype=bool).reshape(self.num_envs)
        truncated = np.asarray(truncated, dtype=bool).reshape(self.num_envs)
        done = terminated | truncated
        if self._autoreset is AutoresetMode.SAME_STEP:
            final = self._final_obs(obs, info, done)
            terms = self._reward_terms(info, done)
        else:  # DISABLED: this step's obs and info are the finished episodes' last ones
            final = np.array(obs, dtype=np.float32).reshape(self.num_envs, -1)
            terms = self._reward_terms(info, np.zeros_like(done))
            if done.any():
                obs, _ = self.vector_env.reset(options={"reset_mask": done})
        out_info: dict[str, Any] = {
            "final_obs": {"policy": torch.from_numpy(final).to(self.device)},
            "reward_terms": terms,
            "gym_info": info,
        }
        return StepOut(
            {"policy": self._to_torch(obs)},
            torch.from_numpy(np.asarray(reward, np.float32).reshape(self.num_envs)).to(self.device),
            torch.from_numpy(terminated).to(self.device),
            torch.from_numpy(truncated).to(self.device),
            out_info,
        )

    def get_state(self) -> torch.Tensor:
        raise NotImplementedError(
            "GymnasiumEnv cannot snapshot simulator state (Gymnasium has no state API); "
            "use backend='mujoco' for get_state/set_state"
        )

    def set_state(self, state: torch.Tensor, env_ids: torch.Tensor | None = None) -> None:
        raise NotImplementedError(
            "GymnasiumEnv cannot restore simulator state (Gymnasium has no state API); "
            "use backend='mujoco' for get_state/set_state"
        )

    def close(self) -> None:
        self.vector_env.close()
