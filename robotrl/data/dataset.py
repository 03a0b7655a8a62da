"""An offline dataset held as tensors on the learner's device, and the card that describes it.

Transitions are rows of one packed float32 table, so a batch is one indexing op (the columns
are views). Terminations and truncations stay apart: a truncated transition bootstraps from its
``next_observations`` row, a terminated one does not (STYLE 5). Episodes are contiguous runs of
rows; ``episode_starts`` holds their first rows.

    data = Dataset.from_episodes(episodes, card)         # or robotrl.data.load_dataset(...)
    data = data.to("cuda")
    batch = data.sample(256, generator)                  # {"obs": [256, O], "action": ...}
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

FIELDS: tuple[str, ...] = ("observations", "actions", "rewards", "next_observations",
                           "terminations", "truncations")
"""The arrays of a dataset, as written and read."""


class DatasetError(ValueError):
    """A dataset is missing, malformed, non-finite or does not fit the task; the message names
    the file and the field."""


@dataclasses.dataclass
class DatasetCard:
    """How a dataset was made and how its returns are normalized (Minari metadata where
    Minari has the field: ``ref_min_score``, ``ref_max_score``, ``algorithm_name``)."""

    task: str
    """Gymnasium id of the task the data was recorded on, e.g. ``Hopper-v5``."""
    dataset_id: str = ""
    """Minari-style id, ``namespace/task/name-vN`` (e.g. ``robotrl/hopper/expert-v0``)."""
    kind: str = ""
    """random, medium, expert, medium-replay, medium-expert, or free text for outside data."""
    policy: str = ""
    """What acted: a checkpoint path, ``uniform random``, or free text."""
    policy_return: float | None = None
    """Mean episode return of the acting policy over the recorded episodes."""
    policy_return_low: float | None = None
    """Lower end of the 95% interval of ``policy_return`` (Student-t over the episodes that
    ended by themselves; null with fewer than two of them, and for joined recordings, whose
    ``policy`` names each part's)."""
    policy_return_high: float | None = None
    """Upper end of that interval."""
    recipe: str = ""
    """How the data was recorded (``robotrl.data.recipes``): ``mean-noise`` (the policy's mean
    action plus Gaussian noise, the v0 suite) or ``d4rl`` (actions sampled from a SAC
    behaviour policy, as D4RL's and Minari's MuJoCo datasets); empty for outside data."""
    action_noise: float = 0.0
    """Std of the Gaussian noise added to the policy's actions (fraction of the half-range)."""
    seed: int | None = None
    """Seed of the collection."""
    ref_min_score: float | None = None
    """Reference return of a uniform-random policy (normalized score 0)."""
    ref_max_score: float | None = None
    """Reference return of the expert policy (normalized score 100)."""
    reference: str = ""
    """Where ``ref_min_score``/``ref_max_score`` come from: measured here, or a published table
    (D4RL's, for reading a score beside the literature's)."""
    source: str = ""
    """The file or directory the dataset was read from (set by the readers)."""
    simulator: str = ""
    """What simulated the recording: ``mujoco`` (robotrl's), ``gymnasium`` (Gymnasium's own env
    of ``task``), empty for outside data."""
    observations: list[str] = dataclasses.field(default_factory=lambda: ["policy"])
    """Observation groups of a row, flattened and concatenated in this order
    (``robotrl.envs.base.flatten_groups``): ``["policy"]``, or e.g. ``["policy", "tokens",
    "image"]`` for language-conditioned demonstrations."""
    task_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Task options the data was recorded with (``make(task, **task_options)``, e.g.
    tabletop's ``templates`` and ``image_size``): offline runs evaluate with them."""

    def normalized_score(self, episode_return: float) -> float:
        """100 (return - ref_min) / (ref_max - ref_min), D4RL's normalized score; NaN when the
        card has no reference scores."""
        if self.ref_min_score is None or self.ref_max_score is None:
            return math.nan
        return 100.0 * (episode_return - self.ref_min_score) / (
            self.ref_max_score - self.ref_min_score)

    def check_reference(self, where: str) -> None:
        """Raise ``DatasetError`` when both reference scores are set and equal: no normalized
        score can divide by an empty range."""
        if self.ref_min_score is not None and self.ref_min_score == self.ref_max_score:
            raise DatasetError(f"{where}: ref_min_score and ref_max_score are both "
                               f"{self.ref_min_score:g}; a normalized score needs them to differ "
                               "(or both null)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "dataset card") -> DatasetCard:
        """A card from its ``to_dict`` form; unknown keys are ignored (cards written by later
        versions), a field of the wrong type raises ``DatasetError`` naming it."""
        if not isinstance(data, dict):
            raise DatasetError(f"{where}: a dataset card is a JSON object, got "
                               f"{type(data).__name__}")
        out = {}
        for key, value in data.items():
            if key not in CARD_TYPES:
                continue
            if not _card_value_ok(key, value):
                kind = " or ".join(t.__name__ for t in CARD_TYPES[key])
                null = " or null" if key in OPTIONAL_CARD_FIELDS else ""
                raise DatasetError(f"{where}: card field {key!r} must be {kind}{null}, got "
                                   f"{value!r:.80}")
            numeric = CARD_TYPES[key] == (int, float) and value is not None
            out[key] = float(value) if numeric else value
        if "task" not in out:
            out["task"] = ""
        card = cls(**out)
        card.check_reference(where)
        return card


CARD_TYPES: dict[str, tuple[type, ...]] = {
    "task": (str,), "dataset_id": (str,), "kind": (str,), "policy": (str,),
    "policy_return": (int, float), "action_noise": (int, float), "seed": (int,),
    "policy_return_low": (int, float), "policy_return_high": (int, float), "recipe": (str,),
    "ref_min_score": (int, float), "ref_max_score": (int, float), "source": (str,),
    "reference": (str,), "simulator": (str,),
    "observations": (list,), "task_options": (dict,),
}
"""JSON types of each ``DatasetCard`` field (checked when a card is read from a file)."""
OPTIONAL_CARD_FIELDS = frozenset({"policy_return", "policy_return_low", "policy_return_high",
                                  "seed", "ref_min_score", "ref_max_score"})
"""Card fields that may be null."""


def _card_value_ok(key: str, value: Any) -> bool:
    if value is None:
        return key in OPTIONAL_CARD_FIELDS
    kind = CARD_TYPES[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in kind):
        return False
    if kind == (int, float):
        try:
            return math.isfinite(value)
        except OverflowError:  # an int beyond float's range
            return False
    if key == "observations":
        return all(isinstance(v, str) for v in value)
    if key == "task_options":
        return all(isinstance(k, str) for k in value)
    return True


class Dataset:
    """Transitions [T, ...] on one device; see the module docstring.

    Attributes:
        table: [T, 2 O + A + 3] float32: observations, actions, rewards, next observations,
            terminations, truncations (the last two as 0/1).
        episode_starts: [E] long, first row of every episode, ascending, ``[0]`` first.
        card: the ``DatasetCard``.
        obs_dim, act_dim: O and A.
    """

    def __init__(self, observations: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor,
                 next_observations: torch.Tensor, terminations: torch.Tensor,
                 truncations: torch.Tensor, episode_starts: torch.Tensor, card: DatasetCard,
                 where: str = "dataset") -> None:
        """Args: the ``FIELDS`` as [T, O], [T, A], [T], [T, O], [T] bool, [T] bool;
        ``episode_starts`` [E]; ``where`` names the source in errors."""
        arrays = dict(zip(FIELDS, (observations, actions, rewards, next_observations,
                                   terminations, truncations), strict=True))
        check_arrays(arrays, where)
        t = observations.shape[0]
        starts = torch.as_tensor(episode_starts, dtype=torch.long).flatten()
        if t and (starts.numel() == 0 or starts[0] != 0 or bool((starts.diff() <= 0).any())
                  or int(starts[-1]) >= t):
            raise DatasetError(f"{where}: episode_starts must ascend from 0 below {t}, got "
                               f"{starts.tolist()[:10]}")
        self.obs_dim, self.act_dim = observations.shape[1], actions.shape[1]
        self.card = card
        device = observations.device
        self.table = torch.cat([
            observations.float(), actions.float().to(device), rewards.float().to(device)[:, None],
            next_observations.float().to(device),
            terminations.to(device)[:, None].float(), truncations.to(device)[:, None].float(),
        ], dim=1)
        self.episode_starts = starts.to(device)

    def digest(self) -> str:
        """16 hex digits of SHA-256 over the rows, the episode boundaries and the card's
        reference returns (which normalized scores divide by): two datasets with one digest
        train and score alike. The bench harness records it per cell, so a table never mixes
        two recordings of one dataset id unnoticed."""
        h = hashlib.sha256(self.table.detach().cpu().contiguous().numpy().tobytes())
        h.update(self.episode_starts.cpu().numpy().astype("<i8").tobytes())
        h.update(repr((self.card.ref_min_score, self.card.ref_max_score)).encode())
        return h.hexdigest()[:16]

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_episodes(cls, episodes: Sequence[dict[str, np.ndarray]], card: DatasetCard,
                      where: str = "dataset") -> Dataset:
        """Rows from episodes as Minari stores them: ``observations`` [T_e + 1, O] (the last
        is the observation after the last step), ``actions`` [T_e, A], ``rewards``,
        ``terminations``, ``truncations`` [T_e]."""
        if not episodes:
            raise DatasetError(f"{where}: no episodes")
        obs, nxt, lengths = [], [], []
        first = episodes[0]
        widths = {k: np.shape(first[k])[1:] for k in ("observations", "actions")}
        for i, ep in enumerate(episodes):
            o = np.asarray(ep["observations"])
            n = len(ep["rewards"])
            if o.shape[0] != n + 1:
                raise DatasetError(f"{where}: episode {i} has {o.shape[0]} observations for {n} "
                                   f"steps (expected steps + 1)")
            for key, width in widths.items():
                if np.shape(ep[key])[1:] != width:
                    raise DatasetError(f"{where}: episode {i}'s {key} have shape "
                                       f"{np.shape(ep[key])[1:]} per step, episode 0's {width}")
            obs.append(o[:-1])
            nxt.append(o[1:])
            lengths.append(n)

        def cat(key: str, parts: list[np.ndarray] | None = None) -> torch.Tensor:
            parts = parts if parts is not None else [np.asarray(ep[key]) for ep in episodes]
            return torch.from_numpy(np.concatenate(parts))

        starts = torch.tensor(np.concatenate([[0], np.cumsum(lengths)[:-1]]), dtype=torch.long)
        return cls(cat("observations", obs).float(), cat("actions").float(),
                   cat("rewards").float(), cat("next_observations", nxt).float(),
                   cat("terminations").bool(), cat("truncations").bool(), starts, card, where)

    @classmethod
    def concat(cls, parts: Sequence[Dataset], card: DatasetCard) -> Dataset:
        """The rows of ``parts`` one after the other (e.g. medium-expert = medium + expert)."""
        if len({(p.obs_dim, p.act_dim) for p in parts}) != 1:
            raise DatasetError("datasets to join differ in observation or action width: "
                               f"{[(p.obs_dim, p.act_dim) for p in parts]}")
        offsets = np.cumsum([0] + [len(p) for p in parts[:-1]])
        starts = torch.cat([p.episode_starts.cpu() + int(o) for p, o in zip(parts, offsets,
                                                                            strict=True)])
        table = torch.cat([p.table.cpu() for p in parts])
        out = cls.from_table(table, starts, parts[0].obs_dim, parts[0].act_dim, card)
        return out

    @classmethod
    def from_table(cls, table: torch.Tensor, episode_starts: torch.Tensor, obs_dim: int,
                   act_dim: int, card: DatasetCard) -> Dataset:
        """A dataset over an already packed, already validated ``table``."""
        out = object.__new__(cls)
        out.table, out.episode_starts, out.card = table, episode_starts, card
        out.obs_dim, out.act_dim = obs_dim, act_dim
        return out

    def episodes(self) -> list[dict[str, np.ndarray]]:
        """The inverse of ``from_episodes``: NumPy episodes on the host."""
        out = []
        ends = self.episode_ends().tolist()
        cols = {k: getattr(self, k).cpu().numpy() for k in FIELDS}
        for s, e in zip(self.episode_starts.tolist(), ends, strict=True):
            out.append({
                "observations": np.concatenate([cols["observations"][s:e],
                                                cols["next_observations"][e - 1:e]]),
                "actions": cols["actions"][s:e], "rewards": cols["rewards"][s:e],
                "terminations": cols["terminations"][s:e], "truncations": cols["truncations"][s:e],
            })
        return out

    def to(self, device: str | torch.device) -> Dataset:
        """This dataset on ``device`` (self when it is there already)."""
        device = torch.device(device)
        if self.table.device == device:
            return self
        return Dataset.from_table(self.table.to(device), self.episode_starts.to(device),
                                  self.obs_dim, self.act_dim, self.card)

    # ------------------------------------------------------------------ columns
    def __len__(self) -> int:
        return self.table.shape[0]

    @property
    def device(self) -> torch.device:
        return self.table.device

    def _cols(self) -> dict[str, slice]:
        o, a = self.obs_dim, self.act_dim
        return {"observations": slice(0, o), "actions": slice(o, o + a),
                "rewards": slice(o + a, o + a + 1), "next_observations": slice(o + a + 1, 2 * o + a + 1),
                "terminations": slice(2 * o + a + 1, 2 * o + a + 2),
                "truncations": slice(2 * o + a + 2, 2 * o + a + 3)}

    @property
    def observations(self) -> torch.Tensor:
        """[T, O]."""
        return self.table[:, : self.obs_dim]

    @property
    def actions(self) -> torch.Tensor:
        """[T, A], in the env's units."""
        return self.table[:, self._cols()["actions"]]

    @property
    def rewards(self) -> torch.Tensor:
        """[T]."""
        return self.table[:, self.obs_dim + self.act_dim]

    @property
    def next_observations(self) -> torch.Tensor:
        """[T, O]: the observation after each step, before any reset."""
        return self.table[:, self._cols()["next_observations"]]

    @property
    def terminations(self) -> torch.Tensor:
        """[T] bool."""
        return self.table[:, -2].bool()

    @property
    def truncations(self) -> torch.Tensor:
        """[T] bool."""
        return self.table[:, -1].bool()

    @property
    def num_episodes(self) -> int:
        return self.episode_starts.numel()

    def episode_ends(self) -> torch.Tensor:
        """[E] long: one past the last row of every episode."""
        total = torch.tensor([len(self)], device=self.device)
        return torch.cat([self.episode_starts[1:], total])

    def episode_ids(self) -> torch.Tensor:
        """[T] long: the episode of every row."""
        lengths = self.episode_ends() - self.episode_starts
        return torch.repeat_interleave(torch.arange(self.num_episodes, device=self.device), lengths)

    def episode_returns(self) -> torch.Tensor:
        """[E] float64 undiscounted return of every episode."""
        sums = torch.zeros(self.num_episodes, dtype=torch.float64, device=self.device)
        return sums.index_add_(0, self.episode_ids(), self.rewards.double())

    # ------------------------------------------------------------------ sampling
    def sample(self, batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """``batch_size`` rows drawn uniformly with replacement, in one indexing op.

        Returns ``obs`` [B, O], ``action`` [B, A], ``reward`` [B], ``next_obs`` [B, O],
        ``terminated``, ``truncated`` [B] bool (the keys of ``robotrl.storage.replay``).
        """
        idx = torch.randint(len(self), (batch_size,), device=self.device, generator=generator)
        return self.unpack(self.table[idx])

    def unpack(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split packed rows [..., W] into the named fields (views)."""
        c = self._cols()
        return {"obs": rows[..., c["observations"]], "action": rows[..., c["actions"]],
                "reward": rows[..., c["rewards"]].squeeze(-1),
                "next_obs": rows[..., c["next_observations"]],
                "terminated": rows[..., -2].bool(), "truncated": rows[..., -1].bool()}

    def n_step(self, gamma: float, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """n-step targets' parts for every row t, within its episode.

        Returns ``(returns [T], discount [T], next_index [T])``: sum_{k<m} gamma^k r_{t+k},
        gamma^m if the m-step window ends without termination else 0, and the row whose
        ``next_observations`` to bootstrap from (m = min(n, steps left in the episode)).
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        t = len(self)
        end = self.episode_ends()[self.episode_ids()]  # [T] one past the episode's last row
        rows = torch.arange(t, device=self.device)
        returns = torch.zeros(t, dtype=torch.float64, device=self.device)
        alive = torch.ones(t, dtype=torch.bool, device=self.device)
        last = rows.clone()
        rew, term = self.rewards.double(), self.terminations
        for k in range(n):
            j = rows + k
            valid = alive & (j < end)
            jj = j.clamp(max=t - 1)
            returns += torch.where(valid, gamma**k * rew[jj], 0.0)
            last = torch.where(valid, jj, last)
            alive = valid & ~term[jj]
        m = (last - rows + 1).double()
        discount = torch.where(term[last], 0.0, gamma**m)
        return returns.float(), discount.float(), last

    def segments(self, length: int) -> torch.Tensor:
        """[S, length] long row indices of every window of ``length`` consecutive rows that
        stays inside one episode (for sequence models and trajectory-level losses)."""
        ends = self.episode_ends()[self.episode_ids()]
        rows = torch.arange(len(self), device=self.device)
        first = rows[rows + length <= ends]
        return first[:, None] + torch.arange(length, device=self.device)

    def check_spec(self, obs_dim: int, act_dim: int, task: str = "") -> None:
        """Raise ``DatasetError`` unless rows have ``obs_dim`` observations and ``act_dim``
        actions (the task's ``policy`` group and action sizes)."""
        where = self.card.source or self.card.dataset_id or "dataset"
        for field, have, want in (("observations", self.obs_dim, obs_dim),
                                  ("actions", self.act_dim, act_dim)):
            if have != want:
                raise DatasetError(f"{where}: field {field!r} has width {have}, but task "
                                   f"{task or self.card.task!r} needs {want}")


def check_arrays(arrays: dict[str, Any], where: str) -> None:
    """Shape and finiteness checks of the ``FIELDS`` (tensors or arrays): one length T, 2-D
    observations and actions, next observations shaped like observations, finite values."""
    missing = [k for k in FIELDS if arrays.get(k) is None]
    if missing:
        raise DatasetError(f"{where}: missing field(s) {missing}; a dataset has {list(FIELDS)}")
    t = len(arrays["observations"])
    for key in FIELDS:
        value = arrays[key]
        if len(value) != t:
            raise DatasetError(f"{where}: field {key!r} has {len(value)} rows, observations "
                               f"have {t}")
        dims = 2 if key in ("observations", "actions", "next_observations") else 1
        if value.ndim != dims:
            raise DatasetError(f"{where}: field {key!r} must be {dims}-D, got shape "
                               f"{tuple(value.shape)}")
        if key in ("terminations", "truncations"):
            continue
        x = torch.as_tensor(value)
        if not bool(torch.isfinite(x).all()):
            bad = int((~torch.isfinite(x)).reshape(t, -1).any(-1).nonzero()[0, 0])
            raise DatasetError(f"{where}: field {key!r} has NaN/Inf (first at row {bad})")
    if tuple(arrays["next_observations"].shape) != tuple(arrays["observations"].shape):
        raise DatasetError(f"{where}: field 'next_observations' has shape "
                           f"{tuple(arrays['next_observations'].shape)}, observations have "
                           f"{tuple(arrays['observations'].shape)}")
