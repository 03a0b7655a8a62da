"""Atomic, validated checkpoints: a crash or a kill mid-save never leaves a broken file."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import torch

FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, corrupt or from an incompatible version."""


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temp file beside ``path``; on success fsync it and rename it over ``path``.

    A crash or kill at any point leaves either the old file or the complete new one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make outputs private
    try:
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


def save_checkpoint(path: str | os.PathLike[str], payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``path`` atomically (see ``atomic_open``)."""
    with atomic_open(path, "wb") as f:
        torch.save({"format_version": FORMAT_VERSION, **payload}, f)
    return Path(path)


def load_checkpoint(path: str | os.PathLike[str], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Read a checkpoint written by ``save_checkpoint``; raise ``CheckpointError`` if unusable."""
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoints" / "last.pt" if (path / "checkpoints").is_dir() else path
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    try:
        # our own files hold RNG states and numpy scalars: not loadable with weights_only
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means a corrupt file
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt or truncated ({type(err).__name__}: {err})"
        ) from err
    if not isinstance(payload, dict) or "format_version" not in payload:
        raise CheckpointError(f"{str(path)!r} is not a robotrl checkpoint")
    if payload["format_version"] != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {str(path)!r} has format {payload['format_version']}, "
            f"this robotrl reads format {FORMAT_VERSION}"
        )
    missing = [k for k in required if k not in payload]
    if missing:
        raise CheckpointError(f"checkpoint {str(path)!r} lacks {missing}")
    return payload
