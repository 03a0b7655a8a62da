"""Reading and writing datasets: Minari (through minari's own API) and D4RL-style HDF5.

``load_dataset(ref)`` takes what a user types after ``dataset=``:

- a Minari dataset id (``robotrl/hopper/expert-v0``), looked up under ``MINARI_DATASETS_PATH``
  (or minari's default root, ``~/.minari/datasets``); nothing is ever downloaded;
- a Minari dataset directory (the one holding ``data/``, or ``data/`` itself);
- an HDF5 file in D4RL's layout: ``observations``, ``actions``, ``rewards``, ``terminals``,
  ``timeouts``, optional ``next_observations`` (without it, a row's next observation is the
  next row's, and rows that end an episode by timeout are dropped, as D4RL's q-learning view).

Writers never overwrite: ``save_minari`` builds the dataset under a temporary root and renames
it into place; ``save_hdf5`` writes through ``robotrl.checkpoint.atomic_open``. Minari is the
``offline`` extra (``pip install 'robotrl[offline]'``); only ``minari.create_dataset_from_buffers``
and ``EpisodeBuffer`` are used, which need neither jax nor minari's ``create`` extra.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robotrl.data.dataset import Dataset, DatasetCard, DatasetError

CARD_KEY = "robotrl_card"
"""Metadata key (Minari metadata, HDF5 attribute) holding the ``DatasetCard`` as JSON."""

HDF5_SUFFIXES = (".hdf5", ".h5")


def _minari() -> Any:
    try:
        import minari
    except ImportError:
        raise DatasetError("Minari datasets need minari: pip install 'robotrl[offline]'") from None
    return minari


def _h5py() -> Any:
    try:
        import h5py
    except ImportError:
        raise DatasetError("HDF5 datasets need h5py: pip install 'robotrl[offline]'") from None
    return h5py


def datasets_root() -> Path:
    """Where Minari ids are looked up: ``MINARI_DATASETS_PATH``, else minari's default."""
    env = os.environ.get("MINARI_DATASETS_PATH")
    return Path(env) if env else Path.home() / ".minari" / "datasets"


def _minari_dir(ref: str) -> Path | None:
    """The Minari ``data`` directory ``ref`` names (a path or an id), or None."""
    for base in (Path(ref), datasets_root() / ref):
        if (base / "data" / "metadata.json").exists():
            return base / "data"
        if (base / "metadata.json").exists():
            return base
    return None


def _local_ids() -> list[str]:
    root = datasets_root()
    return sorted(str(p.parent.parent.relative_to(root))
                  for p in root.glob("**/data/metadata.json")) if root.exists() else []


def _resolve(ref: str) -> tuple[str, Path]:
    """("minari" | "hdf5", path) for a ``dataset=`` value; unknown ones fail listing local ids."""
    if not ref:
        raise DatasetError("no dataset given: dataset=<Minari id, Minari directory or .hdf5 file>")
    path = Path(ref)
    if path.suffix in HDF5_SUFFIXES:
        if not path.is_file():
            raise DatasetError(f"{ref}: no such HDF5 file")
        return "hdf5", path
    found = _minari_dir(ref)
    if found is not None:
        return "minari", found
    raise DatasetError(f"unknown dataset {ref!r}: not an .hdf5 file, a Minari directory, or a "
                       f"Minari id under {datasets_root()} (MINARI_DATASETS_PATH); local ids: "
                       f"{_local_ids() or 'none'}")


# ---------------------------------------------------------------------------- Minari
def _minari_card(ds: Any, path: Path) -> DatasetCard:
    meta = ds.storage.metadata
    card = DatasetCard.from_dict(json.loads(meta[CARD_KEY])) if CARD_KEY in meta else None
    env_spec = ds.spec.env_spec
    task = env_spec.id if env_spec is not None else ""
    if card is None:
        card = DatasetCard(task=task, dataset_id=str(meta.get("dataset_id", "")),
                           policy=str(meta.get("algorithm_name") or ""))
    card.task = card.task or task
    for key in ("ref_min_score", "ref_max_score"):  # Minari's own fields win
        if meta.get(key) is not None:
            setattr(card, key, float(meta[key]))
    card.source = str(path.parent)
    return card


def _open_minari(path: Path) -> Any:
    minari = _minari()
    try:
        return minari.MinariDataset(str(path))
    except Exception as err:  # noqa: BLE001 - minari raises many types on bad files
        raise DatasetError(f"{path.parent}: cannot read the Minari dataset ({err})") from err


def load_card(ref: str) -> DatasetCard:
    """The card of the dataset ``ref`` names, reading only metadata."""
    kind, path = _resolve(ref)
    if kind == "minari":
        return _minari_card(_open_minari(path), path)
    with _open_hdf5(path) as f:
        return _hdf5_card(f, path)


def load_dataset(ref: str, device: str | torch.device = "cpu") -> Dataset:
    """The dataset ``ref`` names (see the module docstring), validated, on ``device``."""
    kind, path = _resolve(ref)
    if kind == "hdf5":
        return load_hdf5(path).to(device)
    ds = _open_minari(path)
    card = _minari_card(ds, path)
    episodes = []
    try:
        for ep in ds.iterate_episodes():
            if isinstance(ep.observations, dict) or isinstance(ep.actions, dict):
                raise DatasetError(f"{card.source}: dict observations/actions are not supported "
                                   f"yet; flat Box spaces only")
            episodes.append({"observations": ep.observations, "actions": ep.actions,
                             "rewards": ep.rewards, "terminations": ep.terminations,
                             "truncations": ep.truncations})
    except DatasetError:
        raise
    except Exception as err:  # noqa: BLE001 - a truncated HDF5 inside the Minari directory
        raise DatasetError(f"{card.source}: cannot read episodes ({type(err).__name__}: {err})"
                           ) from err
    return Dataset.from_episodes(episodes, card, where=card.source).to(device)


def save_minari(data: Dataset, dataset_id: str, root: str | Path | None = None) -> Path:
    """Write ``data`` as Minari dataset ``dataset_id`` under ``root`` (default
    ``datasets_root()``) with ``minari.create_dataset_from_buffers``; returns its directory.

    The card goes into Minari's metadata (``ref_min_score``, ``ref_max_score``,
    ``algorithm_name``) and whole under ``robotrl_card``. Refuses to overwrite a dataset.
    """
    minari = _minari()
    import gymnasium as gym
    from minari.data_collector import EpisodeBuffer

    root = Path(root) if root is not None else datasets_root()
    final = root / dataset_id
    if final.exists():
        raise DatasetError(f"{final} exists; pick another dataset id or remove it")
    card = dataclass_copy(data.card, dataset_id=dataset_id, source="")
    buffers = [EpisodeBuffer(id=i, observations=ep["observations"], actions=ep["actions"],
                             rewards=list(ep["rewards"]), terminations=list(ep["terminations"]),
                             truncations=list(ep["truncations"]))
               for i, ep in enumerate(data.episodes())]
    try:
        env_spec = gym.spec(card.task) if card.task else None
    except gym.error.Error:
        env_spec = None
    box = gym.spaces.Box
    spaces = {"observation_space": box(-np.inf, np.inf, (data.obs_dim,), np.float64),
              "action_space": box(-1.0, 1.0, (data.act_dim,), np.float32)}
    if env_spec is not None:
        env = gym.make(env_spec)
        spaces = {"observation_space": env.observation_space, "action_space": env.action_space}
        env.close()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".robotrl-", dir=root))
    previous = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(tmp)
    try:
        both = card.ref_min_score is not None and card.ref_max_score is not None
        with warnings.catch_warnings():  # minari asks for author, e-mail, permalink: optional
            warnings.simplefilter("ignore", UserWarning)
            ds = minari.create_dataset_from_buffers(
                dataset_id, buffers, env=env_spec, algorithm_name=card.policy or None,
                ref_min_score=card.ref_min_score if both else None,
                ref_max_score=card.ref_max_score if both else None,
                description=f"{card.kind} data recorded by robotrl".strip(),
                **spaces)
        ds.storage.update_metadata({CARD_KEY: json.dumps(card.to_dict())})
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / dataset_id, final)
    finally:
        if previous is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = previous
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def dataclass_copy(card: DatasetCard, **changes: Any) -> DatasetCard:
    return DatasetCard.from_dict({**card.to_dict(), **changes})


# ---------------------------------------------------------------------------- HDF5
HDF5_FIELDS: tuple[str, ...] = ("observations", "actions", "rewards", "terminals", "timeouts")
"""Required arrays of a D4RL-style file (``next_observations`` is optional)."""


def _open_hdf5(path: Path) -> Any:
    h5py = _h5py()
    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise DatasetError(f"{path}: not a readable HDF5 file ({err})") from err


def _hdf5_card(f: Any, path: Path) -> DatasetCard:
    raw = f.attrs.get(CARD_KEY)
    card = DatasetCard.from_dict(json.loads(raw)) if raw is not None else DatasetCard(task="")
    card.task = card.task or str(f.attrs.get("env", ""))
    card.source = str(path)
    return card


def load_hdf5(path: str | Path) -> Dataset:
    """A D4RL-style HDF5 file as a ``Dataset`` (see the module docstring)."""
    path = Path(path)
    with _open_hdf5(path) as f:
        card = _hdf5_card(f, path)
        missing = [k for k in HDF5_FIELDS if k not in f]
        if missing:
            raise DatasetError(f"{path}: missing field(s) {missing}; a D4RL-style file has "
                               f"{list(HDF5_FIELDS)} and optionally 'next_observations'")
        try:
            arr = {k: np.asarray(f[k]) for k in (*HDF5_FIELDS, "next_observations") if k in f}
        except OSError as err:  # truncated file: the header reads, the data does not
            raise DatasetError(f"{path}: truncated or corrupt data ({err})") from err
    obs, term, trunc = arr["observations"], arr["terminals"].astype(bool), arr["timeouts"].astype(bool)
    t = len(obs)
    for key in ("actions", "rewards", "terminals", "timeouts"):
        if len(arr[key]) != t:
            raise DatasetError(f"{path}: field {key!r} has {len(arr[key])} rows, observations "
                               f"have {t}")
    if "next_observations" in arr:
        keep = np.ones(t, dtype=bool)
        nxt = arr["next_observations"]
    else:  # the successor row is the next observation; rows without one are dropped
        nxt = np.concatenate([obs[1:], obs[-1:]])
        keep = ~trunc & ~((np.arange(t) == t - 1) & ~term)
        nxt = np.where(term[:, None], obs, nxt)
    ends = term | trunc
    ends[-1] = True
    episode = np.concatenate([[0], np.cumsum(ends)[:-1]])[keep]
    starts = np.flatnonzero(np.concatenate([[True], episode[1:] != episode[:-1]])) if len(episode) else np.zeros(0, int)
    arrays = {"observations": obs[keep], "actions": arr["actions"][keep],
              "rewards": arr["rewards"][keep].reshape(-1), "next_observations": nxt[keep],
              "terminations": term[keep], "truncations": trunc[keep]}
    if not keep.any():
        raise DatasetError(f"{path}: no usable transitions")
    t_ = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
    return Dataset(t_["observations"].float(), t_["actions"].float(), t_["rewards"].float(),
                   t_["next_observations"].float(), t_["terminations"].bool(),
                   t_["truncations"].bool(), torch.from_numpy(starts), card, where=str(path))


def save_hdf5(data: Dataset, path: str | Path) -> Path:
    """Write ``data`` in D4RL's layout (with ``next_observations``) and its card as the
    ``robotrl_card`` attribute, atomically; refuses to overwrite."""
    h5py = _h5py()
    from robotrl.checkpoint import atomic_open

    path = Path(path)
    if path.exists():
        raise DatasetError(f"{path} exists; pick another path or remove it")
    card = dataclass_copy(data.card, source="")
    with atomic_open(path, "wb") as raw, h5py.File(raw, "w") as f:
        f.attrs[CARD_KEY] = json.dumps(card.to_dict())
        f.attrs["env"] = card.task
        f["observations"] = data.observations.cpu().numpy()
        f["actions"] = data.actions.cpu().numpy()
        f["rewards"] = data.rewards.cpu().numpy()
        f["next_observations"] = data.next_observations.cpu().numpy()
        f["terminals"] = data.terminations.cpu().numpy()
        f["timeouts"] = data.truncations.cpu().numpy()
    return path
