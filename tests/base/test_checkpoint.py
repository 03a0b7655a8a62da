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


def test_disk_full_during_save_keeps_previous(tmp_path: Path) -> None:
    """A process whose file-size limit (RLIMIT_FSIZE, the disk filling up) stops a checkpoint
    half-written keeps the previous checkpoint intact, leaves no temp file and says why."""
    path = save_checkpoint(tmp_path / "last.pt", {"version": 1})
    script = textwrap.dedent(f"""
        import resource, signal, sys, torch
        from robotrl.checkpoint import save_checkpoint
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        try:
            save_checkpoint({str(path)!r}, {{"blob": torch.zeros(1 << 20), "version": 2}})
        except Exception as err:
            sys.exit(f"{{type(err).__name__}}: {{err}}")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert "CheckpointError" in proc.stderr and "File too large" in proc.stderr, proc.stderr
    assert "previous checkpoint there, if any, is unchanged" in proc.stderr
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
