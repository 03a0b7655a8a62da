"""Protocols shared across layers: how learners are built and what a runner may call on them."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from robotrl.data.dataset import Dataset
    from robotrl.envs.base import EnvSpec
    from robotrl.nn.actor import DeterministicActor


Obs = dict[str, torch.Tensor]
"""An observation: group name -> [N, ...] tensor (``policy`` always; see ``robotrl.envs.base``)."""


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

    def export_actor(self) -> DeterministicActor:
        """Frozen deterministic actor for sim2real export (``robotrl.nn.actor``)."""
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

    def attach(self, dataset: Dataset) -> None:
        """Take the dataset (moved to the learner's device, normalized as the algorithm
        needs); called once, before the first ``update`` and before a checkpoint is loaded."""
        ...
