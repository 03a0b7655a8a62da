"""Protocols and shapes shared across layers: the batched-environment protocol every backend
speaks, how learners are built, and what a runner may call on them.

The batched-environment protocol every backend speaks.

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
``TensorDict`` was measured slower per step (benchmarks/README.md at commit 757c2c7, "Observation container").

Finished worlds reset automatically inside ``step``; for them ``out.obs`` is the first
observation of the next episode and ``info["final_obs"]`` the last one of the finished episode
(for the other rows it equals ``out.obs``).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch

Obs = dict[str, torch.Tensor]
"""An observation: group name -> [N, ...] tensor (``policy`` always; see the module docstring)."""

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


def obs_to(obs: Obs, device: torch.device | str) -> Obs:
    """Every group of ``obs`` on ``device``."""
    return {name: value.to(device) for name, value in obs.items()}



def policy_obs(obs: Obs | torch.Tensor) -> torch.Tensor:
    """The ``policy`` group of ``obs``; a bare tensor is taken as the policy group itself (a
    flat env or a hand-written loop)."""
    return obs if isinstance(obs, torch.Tensor) else obs["policy"]


def check_groups(groups: Any, key: str) -> tuple[str, ...]:
    """``groups`` as a tuple of distinct observation-group names; a bad value fails naming
    ``key``."""
    if isinstance(groups, str):
        groups = (groups,)
    out = tuple(str(g) for g in groups)
    if not out or len(set(out)) != len(out):
        raise ValueError(f"{key} must list distinct observation groups (e.g. [policy, "
                         f"privileged]), got {list(out)}")
    return out


@dataclasses.dataclass(frozen=True)
class BuildContext:
    """Where and at what scale a learner runs (everything but its own config and the spec)."""

    device: torch.device
    """Learner device."""
    num_envs: int
    """Worlds the learner acts in at once (N of every [N, ...] tensor it sees)."""
    rank: int = 0
    """This process's data-parallel rank."""
    world_size: int = 1
    """Number of data-parallel ranks."""
    policy: Any = None
    """A token policy's config (``policy=vla`` or ``hf``: ``robotrl.registry.POLICIES``)
    for learners that train one (GRPO, BC); None: the algorithm's own MLP networks."""


class Learner(Protocol):
    """What every algorithm provides: built from (spec, config, context), acts, learns, saves.

    ``act`` and ``process_env_step`` run under ``torch.inference_mode()`` during collection;
    ``update`` runs outside it. Shapes: N = ``ctx.num_envs``.
    """

    @classmethod
    def build(cls, spec: EnvSpec, cfg: Any, ctx: BuildContext) -> Learner:
        """The learner for an env with ``spec``, configured by ``cfg``, placed by ``ctx``."""
        ...

    @classmethod
    def observations(cls, cfg: Any) -> tuple[str, ...]:
        """The observation groups the learner configured by ``cfg`` reads (``policy`` first);
        the builder asks the env for them."""
        ...

    def act(self, obs: Obs) -> torch.Tensor:
        """Actions [N, act_dim] for an observation (``policy`` [N, obs_dim], other groups);
        records what the update needs."""
        ...

    def act_deterministic(self, obs: Obs) -> torch.Tensor:
        """Deterministic actions [N, act_dim] for evaluation; records nothing."""
        ...

    def process_env_step(self, reward: torch.Tensor, terminated: torch.Tensor,
                         truncated: torch.Tensor, final_obs: Obs) -> None:
        """Record the step's outcome: reward [N], terminated/truncated [N] bool, final_obs (the
        observation before any auto-reset)."""
        ...

    def update(self, progress: float) -> dict[str, float]:
        """Learn; ``progress`` in [0, 1] is the fraction of training done. May return {}."""
        ...

    def export_actor(self) -> torch.nn.Module:
        """Frozen deterministic actor for sim2real export (``robotrl.nn.actor.DeterministicActor``)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class OnPolicyAlgorithm(Learner, Protocol):
    """A learner the ``on_policy`` runner drives (PPO, TRPO): rollouts closed by
    ``compute_returns``, then ``update`` learns from them."""

    def compute_returns(self, last_obs: Obs) -> None:
        """Close the rollout with the observation after its last step."""
        ...


class OffPolicyAlgorithm(Learner, Protocol):
    """A learner the ``off_policy`` runner drives (SAC): it stores transitions in its own replay
    buffer (``process_env_step``) and learns from it (``update``)."""


class GroupSamplingConfig(Protocol):
    """What the ``group`` runner reads from a group algorithm's config (GRPOConfig has it)."""

    group_size: int
    """G: rollouts from each initial state (``num_envs`` is a multiple of it)."""
    outcome: str
    """"return" (the episode's undiscounted return) or "success" (``info["success"]`` at the
    episode's last step, 0 or 1)."""
    train_states: int
    """Size of the fixed set of initial states training draws from."""
    test_states: int
    """Size of the disjoint set of initial states evaluation reports apart (never trained on)."""


class GroupAlgorithm(Learner, Protocol):
    """A learner the ``group`` runner drives (GRPO): the runner restores each of M initial
    states into G worlds, steps them with ``act``/``process_env_step`` for up to ``horizon``
    steps, and closes the round with the outcome of every world; ``update`` learns once
    ``end_round`` says the batch is full."""

    cfg: GroupSamplingConfig
    horizon: int
    """Steps of a round (the episode limit unless configured shorter)."""

    def end_round(self, outcome: torch.Tensor) -> bool:
        """Close a round with ``outcome`` [N] (world i belongs to group i // G); True when the
        batch is ready for ``update``."""
        ...


class OfflineAlgorithm(Learner, Protocol):
    """A learner the ``offline`` runner drives (BC, TD3+BC, IQL, ...): it never collects;
    ``update`` learns from the dataset given once to ``attach``."""

    def attach(self, dataset: Any) -> None:
        """Take the dataset (a ``robotrl.data.Dataset``, moved to the learner's device,
        normalized as the algorithm needs); called once, before the first ``update`` and before a checkpoint is loaded."""
        ...
