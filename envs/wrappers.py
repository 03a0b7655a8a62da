"""Batched env wrappers: action scaling and clipping, action chunks, frame stacks, episode
statistics.

    env = RecordEpisodeStatistics(RescaleAction(make(...)))

Observation normalization and reward scaling belong to the learners (``robotrl.nn.normalizer``,
baked into exported actors), not to wrappers. ``RecordEpisodeStatistics`` is the one place
episode returns are tracked; the runners read it.

Every wrapper is a ``BatchedEnv`` over an inner one and works on whole ``[N, ...]`` tensors on
``env.device``. Wrappers with running state (the episode accumulators) save it
with ``state_dict()``; the dict nests the inner env's, so one call on the outermost wrapper
checkpoints the whole stack and ``load_state_dict`` restores it.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any

import torch

from robotrl.envs.base import BatchedEnv, EnvSpec, Obs, StepOut, check_action


class Wrapper(BatchedEnv):
    """Forwards everything to ``env``; subclasses override what they change.

    Attributes the wrapper lacks (``task``, ``render``, ``num_unstable``...) are read from the
    inner env. ``own_state_dict``/``load_own_state_dict`` are the hooks for a wrapper's state.
    """

    def __init__(self, env: BatchedEnv) -> None:
        if not isinstance(env, BatchedEnv):
            raise TypeError(f"{type(self).__name__} wraps a BatchedEnv, got {type(env).__name__}")
        self.env = env

    @property
    def num_envs(self) -> int:  # type: ignore[override]
        return self.env.num_envs

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self.env.device

    @property
    def spec(self) -> EnvSpec:  # type: ignore[override]
        return self.env.spec

    @property
    def unwrapped(self) -> BatchedEnv:
        """The innermost env."""
        env = self.env
        return env.unwrapped if isinstance(env, Wrapper) else env

    def __getattr__(self, name: str) -> Any:
        # only reached for attributes not found normally; "env" guards against recursion
        # before __init__ has set it (copy, pickle)
        if name.startswith("_") or name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def reset(self, seed: int | None = None) -> Obs:
        return self.env.reset(seed)

    def step(self, action: torch.Tensor) -> StepOut:
        return self.env.step(action)

    def get_state(self) -> torch.Tensor:
        return self.env.get_state()

    def render(self, env_id: int = 0, width: int = 480, height: int = 480,
               camera: str | int = "view", final: bool = False) -> Any:
        return self.env.render(env_id, width, height, camera=camera, final=final)

    def set_state(self, state: torch.Tensor, env_ids: torch.Tensor | None = None) -> None:
        self.env.set_state(state, env_ids)

    def observe(self) -> Obs:
        return self.env.observe()

    def close(self) -> None:
        self.env.close()

    # ------------------------------------------------------------------ checkpointing
    def own_state_dict(self) -> dict[str, Any]:
        """This wrapper's running state (none by default)."""
        return {}

    def load_own_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``own_state_dict`` returned."""
        if state:
            raise ValueError(f"{type(self).__name__} has no state, got keys {sorted(state)}")

    def state_dict(self) -> dict[str, Any]:
        """``{"wrapper": own state, "env": inner env's state_dict}``.

        "env" is there when the inner env implements ``state_dict`` (wrappers and the native
        MuJoCo backend do; the Gymnasium backend does not, so only wrapper state is saved).
        """
        out: dict[str, Any] = {"wrapper": self.own_state_dict()}
        if _has_state(self.env):
            out["env"] = self.env.state_dict()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this wrapper and, recursively, the inner env from ``state_dict()``."""
        if not isinstance(state, dict) or "wrapper" not in state:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict expects the dict state_dict() returns "
                f"(keys 'wrapper' and, for a stateful inner env, 'env'), got {state!r:.200}"
            )
        inner_has_state = _has_state(self.env)
        if inner_has_state != ("env" in state):
            raise ValueError(
                f"state for {type(self).__name__} {'lacks' if inner_has_state else 'has'} an "
                f"'env' entry but the inner {type(self.env).__name__} "
                f"{'has' if inner_has_state else 'has no'} state: was it saved from the same "
                "wrapper stack?"
            )
        self.load_own_state_dict(state["wrapper"])
        if inner_has_state:
            self.env.load_state_dict(state["env"])


def _has_state(env: BatchedEnv) -> bool:
    """Whether ``env`` implements ``state_dict`` (``BatchedEnv``'s default raises)."""
    return type(env).state_dict is not BatchedEnv.state_dict


def _replace_info(out: StepOut, **entries: Any) -> StepOut:
    """``out`` with a copy of its info updated by ``entries`` (the inner dict is left alone)."""
    return out._replace(info={**out.info, **entries})


def _finite_bounds(spec: EnvSpec, wrapper: str) -> None:
    if not bool(torch.isfinite(spec.action_low).all() & torch.isfinite(spec.action_high).all()):
        raise ValueError(
            f"{wrapper} needs finite action bounds; task {spec.task!r} has low="
            f"{spec.action_low.tolist()}, high={spec.action_high.tolist()}"
        )


class RescaleAction(Wrapper):
    """The policy acts in ``[-1, 1]``; actions are mapped linearly onto the env's bounds.

    ``a_env = low + (a + 1) / 2 * (high - low)``. Inputs outside ``[-1, 1]`` map outside the
    bounds (compose with ``ClipAction`` outside this wrapper to clip in policy space).
    ``spec.action_low``/``action_high`` become -1 and 1.
    """

    def __init__(self, env: BatchedEnv) -> None:
        super().__init__(env)
        _finite_bounds(env.spec, "RescaleAction")
        low, high = env.spec.action_low, env.spec.action_high
        self._low = low.to(env.device)
        self._half_range = ((high - low) / 2).to(env.device)
        self._spec = dataclasses.replace(
            env.spec, action_low=-torch.ones_like(low), action_high=torch.ones_like(high)
        )

    @property
    def spec(self) -> EnvSpec:  # type: ignore[override]
        return self._spec

    def step(self, action: torch.Tensor) -> StepOut:
        check_action(action, self._spec, self.num_envs)
        low, half = self._low.to(action.dtype), self._half_range.to(action.dtype)
        return self.env.step(low + (action + 1) * half)


class ClipAction(Wrapper):
    """Actions clipped to the env's bounds, ``[N, act_dim]``."""

    def __init__(self, env: BatchedEnv) -> None:
        super().__init__(env)
        self._low = env.spec.action_low.to(env.device)
        self._high = env.spec.action_high.to(env.device)

    def step(self, action: torch.Tensor) -> StepOut:
        check_action(action, self.spec, self.num_envs)
        low, high = self._low.to(action.dtype), self._high.to(action.dtype)
        return self.env.step(torch.clamp(action, low, high))


class ActionChunks(Wrapper):
    """One step takes a chunk of K actions, [N, K * A], and applies them over K control steps
    (action chunking, Zhao et al. 2023; the decision rate of token policies).

    The chunk's reward is the sum of its steps' rewards; an episode that ends inside a chunk
    reports that step's ``final_obs``, reward terms and ``success``, and its world runs the rest
    of the chunk in its next episode. Episodes stay aligned to chunks when the episode limit is
    a multiple of K and the task does not terminate early (tabletop): then every chunk
    belongs to one episode.
    """

    def __init__(self, env: BatchedEnv, chunk: int) -> None:
        super().__init__(env)
        spec = env.spec
        if chunk < 1 or spec.max_episode_steps % chunk:
            raise ValueError(f"the action chunk ({chunk}) must be >= 1 and divide the episode "
                             f"limit ({spec.max_episode_steps} steps of task {spec.task!r})")
        self.chunk = chunk
        self._spec = dataclasses.replace(
            spec, action_dim=spec.action_dim * chunk, action_low=spec.action_low.repeat(chunk),
            action_high=spec.action_high.repeat(chunk), control_dt=spec.control_dt * chunk,
            max_episode_steps=spec.max_episode_steps // chunk)

    @property
    def spec(self) -> EnvSpec:  # type: ignore[override]
        return self._spec

    def step(self, action: torch.Tensor) -> StepOut:
        check_action(action, self._spec, self.num_envs)
        steps = action.reshape(self.num_envs, self.chunk, -1)
        alive = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        reward = torch.zeros(self.num_envs, device=self.device)
        terminated, truncated = torch.zeros_like(alive), torch.zeros_like(alive)
        final: Obs = {}
        terms: dict[str, torch.Tensor] = {}
        success: torch.Tensor | None = None
        for i in range(self.chunk):
            out = self.env.step(steps[:, i])
            reward += out.reward * alive
            for k, v in out.info["reward_terms"].items():
                terms[k] = terms.get(k, torch.zeros_like(v)) + v * alive
            ends = alive & (out.terminated | out.truncated)
            last = ends | alive if i == self.chunk - 1 else ends
            terminated |= out.terminated & alive
            truncated |= out.truncated & alive
            final = {k: torch.where(last.reshape(-1, *[1] * (v.dim() - 1)), v, final[k])
                     if k in final else v for k, v in out.info["final_obs"].items()}
            if "success" in out.info:
                s = out.info["success"]
                success = s if success is None else torch.where(last, s, success)
            alive &= ~ends
        info = {**out.info, "final_obs": final, "reward_terms": terms}
        if success is not None:
            info["success"] = success
        return StepOut(out.obs, reward, terminated, truncated, info)


class FrameStack(Wrapper):
    """The last ``k`` frames of observation group ``group`` stacked along its first axis
    (channels), oldest first: [N, k * C, H, W] from [N, C, H, W] (pixel learners see motion).

    A new episode's stack is its first frame k times, as DrQ's and the Atari wrappers' are.
    ``info["final_obs"]`` holds each world's stack at the step's end before any auto-reset (an
    ended episode's last k frames), ``obs`` the stack the next action is taken in. Other groups
    pass through. ``set_state`` restarts the stacks of the worlds it sets from their frame.
    """

    def __init__(self, env: BatchedEnv, k: int, group: str = "image") -> None:
        super().__init__(env)
        spec = env.spec
        if group not in spec.observations:
            raise ValueError(f"frame stacking needs observation group {group!r}; task "
                             f"{spec.task!r} returns {sorted(spec.observations)}")
        inner = spec.observations[group]
        if k < 1 or len(inner.shape) < 2:
            raise ValueError(f"frame stacking takes k >= 1 frames of a group with a channel "
                             f"axis; got k={k}, {group!r} of shape {inner.shape}")
        self.k, self.group = k, group
        self.channels = inner.shape[0]
        shape = (k * inner.shape[0], *inner.shape[1:])
        self._spec = dataclasses.replace(spec, observations={
            **spec.observations, group: dataclasses.replace(inner, shape=shape)})
        self._stack: torch.Tensor | None = None

    @property
    def spec(self) -> EnvSpec:  # type: ignore[override]
        return self._spec

    def _fresh(self, frame: torch.Tensor) -> torch.Tensor:
        return frame.repeat(1, self.k, *[1] * (frame.dim() - 2))

    def _with(self, obs: Obs, stack: torch.Tensor) -> Obs:
        return {**obs, self.group: stack}

    def reset(self, seed: int | None = None) -> Obs:
        obs = self.env.reset(seed)
        self._stack = self._fresh(obs[self.group])
        return self._with(obs, self._stack)

    def observe(self) -> Obs:
        obs = self.env.observe()
        if self._stack is None:
            self._stack = self._fresh(obs[self.group])
        return self._with(obs, self._stack)

    def step(self, action: torch.Tensor) -> StepOut:
        if self._stack is None:
            self.observe()
        assert self._stack is not None
        out = self.env.step(action)
        final = out.info["final_obs"]
        ended = torch.cat([self._stack[:, self.channels:], final[self.group]], dim=1)
        done = (out.terminated | out.truncated).reshape(-1, *[1] * (ended.dim() - 1))
        self._stack = torch.where(done, self._fresh(out.obs[self.group]), ended)
        info = {**out.info, "final_obs": self._with(final, ended)}
        return StepOut(self._with(out.obs, self._stack), out.reward, out.terminated,
                       out.truncated, info)

    def own_state_dict(self) -> dict[str, Any]:
        return {} if self._stack is None else {"stack": self._stack.clone()}

    def load_own_state_dict(self, state: dict[str, Any]) -> None:
        self._stack = state["stack"].clone() if "stack" in state else None

    def set_state(self, state: torch.Tensor, env_ids: torch.Tensor | None = None) -> None:
        self.env.set_state(state, env_ids)
        frame = self.env.observe()[self.group]
        if self._stack is None or env_ids is None:
            self._stack = self._fresh(frame)
        else:
            self._stack[env_ids] = self._fresh(frame[env_ids])


def finished_episodes(episodes: list[dict[str, torch.Tensor]]) -> tuple[list[float], list[int]]:
    """Returns and lengths of the episodes that ended in ``episodes`` (``info["episode"]`` of
    consecutive steps), in step order then world order. One host synchronization for all."""
    if not episodes:
        return [], []
    done = torch.stack([e["done"] for e in episodes])
    returns = torch.stack([e["return"] for e in episodes])[done]
    lengths = torch.stack([e["length"] for e in episodes])[done]
    return returns.tolist(), lengths.tolist()


class RecordEpisodeStatistics(Wrapper):
    """Per-world running return and length; finished episodes reported in ``info["episode"]``.

    After every step ``info["episode"] = {"done": [N] bool, "return": [N] float32, "length": [N]
    long}``: ``return``/``length`` of the episode each world finished this step, valid where
    ``done`` (use ``finished_episodes`` to pick them). Dense on purpose: a step never waits for
    the device to say how many episodes ended (on a GPU that wait would stall every step).
    ``recent_returns``/``recent_lengths`` keep the last ``window`` finished episodes; they are
    brought up to date (one synchronization) when read and every ``_FLUSH`` steps.
    """

    _FLUSH = 256
    """Steps whose episode tensors are kept on the device before they are read."""

    def __init__(self, env: BatchedEnv, window: int = 100) -> None:
        super().__init__(env)
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.episode_returns = torch.zeros(env.num_envs, dtype=torch.float64, device=env.device)
        """[N] float64: return of each world's current episode so far."""
        self.episode_lengths = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)
        """[N] long: steps of each world's current episode so far."""
        self._recent_returns: deque[float] = deque(maxlen=window)
        self._recent_lengths: deque[int] = deque(maxlen=window)
        self._num_episodes = 0
        self._pending: list[dict[str, torch.Tensor]] = []

    def _flush(self) -> None:
        returns, lengths = finished_episodes(self._pending)
        self._pending.clear()
        self._recent_returns.extend(returns)
        self._recent_lengths.extend(lengths)
        self._num_episodes += len(returns)

    @property
    def recent_returns(self) -> deque[float]:
        """Returns of the last ``window`` finished episodes, oldest first."""
        self._flush()
        return self._recent_returns

    @property
    def recent_lengths(self) -> deque[int]:
        """Lengths of the last ``window`` finished episodes, oldest first."""
        self._flush()
        return self._recent_lengths

    @property
    def num_episodes(self) -> int:
        """Episodes finished since construction (or the loaded checkpoint's count)."""
        self._flush()
        return self._num_episodes

    def reset(self, seed: int | None = None) -> Obs:
        self.episode_returns.zero_()
        self.episode_lengths.zero_()
        return self.env.reset(seed)

    def step(self, action: torch.Tensor) -> StepOut:
        out = self.env.step(action)
        self.episode_returns.add_(out.reward)
        self.episode_lengths.add_(1)
        done = out.terminated | out.truncated
        episode = {"done": done, "return": self.episode_returns.to(torch.float32),
                   "length": self.episode_lengths.clone()}
        self.episode_returns.masked_fill_(done, 0.0)
        self.episode_lengths.masked_fill_(done, 0)
        self._pending.append(episode)
        if len(self._pending) >= self._FLUSH:
            self._flush()
        return _replace_info(out, episode=episode)

    def own_state_dict(self) -> dict[str, Any]:
        return {
            "episode_returns": self.episode_returns.clone(),
            "episode_lengths": self.episode_lengths.clone(),
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
            "num_episodes": self.num_episodes,
        }

    def load_own_state_dict(self, state: dict[str, Any]) -> None:
        self.episode_returns.copy_(state["episode_returns"])
        self.episode_lengths.copy_(state["episode_lengths"])
        self._pending.clear()
        self._recent_returns = deque(state["recent_returns"], maxlen=self.window)
        self._recent_lengths = deque(state["recent_lengths"], maxlen=self.window)
        self._num_episodes = int(state["num_episodes"])


__all__ = [
    "ClipAction",
    "RecordEpisodeStatistics",
    "RescaleAction",
    "Wrapper",
    "finished_episodes",
]
