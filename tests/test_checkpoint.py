"""Checkpoints are written atomically and unreadable ones fail with a clear error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from robotrl.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def test_round_trip(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "c" / "last.pt", {"x": torch.arange(3), "step": 7})
    back = load_checkpoint(path, required=("x", "step"))
    assert torch.equal(back["x"], torch.arange(3)) and back["step"] == 7
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temp files left


def test_corrupt_and_missing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(bad)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt")
    good = save_checkpoint(tmp_path / "good.pt", {"a": 1})
    with pytest.raises(CheckpointError, match="lacks"):
        load_checkpoint(good, required=("algo",))
    truncated = tmp_path / "trunc.pt"
    truncated.write_bytes(good.read_bytes()[:20])
    with pytest.raises(CheckpointError):
        load_checkpoint(truncated)


def test_exception_during_save_keeps_previous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save_checkpoint(tmp_path / "last.pt", {"version": 1})

    def broken_save(obj: object, f: object) -> None:
        f.write(b"partial garbage")  # type: ignore[attr-defined]
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, {"version": 2})
    monkeypatch.undo()
    assert load_checkpoint(path)["version"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_kill_during_save_leaves_previous_readable(tmp_path: Path) -> None:
    """SIGKILL a process while it rewrites a large checkpoint: the old file stays intact."""
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"version": 1})
    script = textwrap.dedent(f"""
        import torch
        from robotrl.checkpoint import save_checkpoint
        big = {{"blob": torch.zeros(200_000_000 // 4), "version": 2}}
        print("saving", flush=True)
        for _ in range(100):
            save_checkpoint({str(path)!r}, big)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "saving"
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    payload = load_checkpoint(path)  # either the old or a complete new one, never broken
    assert payload["version"] in (1, 2)
