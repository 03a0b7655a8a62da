"""Atomic, validated, data-only checkpoints: a crash or a kill mid-save never leaves a broken
file, and loading one never runs code from it.

A checkpoint is one safetensors file (https://github.com/huggingface/safetensors): every
tensor and NumPy array of the payload as a named tensor, and the rest of the payload (config,
counters, RNG states, optimizer hyperparameters, evaluations) as JSON in the file's metadata,
with the tensors referenced by name. Nothing is unpickled: safetensors checks that the header's
offsets, shapes and dtypes fit the file before anything is read, and the JSON decoder below
knows a handful of tags (tuples, non-string keys, arrays, NumPy scalars) and refuses the rest.
Checkpoints of the earlier pickle format are refused, naming the one-time conversion
(``robotrl checkpoint upgrade PATH``, which trusts the file it converts).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

FORMAT_VERSION = 2
"""2: safetensors + JSON (data only); 1: ``torch.save`` pickles (refused, see ``upgrade``)."""
MAGIC_KEY = "robotrl_checkpoint"
"""safetensors metadata key holding ``FORMAT_VERSION``; the payload's JSON is under ``payload``."""
MAX_DEPTH = 64
"""Deepest nesting the decoder follows (a crafted file must not exhaust the stack)."""
_PICKLE_MAGIC = (b"PK\x03\x04", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
"""How ``torch.save`` files begin (zip archive; a bare pickle stream, protocols 2-5). Only a
file that is not valid safetensors is matched against them: a safetensors file starts with
its header's length, whose first byte may be anything."""
_NUMERIC_KINDS = "biufc"
"""NumPy dtype kinds a checkpoint may hold (bool, int, uint, float, complex): never objects."""


def _read_umask() -> int:
    umask = os.umask(0)  # the only way to read it; once, at import, before any thread
    os.umask(umask)
    return umask


_UMASK = _read_umask()


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupt, of another format, or holds more than
    data; the message names the file and the problem."""


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temp file beside ``path``; on success fsync it and rename it over ``path``.

    A crash, a kill or a full disk at any point leaves either the old file or the complete new
    one (the temp file is removed when writing fails).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp's 0600 would make outputs private
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike[str], data: Any, indent: int = 2) -> Path:
    """Write ``data`` as JSON to ``path`` atomically (see ``atomic_open``)."""
    with atomic_open(path, "w") as f:
        json.dump(data, f, indent=indent)
    return Path(path)


# ---------------------------------------------------------------------------- encoding
def _encode(value: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    """``value`` as JSON-able data; tensors and arrays go to ``tensors`` and are referenced."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, torch.Tensor):
        name = str(len(tensors))
        # own contiguous storage: safetensors refuses views that share memory
        tensors[name] = value.detach().to("cpu", copy=True).contiguous()
        return {"$tensor": name}
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _NUMERIC_KINDS:
            raise TypeError(f"{where}: NumPy arrays of dtype {value.dtype} cannot be saved")
        name = str(len(tensors))
        raw = np.ascontiguousarray(value).view(np.uint8).reshape(-1)
        tensors[name] = torch.from_numpy(raw.copy())
        return {"$ndarray": name, "dtype": value.dtype.str, "shape": list(value.shape)}
    if isinstance(value, np.generic):
        if value.dtype.kind not in "biuf" or value.dtype.itemsize > 8:
            raise TypeError(f"{where}: NumPy scalars of dtype {value.dtype} cannot be saved")
        return {"$npscalar": value.dtype.str, "value": _encode(value.item(), tensors, where)}
    if isinstance(value, (list, tuple)):
        items = [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else {"$tuple": items}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: _encode(v, tensors, f"{where}.{k}") for k, v in value.items()}
        return {"$dict": [[_encode(k, tensors, where), _encode(v, tensors, f"{where}[{k!r}]")]
                          for k, v in value.items()]}
    raise TypeError(f"{where}: a {type(value).__name__} cannot go in a checkpoint (data only: "
                    "tensors, arrays, numbers, strings, lists, tuples, dicts)")


def _decode(value: Any, tensors: dict[str, torch.Tensor], where: str, depth: int = 0) -> Any:
    """The inverse of ``_encode``; anything it did not write raises ``ValueError``."""
    if depth > MAX_DEPTH:
        raise ValueError(f"{where}: nested deeper than {MAX_DEPTH}")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_decode(v, tensors, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if not isinstance(value, dict):
        raise ValueError(f"{where}: unexpected {type(value).__name__}")
    tags = [k for k in value if k.startswith("$")]
    if not tags:
        return {k: _decode(v, tensors, f"{where}.{k}", depth + 1) for k, v in value.items()}
    tag = tags[0]
    if tag == "$tensor" and set(value) == {tag}:
        if value[tag] not in tensors:
            raise ValueError(f"{where}: refers to a tensor the file does not hold")
        return tensors[value[tag]]
    if tag == "$ndarray" and set(value) == {tag, "dtype", "shape"}:
        dtype, shape = np.dtype(str(value["dtype"])), value["shape"]
        if dtype.kind not in _NUMERIC_KINDS or dtype.hasobject:
            raise ValueError(f"{where}: NumPy dtype {dtype} is not allowed")
        if not (isinstance(shape, list) and len(shape) <= 32
                and all(type(s) is int and 0 <= s < 2**62 for s in shape)):
            raise ValueError(f"{where}: bad array shape {shape!r:.80}")
        raw = tensors.get(value[tag]) if isinstance(value[tag], str) else None
        if raw is None or raw.dtype != torch.uint8 or raw.dim() != 1:
            raise ValueError(f"{where}: refers to bytes the file does not hold")
        if raw.numel() != math.prod(shape) * dtype.itemsize:
            raise ValueError(f"{where}: {raw.numel()} bytes do not make a {dtype} array of "
                             f"shape {shape}")
        return raw.numpy().view(dtype).reshape(shape).copy()
    if tag == "$npscalar" and set(value) == {tag, "value"}:
        dtype = np.dtype(str(value[tag]))
        item = _decode(value["value"], tensors, where, depth + 1)
        if dtype.kind not in "biuf" or not isinstance(item, (bool, int, float)):
            raise ValueError(f"{where}: bad NumPy scalar {value!r}")
        return dtype.type(item)
    if tag == "$float" and set(value) == {tag} and value[tag] in ("nan", "inf", "-inf"):
        return float(value[tag])
    if tag == "$tuple" and set(value) == {tag} and isinstance(value[tag], list):
        return tuple(_decode(v, tensors, where, depth + 1) for v in value[tag])
    if tag == "$dict" and set(value) == {tag} and isinstance(value[tag], list):
        out = {}
        for pair in value[tag]:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ValueError(f"{where}: bad key/value pair")
            key = _decode(pair[0], tensors, where, depth + 1)
            if not isinstance(key, (str, int, float, bool, tuple)) and key is not None:
                raise ValueError(f"{where}: unhashable key")
            out[key] = _decode(pair[1], tensors, f"{where}[{key!r}]", depth + 1)
        return out
    raise ValueError(f"{where}: unknown entry {tag!r}")


def dumps(payload: dict[str, Any]) -> bytes:
    """``payload`` (``format_version`` added) as the bytes of a checkpoint file."""
    from safetensors.torch import save

    tensors: dict[str, torch.Tensor] = {}
    data = _encode({"format_version": FORMAT_VERSION, **payload}, tensors, "checkpoint")
    return save(tensors, metadata={MAGIC_KEY: str(FORMAT_VERSION),
                                   "payload": json.dumps(data, allow_nan=False)})


def loads(raw: bytes, where: str = "checkpoint") -> dict[str, Any]:
    """The payload of checkpoint bytes; ``CheckpointError`` naming ``where`` if unusable."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        try:
            tensors = load(raw)
        except SafetensorError:
            if raw.startswith(_PICKLE_MAGIC):
                raise CheckpointError(
                    f"{where} is in robotrl's earlier pickle format, which can run code when "
                    f"loaded, so it is not read. If you trust where it came from, convert it "
                    f"once with `robotrl checkpoint upgrade {where}`") from None
            raise
        header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
        meta = header.get("__metadata__") or {}
        if meta.get(MAGIC_KEY) is None:
            raise CheckpointError(f"{where} is a safetensors file but not a robotrl checkpoint")
        if meta[MAGIC_KEY] != str(FORMAT_VERSION):
            raise CheckpointError(f"{where} has format {meta[MAGIC_KEY]!r}, this robotrl reads "
                                  f"format {FORMAT_VERSION}")
        payload = _decode(json.loads(meta["payload"]), tensors, "checkpoint")
    except CheckpointError:
        raise
    except (SafetensorError, ValueError, TypeError, KeyError, OverflowError, RecursionError,
            MemoryError) as err:
        raise CheckpointError(f"{where} is corrupt or truncated ({type(err).__name__}: {err})"
                              ) from None
    if not isinstance(payload, dict) or payload.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{where} is not a robotrl checkpoint")
    return payload


def save_checkpoint(path: str | os.PathLike[str], payload: dict[str, Any]) -> Path:
    """Write ``payload`` (tensors, arrays, numbers, strings, and lists, tuples and dicts of
    them) to ``path`` atomically (see ``atomic_open``); nothing in it is pickled."""
    raw = dumps(payload)
    try:
        with atomic_open(path, "wb") as f:
            f.write(raw)
    except OSError as err:  # a full disk or quota: atomic_open kept the previous file
        raise CheckpointError(f"could not write checkpoint {str(path)!r} ({err}); the previous "
                              "checkpoint there, if any, is unchanged") from err
    return Path(path)


def resolve_path(path: str | os.PathLike[str]) -> Path:
    """A run directory means its ``checkpoints/last.pt``; anything else is the file itself."""
    path = Path(path)
    if path.is_dir() and (path / "checkpoints").is_dir():
        return path / "checkpoints" / "last.pt"
    return path


def load_checkpoint(path: str | os.PathLike[str], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Read a checkpoint written by ``save_checkpoint``; raise ``CheckpointError`` if unusable.

    Tensors come back on the CPU. The file's bytes are parsed as data only (see the module
    docstring); ``required`` entries must be present.
    """
    path = resolve_path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    payload = loads(path.read_bytes(), where=repr(str(path)))
    missing = [k for k in required if k not in payload]
    if missing:
        raise CheckpointError(f"checkpoint {str(path)!r} lacks {missing}")
    return payload


def upgrade_checkpoint(path: str | os.PathLike[str]) -> Path:
    """Convert a checkpoint of the earlier pickle format (1) to this one, in place, atomically.

    This *unpickles the file*, which runs whatever code it carries: call it only on files you
    trust (your own runs). A file already in this format is left as it is.
    """
    path = resolve_path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    try:
        loads(path.read_bytes(), where=repr(str(path)))
        return path  # already data-only
    except CheckpointError as err:
        if "earlier pickle format" not in str(err):
            raise
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)  # trusted by the caller
    except Exception as err:  # noqa: BLE001 - any unpickling failure means a corrupt file
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt or truncated "
                              f"({type(err).__name__}: {err})") from None
    if not isinstance(payload, dict) or payload.get("format_version") != 1:
        raise CheckpointError(f"{str(path)!r} is not a robotrl checkpoint of format 1")
    payload = {k: v for k, v in payload.items() if k != "format_version"}
    try:
        return save_checkpoint(path, payload)
    except TypeError as err:  # something an old robotrl pickled that is not data
        raise CheckpointError(f"{str(path)!r} cannot be converted: {err}") from None


# ---------------------------------------------------------------------------- run locks
class RunLocked(RuntimeError):
    """Another live process is writing to the run directory."""


@contextlib.contextmanager
def _flocked(path: Path, wait: bool) -> Iterator[int]:
    """Hold an exclusive advisory ``flock`` on ``path`` (created if missing) and yield its file
    descriptor. ``wait=False`` raises ``BlockingIOError`` at once when another process holds it.
    The kernel releases the lock when its holder exits in any way."""
    import fcntl  # POSIX; robotrl's simulators need Linux or macOS anyway

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        try:
            yield fd
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold ``run_dir/.lock`` while a run writes there; a second process pointed at the same
    directory gets ``RunLocked`` naming the holder's process id.

    A lock file left behind by a killed run is stale (its ``flock`` went with the process) and
    is taken over. The file itself stays (emptied on release): unlinking it would let a process
    that opened the old file and one that creates a new one both hold "the" lock.
    """
    path = Path(run_dir) / ".lock"
    with contextlib.ExitStack() as stack:
        try:
            fd = stack.enter_context(_flocked(path, wait=False))
        except BlockingIOError:
            holder = "unknown"
            with contextlib.suppress(OSError), open(path, "rb") as f:
                holder = f.read(64).decode(errors="replace").strip() or holder
            raise RunLocked(f"run directory {str(run_dir)!r} is in use by process {holder} "
                            "(another robotrl train); wait for it to finish or pick another "
                            "run_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield path
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)


@contextlib.contextmanager
def waiting_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an advisory ``flock`` on ``path``, waiting for another process that holds it: for a
    read-merge-write of a shared file that is replaced by rename (so the file itself cannot be
    the lock)."""
    with _flocked(Path(path), wait=True):
        yield


def remove_if_empty(run_dir: str | os.PathLike[str]) -> None:
    """Remove ``run_dir`` when it holds nothing but a released run lock (a run refused before
    it wrote anything); a lock another process holds, or any other file, leaves it as it is."""
    import fcntl

    run_dir = Path(run_dir)
    lock = run_dir / ".lock"
    with contextlib.suppress(OSError):
        fd = os.open(lock, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: in use
            if [p.name for p in run_dir.iterdir()] == [".lock"]:
                os.unlink(lock)
        finally:
            os.close(fd)
    with contextlib.suppress(OSError):
        run_dir.rmdir()  # only ever removes an empty directory


@contextlib.contextmanager
def restoring(what: str) -> Iterator[None]:
    """Errors while restoring state read from a checkpoint (a missing key, a tensor of the
    wrong shape or type) as ``CheckpointError`` naming ``what``: the file does not fit."""
    try:
        yield
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError,
            OverflowError) as err:
        raise CheckpointError(f"{what} does not fit this run ({type(err).__name__}: "
                              f"{str(err)[:300]})") from None
