"""Reading and writing datasets: Minari (through minari's own API) and D4RL-style HDF5.

``load_dataset(ref)`` takes what a user types after ``dataset=``:

- a Minari dataset id (``robotrl/hopper/expert-v0``), looked up under ``MINARI_DATASETS_PATH``
  (or minari's default root, ``~/.minari/datasets``); an id of Minari's remote that is not
  there yet (``mujoco/hopper/medium-v0``) is downloaded with ``minari.download_dataset`` (the
  ``robotrl/`` and ``gymnasium/`` namespaces, robotrl's own recordings, never are), and read
  like any other, its files checked first;
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

import contextlib
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator
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


LOCAL_NAMESPACES: tuple[str, ...] = ("robotrl", "gymnasium")
"""Namespaces of the ids ``robotrl dataset collect`` writes: looked up locally, never downloaded
(so no one mistakes a robotrl recording for a published dataset, or the reverse)."""
_REMOTE_ID = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+-v\d+")


def _download(ref: str) -> Path | None:
    """The ``data`` directory of Minari's remote dataset ``ref`` (e.g. ``mujoco/hopper/medium-v0``)
    after downloading it under ``datasets_root()``; None when ``ref`` is not such an id (a
    local namespace, a path). A download that fails raises ``DatasetError`` naming the id."""
    if ref.split("/")[0] in LOCAL_NAMESPACES or not _REMOTE_ID.fullmatch(ref):
        return None
    minari, root = _minari(), datasets_root()
    try:
        with _minari_root_in(root) as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            minari.download_dataset(ref)
            (root / ref).parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / ref, root / ref)
    except Exception as err:  # noqa: BLE001 - no network, unknown id, a missing extra, ...
        why = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        raise DatasetError(
            f"unknown dataset {ref!r}: not under {root} (local ids: {_local_ids() or 'none'}) "
            f"and not downloadable from Minari's remote ({why}); without internet access here, "
            f"download it where there is (minari download {ref}) and copy it to {root / ref}"
        ) from None
    return _minari_dir(ref)


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
    found = _minari_dir(ref) or _download(ref)
    if found is not None:
        return "minari", found
    raise DatasetError(f"unknown dataset {ref!r}: not an .hdf5 file, a Minari directory, or a "
                       f"Minari id under {datasets_root()} (MINARI_DATASETS_PATH); local ids: "
                       f"{_local_ids() or 'none'}")


# ---------------------------------------------------------------------------- Minari
def _minari_card(ds: Any, path: Path) -> DatasetCard:
    meta = ds.storage.metadata
    card = parse_card(meta[CARD_KEY], str(path.parent)) if CARD_KEY in meta else None
    try:
        env_spec = ds.spec.env_spec
    except Exception as err:  # noqa: BLE001 - minari raises many types on bad metadata
        raise DatasetError(f"{path.parent}: bad Minari metadata ({type(err).__name__}: {err})"
                           ) from None
    task = env_spec.id if env_spec is not None else ""
    if card is None:
        card = DatasetCard(task=task, dataset_id=str(meta.get("dataset_id", "")),
                           policy=str(meta.get("algorithm_name") or ""))
    card.task = card.task or task
    for key in ("ref_min_score", "ref_max_score"):  # Minari's own fields win
        if meta.get(key) is not None:
            try:
                setattr(card, key, float(meta[key]))
            except (TypeError, ValueError, OverflowError):
                raise DatasetError(f"{path.parent}: metadata {key}={meta[key]!r:.40} is not a "
                                   "number") from None
    card.check_reference(str(path.parent))
    card.source = str(path.parent)
    return card


MAX_METADATA_BYTES = 16 << 20
"""Largest Minari ``metadata.json`` read (they are a few kilobytes)."""
MAX_SPACE_SIZE = 1 << 24
"""Most numbers a Box space of a Minari dataset may declare (observation or action)."""


def _check_space(meta: dict[str, Any], key: str, where: str) -> None:
    """A Minari space entry: serialized JSON of a flat, numeric, reasonably sized Box."""
    raw = meta.get(key)
    if not isinstance(raw, str):
        raise DatasetError(f"{where}: metadata.json declares no {key}; Minari would then build "
                           f"the dataset's environment with gym.make, which imports code the "
                           f"file names, so robotrl refuses it")
    try:
        space = json.loads(raw)
    except (ValueError, RecursionError):
        raise DatasetError(f"{where}: metadata {key} is not JSON") from None
    if not isinstance(space, dict) or space.get("type") != "Box":
        kind = space.get("type") if isinstance(space, dict) else space
        raise DatasetError(f"{where}: {key} is {kind!r:.40}; robotrl reads flat Box spaces only")
    shape, dtype = space.get("shape"), space.get("dtype")
    if not (isinstance(shape, list) and len(shape) <= 8
            and all(type(n) is int and 0 <= n <= MAX_SPACE_SIZE for n in shape)
            and np.prod(shape, dtype=object) <= MAX_SPACE_SIZE):
        raise DatasetError(f"{where}: {key} has shape {shape!r:.60}; expected at most "
                           f"{MAX_SPACE_SIZE} numbers")
    if dtype not in NUMERIC_DTYPES:
        raise DatasetError(f"{where}: {key} has dtype {dtype!r:.40}; allowed: {NUMERIC_DTYPES}")


NUMERIC_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                  "uint16", "uint32", "uint64", "bool")
"""Element types a dataset's arrays may have."""


def _identity(path: Path) -> tuple[Any, ...] | None:
    """What names a Minari ``data`` directory's two files as they are on disk now (device,
    inode, size, modification and change times of each), or None where one cannot be stat'ed;
    rewriting or replacing either file gives another identity."""
    try:
        stats = [(path / name).stat() for name in ("metadata.json", "main_data.hdf5")]
    except OSError:
        return None
    return (str(path.resolve()), *((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns)
                                   for s in stats))


_CHECKED: set[tuple[Any, ...]] = set()
"""The Minari files ``check_minari`` passed in this process, by ``_identity``: checking a
1M-step dataset's every episode header takes 5-15 s, and ``robotrl bench list`` composes an
offline grid's every cell, each reading its dataset's card."""
_CARDS: dict[tuple[Any, ...], DatasetCard] = {}
"""``load_card``'s cards of Minari datasets in this process, by ``_identity``."""


def check_minari(path: Path) -> None:
    """Check a Minari ``data`` directory's metadata (and, for HDF5 storage, every episode's
    array headers) before minari reads it: declared flat numeric Box spaces (so minari never
    builds an environment), consistent episode lengths and step counts, within memory. Files
    that passed once in this process, unchanged since (``_identity``), are not read again."""
    identity = _identity(path)
    if identity is not None and identity in _CHECKED:
        return
    _check_minari(path)
    if identity is not None:
        _CHECKED.add(identity)


def _check_minari(path: Path) -> None:
    where = str(path.parent)
    meta_file = path / "metadata.json"
    try:
        if not meta_file.is_file():
            raise DatasetError(f"{where}: metadata.json is not a regular file")
        with open(meta_file, "rb") as f:
            raw = f.read(MAX_METADATA_BYTES + 1)
        if len(raw) > MAX_METADATA_BYTES:
            raise DatasetError(f"{where}: metadata.json is over {MAX_METADATA_BYTES} bytes")
        meta = json.loads(raw)
    except DatasetError:
        raise
    except (OSError, ValueError, RecursionError) as err:
        raise DatasetError(f"{where}: unreadable metadata.json ({err})") from None
    if not isinstance(meta, dict):
        raise DatasetError(f"{where}: metadata.json is not a JSON object")
    for key in ("observation_space", "action_space"):
        _check_space(meta, key, where)
    fmt = meta.get("data_format", "hdf5")
    if fmt != "hdf5":  # arrow files carry no headers robotrl checks before reading
        raise DatasetError(f"{where}: data_format {fmt!r:.40}; robotrl reads Minari's hdf5 "
                           "storage (minari's default), not arrow")
    counts = {k: meta.get(k) for k in ("total_steps", "total_episodes")}
    if not all(type(v) is int and v >= 0 for v in counts.values()):
        raise DatasetError(f"{where}: metadata {counts} must be counts (integers >= 0)")
    widths = {k: tuple(json.loads(meta[f"{k}_space"])["shape"]) for k in ("observation", "action")}
    _check_minari_hdf5(path / "main_data.hdf5", counts["total_steps"], counts["total_episodes"],
                       widths, where)


def _check_minari_hdf5(file: Path, steps: int, episodes: int, widths: dict[str, tuple[int, ...]],
                       where: str) -> None:
    """Every episode's array headers (``check_h5_array``), their per-step shapes against the
    declared spaces (``widths``), and the step count against the metadata."""
    with _open_hdf5(file) as f, h5_errors(file):
        if len(f) != episodes:  # before anything sized by the metadata is built
            raise DatasetError(f"{where}: {len(f)} episode groups in the data file, "
                               f"metadata says {episodes}")
        names = [f"episode_{i}" for i in range(episodes)]
        if sorted(f.keys()) != sorted(names):
            raise DatasetError(f"{where}: episode groups are not episode_0 ... "
                               f"episode_{episodes - 1}")
        total, budget = 0, memory_budget()
        for name in names:
            ep = f[name]
            if not isinstance(ep, _h5py().Group):
                raise DatasetError(f"{where}: {name} is not an episode group")
            n = check_h5_array(ep.get("rewards"), f"{where}: {name}/rewards", (1,))
            check_h5_array(ep.get("observations"), f"{where}: {name}/observations", (2,), n + 1)
            for key in ("actions", "terminations", "truncations"):
                check_h5_array(ep.get(key), f"{where}: {name}/{key}", (2,) if key == "actions"
                               else (1,), n)
            for key, space in (("observations", "observation"), ("actions", "action")):
                if ep[key].shape[1:] != widths[space]:
                    raise DatasetError(f"{where}: {name}/{key} have shape {ep[key].shape[1:]} "
                                       f"per step; the {space} space declares {widths[space]}")
            infos = ep.get("infos")  # minari reads every array in it whole
            if infos is not None:
                arrays: list[Any] = []
                infos.visititems(lambda _, obj, out=arrays: out.append(obj))
                for obj in arrays:
                    if isinstance(obj, _h5py().Dataset):
                        check_h5_array(obj, f"{where}: {name}/infos/{obj.name}", (1, 2, 3, 4))
            budget -= 8 * (n + 1) * (int(np.prod(widths["observation"])) + 4)
            if budget < 0:
                raise DatasetError(f"{where}: the episodes hold more than this machine's memory")
            total += n
        if total != steps:
            raise DatasetError(f"{where}: episodes hold {total} steps, metadata says {steps}")


def _open_minari(path: Path) -> Any:
    check_minari(path)
    minari = _minari()
    try:
        return minari.MinariDataset(str(path))
    except Exception as err:  # noqa: BLE001 - minari raises many types on bad files
        raise DatasetError(f"{path.parent}: cannot read the Minari dataset ({err})") from err


def load_card(ref: str) -> DatasetCard:
    """The card of the dataset ``ref`` names, reading no rows (a Minari dataset's files are
    checked first, once a process while they are unchanged: ``check_minari``)."""
    kind, path = _resolve(ref)
    if kind == "minari":
        identity = _identity(path)
        card = _CARDS.get(identity) if identity is not None else None
        if card is None:
            card = _minari_card(_open_minari(path), path)
            if identity is not None:
                _CARDS[identity] = card
        return dataclass_copy(card)  # the caller's to change
    with _open_hdf5(path) as f, h5_errors(path):
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
    with _minari_root_in(root) as tmp:
        both = card.ref_min_score is not None and card.ref_max_score is not None
        with warnings.catch_warnings():  # minari asks for author, e-mail, permalink: optional
            warnings.simplefilter("ignore", UserWarning)
            ds = minari.create_dataset_from_buffers(
                dataset_id, buffers, env=env_spec, algorithm_name=card.policy or None,
                ref_min_score=card.ref_min_score if both else None,
                ref_max_score=card.ref_max_score if both else None,
                description=f"{card.kind} data recorded by robotrl".strip(),
                data_format="hdf5",  # the storage whose headers load_dataset checks
                **spaces)
        ds.storage.update_metadata({CARD_KEY: json.dumps(card.to_dict())})
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / dataset_id, final)
    return final


@contextlib.contextmanager
def _minari_root_in(root: Path) -> Iterator[Path]:
    """A fresh temporary folder under ``root`` as minari's datasets root while the block runs
    (minari writes and downloads there; the caller renames the result into place, so a
    failure part way leaves nothing under ``root``); removed, and the root restored, after."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".robotrl-", dir=root))
    previous = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(tmp)
    try:
        yield tmp
    finally:
        if previous is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = previous
        shutil.rmtree(tmp, ignore_errors=True)


def dataclass_copy(card: DatasetCard, **changes: Any) -> DatasetCard:
    return DatasetCard.from_dict({**card.to_dict(), **changes})


# ---------------------------------------------------------------------------- HDF5
HDF5_FIELDS: tuple[str, ...] = ("observations", "actions", "rewards", "terminals", "timeouts")
"""Required arrays of a D4RL-style file (``next_observations`` is optional)."""


def _read_hdf5_fields(f: Any, path: Path) -> dict[str, np.ndarray]:
    """The D4RL fields of an open file, every header checked before any data is read."""
    missing = [k for k in HDF5_FIELDS if k not in f]
    if missing:
        raise DatasetError(f"{path}: missing field(s) {missing}; a D4RL-style file has "
                           f"{list(HDF5_FIELDS)} and optionally 'next_observations'")
    keys = [k for k in (*HDF5_FIELDS, "next_observations") if k in f]
    rows = check_h5_array(f["observations"], f"{path}: field 'observations'", (2,))
    dims = {"actions": (2,), "next_observations": (2,), "rewards": (1, 2)}
    for key in keys[1:]:
        check_h5_array(f[key], f"{path}: field {key!r}", dims.get(key, (1,)), rows)
    # float32 copies of everything, twice (the arrays, then the dataset's table)
    needed = 2 * 4 * sum(int(np.prod(f[k].shape, dtype=object)) for k in keys)
    if needed > memory_budget():
        raise DatasetError(f"{path}: loading it needs ~{needed / 2**30:.1f} GiB, more than this "
                           "machine's memory")
    return {k: np.asarray(f[k]) for k in keys}


@contextlib.contextmanager
def h5_errors(path: Path) -> Iterator[None]:
    """h5py's errors on a damaged file (the header opens, a later read does not) as
    ``DatasetError`` naming ``path``."""
    try:
        yield
    except DatasetError:
        raise
    except (OSError, KeyError, RuntimeError, ValueError, TypeError, OverflowError) as err:
        raise DatasetError(f"{path}: truncated or corrupt data ({err})") from None


def _open_hdf5(path: Path) -> Any:
    h5py = _h5py()
    try:
        return h5py.File(path, "r")
    except (OSError, RuntimeError, ValueError) as err:
        raise DatasetError(f"{path}: not a readable HDF5 file ({err})") from None


def _hdf5_card(f: Any, path: Path) -> DatasetCard:
    card = parse_card(f.attrs.get(CARD_KEY), str(path))
    env = f.attrs.get("env", "")
    card.task = card.task or (env if isinstance(env, str) else "")
    card.source = str(path)
    return card


def parse_card(raw: Any, where: str) -> DatasetCard:
    """The card stored as JSON text (``None``: a card with no task); a card that is not JSON, or
    whose fields have the wrong types, raises ``DatasetError`` naming ``where``."""
    if raw is None:
        return DatasetCard(task="")
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    if not isinstance(raw, str) or len(raw) > MAX_CARD_CHARS:
        raise DatasetError(f"{where}: the dataset card ({CARD_KEY}) is not JSON text of at most "
                           f"{MAX_CARD_CHARS} characters")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise DatasetError(f"{where}: the dataset card ({CARD_KEY}) is not JSON ({err})") from None
    return DatasetCard.from_dict(data, where)


MAX_CARD_CHARS = 1 << 20
"""Longest card read (cards are a few hundred characters)."""


def memory_budget() -> int:
    """Bytes a dataset may take once loaded: the machine's physical memory. A file whose header
    claims more is refused before anything is allocated."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): 64 GiB
        return 64 << 30


def check_h5_array(obj: Any, where: str, ndims: tuple[int, ...], rows: int | None = None) -> int:
    """Check an HDF5 dataset's header before reading it: a plain numeric array (never object,
    string, variable-length, compound or reference data) with one of ``ndims`` dimensions,
    ``rows`` rows when given, within ``memory_budget()``, and (stored uncompressed) with as many
    bytes on disk as it claims. Returns its row count."""
    h5py = _h5py()
    if obj is None:
        raise DatasetError(f"{where}: missing")
    if not isinstance(obj, h5py.Dataset):
        raise DatasetError(f"{where}: not an array (an HDF5 {type(obj).__name__})")
    dtype = obj.dtype
    if dtype.kind not in "biuf" or dtype.hasobject or h5py.check_dtype(vlen=dtype) is not None:
        raise DatasetError(f"{where}: dtype {dtype} is not allowed; datasets hold numbers "
                           "(bool, int, uint, float)")
    if len(obj.shape) not in ndims:
        raise DatasetError(f"{where}: must be {' or '.join(map(str, ndims))}-D, got shape "
                           f"{obj.shape}")
    if rows is not None and obj.shape[0] != rows:
        raise DatasetError(f"{where}: has {obj.shape[0]} rows, expected {rows}")
    nbytes = int(np.prod(obj.shape, dtype=object)) * dtype.itemsize
    if nbytes > memory_budget():
        raise DatasetError(f"{where}: claims shape {obj.shape} ({nbytes / 2**30:.1f} GiB), more "
                           f"than this machine's memory; refusing to allocate it")
    stored = obj.id.get_storage_size()
    if not obj.compression and stored < nbytes:
        raise DatasetError(f"{where}: claims shape {obj.shape} ({nbytes} bytes) but the file "
                           f"stores {stored}: truncated or corrupt")
    if obj.compression and nbytes > MAX_COMPRESSION * max(stored, 1):
        raise DatasetError(f"{where}: {stored} stored bytes claim {nbytes} ({obj.compression}): "
                           f"more than {MAX_COMPRESSION}x, refused as a compression bomb")
    if obj.chunks is not None and nbytes:
        chunks = int(np.prod([-(-n // c) for n, c in zip(obj.shape, obj.chunks, strict=True)]))
        if obj.id.get_num_chunks() != chunks:
            raise DatasetError(f"{where}: {obj.id.get_num_chunks()} of its {chunks} chunks are "
                               "written: truncated or corrupt")
    return int(obj.shape[0]) if obj.shape else 0


MAX_COMPRESSION = 200
"""Largest ratio of claimed to stored bytes a compressed array may have (real datasets
compress 2-10x; a larger claim is a bomb)."""


def load_hdf5(path: str | Path) -> Dataset:
    """A D4RL-style HDF5 file as a ``Dataset`` (see the module docstring)."""
    path = Path(path)
    with _open_hdf5(path) as f, h5_errors(path):
        card = _hdf5_card(f, path)
        arr = _read_hdf5_fields(f, path)
    if arr["rewards"].ndim == 2 and arr["rewards"].shape[1] != 1:
        raise DatasetError(f"{path}: field 'rewards' must be [T] or [T, 1], got shape "
                           f"{arr['rewards'].shape}")
    obs = arr["observations"]
    term, trunc = arr["terminals"].astype(bool), arr["timeouts"].astype(bool)
    t = len(obs)  # every field has t rows (check_h5_array)
    if t == 0:
        raise DatasetError(f"{path}: no transitions")
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
