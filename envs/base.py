"""The batched-environment protocol every backend speaks.

A ``BatchedEnv`` holds ``num_envs`` worlds and exchanges torch tensors on ``env.device``:

    obs = env.reset(seed=0)                 # {"policy": [N, obs_dim], ...other groups}
    out = env.step(action)                  # action: [N, act_dim]
    out.obs["policy"], out.reward           # [N, obs_dim], [N]
    out.terminated, out.truncated           # [N] bool, kept separate (bootstrap on truncation)
    out.info["final_obs"]                   # the observation before auto-reset, same groups
    out.info["success"]                     # [N] bool, where spec.has_success
    out.info["goal_distance"]               # [N], where spec.goal (goal-conditioned tasks)

An observation is a mapping of named groups, each ``[N, ...]``, declared with shape and dtype in
``spec.observations``: ``policy`` always (what a deployed controller sees); ``privileged``
(state a controller cannot measure: true base velocity, randomized physics), ``goal``,
``image``, ``tokens`` where a backend and task provide them. Plain ``dict[str, Tensor]``: a
``TensorDict`` was measured slower per step (benchmarks/README.md, "Observation container").

Finished worlds reset automatically inside ``step``; for them ``out.obs`` is the first
observation of the next episode and ``info["final_obs"]`` the last one of the finished episode
(for the other rows it equals ``out.obs``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from robotrl.types import Obs

GROUPS: tuple[str, ...] = ("policy", "privileged", "goal", "image", "tokens")
"""Observation groups with an agreed meaning; backends may add others."""


@dataclass(frozen=True)
class ObsSpec:
    """Shape (without the leading N) and dtype of one observation group."""

    shape: tuple[int, ...]
    """Per-world shape, e.g. ``(11,)`` or ``(3, 32, 32)``."""
    dtype: torch.dtype = torch.float32
    """Element type; only floating groups are normalized."""


@dataclass(frozen=True)
class GoalSpec:
    """Where a goal-conditioned task keeps its goal in the ``policy`` observation, and what it
    is compared with: what hindsight relabelling (``robotrl.algos.crl``) and goal metrics need.

    A goal ``g`` is reached when ``|| obs[achieved] - g || < success_distance``; relabelling a
    transition with a state ``s'`` it led to writes ``s'[achieved]`` into ``obs[columns]``.
    """

    columns: tuple[int, ...]
    """Columns of ``policy`` holding the commanded goal (what a controller is told)."""
    achieved: tuple[int, ...]
    """Columns of ``policy`` holding the state's coordinates a goal is compared with (same
    length as ``columns``), e.g. reacher_goal's fingertip (x, y)."""
    success_distance: float
    """Euclidean distance under which the goal counts as reached (``info["success"]``)."""

    def __post_init__(self) -> None:
        if not self.columns or len(self.columns) != len(self.achieved):
            raise ValueError(f"goal columns {self.columns} and achieved columns {self.achieved} "
                             "must be non-empty and of one length")
        if set(self.columns) & set(self.achieved):
            raise ValueError("goal and achieved columns must be disjoint")

    @property
    def dim(self) -> int:
        """Goal width."""
        return len(self.columns)


@dataclass(frozen=True)
class EnvSpec:
    """Static description of a batched environment."""

    obs_dim: int
    """Length of the flat ``policy`` observation."""
    action_dim: int
    """Length of the action vector."""
    action_low: torch.Tensor
    """Lower action bounds, [action_dim] (float32, on CPU)."""
    action_high: torch.Tensor
    """Upper action bounds, [action_dim] (float32, on CPU)."""
    control_dt: float
    """Seconds of simulated time per ``step``."""
    max_episode_steps: int
    """Steps after which an episode is truncated."""
    reward_terms: tuple[str, ...] = ()
    """Names of the reward terms reported in ``info["reward_terms"]``."""
    observations: dict[str, ObsSpec] = field(default_factory=dict)
    """Every observation group the env returns (``{"policy": ObsSpec((obs_dim,))}`` when empty)."""
    task: str = ""
    """Task name the env was made for."""
    has_success: bool = False
    """``step`` reports ``info["success"]`` [N] bool: the task's success criterion holds in that
    world after the step (before any auto-reset); an episode succeeds if it holds at its last
    step (``robotrl.envs.tasks``: reacher, inverted_pendulum, inverted_double_pendulum)."""
    goal: GoalSpec | None = None
    """Goal-conditioned tasks (``reacher_goal``): where the goal sits in ``policy``; ``step``
    then also reports ``info["goal_distance"]`` [N]. None: not goal-conditioned."""

    def __post_init__(self) -> None:
        groups = dict(self.observations) or {"policy": ObsSpec((self.obs_dim,))}
        if groups.get("policy") != ObsSpec((self.obs_dim,)):
            raise ValueError(f"observation group 'policy' must be ObsSpec(({self.obs_dim},)) "
                             f"(obs_dim), got {groups.get('policy')}")
        object.__setattr__(self, "observations", groups)
        if self.goal is not None:
            bad = [c for c in (*self.goal.columns, *self.goal.achieved)
                   if not 0 <= c < self.obs_dim]
            if bad:
                raise ValueError(f"goal columns {bad} are outside the policy observation "
                                 f"(obs_dim {self.obs_dim})")

    def group_dim(self, names: tuple[str, ...] | list[str]) -> int:
        """Width of the flat groups ``names`` concatenated in that order; an unknown or
        non-flat group fails naming the available ones."""
        total = 0
        for name in names:
            group = self.observations.get(name)
            if group is None:
                raise ValueError(f"observation group {name!r} is not in this env "
                                 f"({self.task or 'env'}); available: {list(self.observations)}")
            if len(group.shape) != 1 or not group.dtype.is_floating_point:
                raise ValueError(f"observation group {name!r} is {group}, not a flat float "
                                 "vector; it cannot be concatenated")
            total += group.shape[0]
        return total


    def flat_width(self, names: tuple[str, ...] | list[str]) -> int:
        """Width of the groups ``names`` flattened per world and concatenated (any dtype)."""
        return sum(self._group(n).numel() for n in names)

    def _group(self, name: str) -> torch.Size:
        if name not in self.observations:
            raise ValueError(f"observation group {name!r} is not in this env "
                             f"({self.task or 'env'}); available: {list(self.observations)}")
        return torch.Size(self.observations[name].shape)

    def unflatten(self, flat: torch.Tensor, names: tuple[str, ...] | list[str]) -> Obs:
        """The groups ``names`` from ``flat`` [B, flat_width(names)] (``flatten_groups``'
        layout), each [B, *shape] in its own dtype."""
        out, offset = {}, 0
        for name in names:
            shape = self._group(name)
            part = flat[:, offset: offset + shape.numel()]
            dtype = self.observations[name].dtype
            part = part if dtype.is_floating_point else part.round()
            out[name] = part.reshape(len(flat), *shape).to(dtype)
            offset += shape.numel()
        return out


def flatten_groups(obs: Obs, names: tuple[str, ...] | list[str]) -> torch.Tensor:
    """[N, W] float32: the groups ``names`` of ``obs`` flattened per world and concatenated in
    that order (how datasets store observations with images or instruction tokens)."""
    return torch.cat([obs[n].reshape(len(obs[n]), -1).float() for n in names], dim=1)


class StepOut(NamedTuple):
    """What ``BatchedEnv.step`` returns; every tensor has leading dimension N = num_envs."""

    obs: Obs
    """Next observation (the reset one for finished worlds): ``{"policy": [N, obs_dim]}`` and
    the env's other groups."""
    reward: torch.Tensor
    """[N] float32."""
    terminated: torch.Tensor
    """[N] bool: the episode reached a terminal state (no bootstrap)."""
    truncated: torch.Tensor
    """[N] bool: the episode was cut by the time limit (bootstrap from ``final_obs``)."""
    info: dict[str, Any]
    """``final_obs`` (an ``Obs``), ``reward_terms`` {name: [N]}, backend extras."""


class BatchedEnv(ABC):
    """A batch of ``num_envs`` worlds stepped together; see the module docstring."""

    num_envs: int
    device: torch.device
    spec: EnvSpec

    @abstractmethod
    def reset(self, seed: int | None = None) -> Obs:
        """Reset every world; reseed the reset distribution when ``seed`` is given.

        Returns the observation (``{"policy": [N, obs_dim], ...}``).
        """

    @abstractmethod
    def step(self, action: torch.Tensor) -> StepOut:
        """Apply ``action`` [N, act_dim] for one control step and auto-reset finished worlds."""

    def get_state(self) -> torch.Tensor:
        """Full simulator state of every world, [N, S] float64."""
        raise NotImplementedError(f"{type(self).__name__} cannot snapshot its state")

    def set_state(self, state: torch.Tensor, env_ids: torch.Tensor | None = None) -> None:
        """Restore worlds ``env_ids`` ([K] long, all when None) from ``state`` [K, S]."""
        raise NotImplementedError(f"{type(self).__name__} cannot restore a state")

    def observe(self) -> Obs:
        """The current observation of every world, as ``reset`` would return it (after
        ``set_state``: the restored worlds' first observation)."""
        raise NotImplementedError(f"{type(self).__name__} cannot observe without stepping")

    def render(self, env_id: int = 0, width: int = 480, height: int = 480,
               camera: str | int = "view", final: bool = False) -> Any:
        """An RGB frame [H, W, 3] uint8 of world ``env_id`` from ``camera`` ("view" the task's
        video camera, "task" its policy camera, a MuJoCo camera name or id, -1 the free
        camera); ``final``: the world's last state before the auto-reset of the step just
        taken (an episode's last frame) where that step ended its episode; backends without a
        renderer raise."""
        raise NotImplementedError(f"the {type(self).__name__} backend cannot render")

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the batch exactly (checkpointing); see backends."""
        raise NotImplementedError(f"{type(self).__name__} cannot checkpoint its state")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        raise NotImplementedError(f"{type(self).__name__} cannot restore a checkpoint")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release simulator resources."""

    def __enter__(self) -> BatchedEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_action_shape(action: torch.Tensor, spec: EnvSpec, num_envs: int) -> None:
    """Raise a clear error for an action of the wrong type, shape or dtype (no host sync)."""
    if not isinstance(action, torch.Tensor):
        raise TypeError(
            f"action must be a torch.Tensor of shape [{num_envs}, {spec.action_dim}], "
            f"got {type(action).__name__}"
        )
    if tuple(action.shape) != (num_envs, spec.action_dim):
        raise ValueError(
            f"action has shape {tuple(action.shape)}, expected ({num_envs}, {spec.action_dim}) "
            f"= (num_envs, action_dim) for task {spec.task!r}"
        )
    if not action.is_floating_point():
        raise TypeError(f"action must be a floating-point tensor, got dtype {action.dtype}")


def check_action(action: torch.Tensor, spec: EnvSpec, num_envs: int) -> None:
    """``check_action_shape`` plus NaN/Inf entries (reads a flag on the host: CPU backends)."""
    check_action_shape(action, spec, num_envs)
    if not bool(torch.isfinite(action).all()):
        bad = (~torch.isfinite(action)).any(dim=1).nonzero().flatten().tolist()
        raise ValueError(
            f"action contains NaN or Inf in envs {bad[:10]}{'...' if len(bad) > 10 else ''}; "
            "refusing to feed it to the physics"
        )


def obs_to(obs: Obs, device: torch.device | str) -> Obs:
    """Every group of ``obs`` on ``device``."""
    return {name: value.to(device) for name, value in obs.items()}


def where_done(done: torch.Tensor, reset: Obs, final: Obs) -> Obs:
    """Per group: rows of ``reset`` where ``done`` [N] bool, else ``final``."""
    out = {}
    for name, value in final.items():
        mask = done.to(value.device).reshape(-1, *([1] * (value.dim() - 1)))
        out[name] = torch.where(mask, reset[name], value)
    return out


def end_unstable(unstable: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor,
                 reward: torch.Tensor, obs: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(terminated, truncated, reward, obs) with the worlds in ``unstable`` [N] bool ended: an
    unstable world's state is garbage, so its episode terminates (no bootstrap) with reward 0,
    and non-finite observations become 0 so that they cannot reach the learner."""
    return (terminated | unstable, truncated & ~unstable, reward.masked_fill(unstable, 0.0),
            torch.nan_to_num(obs, nan=0.0, posinf=0.0, neginf=0.0))
