"""Files from strangers: loading a checkpoint never runs code from it, bad files end in one
line and exit 2, and runs cannot trample each other or lose their last good checkpoint."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from robotrl.checkpoint import (
    CheckpointError,
    load_checkpoint,
    run_lock,
    save_checkpoint,
    upgrade_checkpoint,
)

SMALL_RUN = ["env=inverted_pendulum", "num_envs=4", "algo.rollout_steps=16", "logger=none",
             "eval_episodes=2"]
"""A PPO run that takes seconds (``robotrl train`` overrides)."""


def robotrl(*args: str, **kwargs: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "robotrl.cli.main", *args], capture_output=True,
                          text=True, timeout=300, **kwargs)  # type: ignore[call-overload]


class Sentinel:
    """Unpickling this creates the file ``path`` (what a malicious checkpoint would do)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.path}",))


def evil_checkpoint(path: Path, sentinel: Path) -> Path:
    """A checkpoint of the earlier pickle format whose loading would run ``touch sentinel``."""
    torch.save({"format_version": 1, "config": Sentinel(sentinel), "algo": {}}, path)
    return path


def torch_runs_it(load: Callable[[], object], sentinel: Path) -> None:
    """The control of a malicious-archive test: torch's own loader runs the archive's code
    (seen with torch 2.13: its pickle fallback and its sympify of shape expressions), so the
    archive is malicious and the refusal above means something. A later torch that closes the
    hole is told apart by the torch version in the message, not failed."""
    import contextlib
    import warnings

    with warnings.catch_warnings(), contextlib.suppress(Exception):
        warnings.simplefilter("ignore")
        load()
    if not sentinel.exists() and torch.__version__.startswith("2.13."):
        raise AssertionError("the archive is not malicious for torch 2.13: the test proves "
                             "nothing")


def refused(proc: subprocess.CompletedProcess, *words: str) -> None:
    """Exit 2, no traceback, one line naming the problem (after what the run printed)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    for word in words:
        assert word in last, proc.stderr


def test_malicious_checkpoint_runs_nothing(tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"
    evil = evil_checkpoint(tmp_path / "evil.pt", sentinel)
    with pytest.raises(CheckpointError, match="robotrl checkpoint upgrade"):
        load_checkpoint(evil)
    for command in (["eval", f"checkpoint={evil}"], ["export", f"checkpoint={evil}"],
                    ["gap", f"checkpoint={evil}"],
                    ["ope", f"checkpoint={evil}", "dataset=x.hdf5"],
                    ["train", f"resume={evil}", f"run_dir={tmp_path / 'r'}"]):
        refused(robotrl(*command), "earlier pickle format", "robotrl checkpoint upgrade")
    assert not sentinel.exists()


def test_upgrade_converts_a_trusted_old_checkpoint(tmp_path: Path) -> None:
    old = tmp_path / "old.pt"
    payload = {"x": torch.arange(4.0), "step": 3, "rng": (3, tuple(range(5)), None)}
    torch.save({"format_version": 1, **payload}, old)
    proc = robotrl("checkpoint", "upgrade", str(old))
    assert proc.returncode == 0 and "trusting" in proc.stdout, proc.stderr
    back = load_checkpoint(old)
    assert torch.equal(back["x"], payload["x"]) and back["step"] == 3
    assert back["rng"] == payload["rng"]
    assert upgrade_checkpoint(old) == old  # already converted: left as it is


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_resume_from_a_corrupt_checkpoint_is_one_line(tmp_path: Path, damage: str) -> None:
    run = tmp_path / "run"
    assert robotrl("train", *SMALL_RUN, "total_steps=64", f"run_dir={run}").returncode == 0
    last = run / "checkpoints" / "last.pt"
    raw = last.read_bytes()
    last.write_bytes(raw[: len(raw) // 2] if damage == "truncate" else b"\x00" * 64)
    for command in (["train", *SMALL_RUN, "total_steps=128", f"run_dir={run}", f"resume={last}"],
                    ["eval", f"checkpoint={last}"]):
        refused(robotrl(*command), "corrupt or truncated", str(last))


def test_second_run_in_the_same_directory_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with run_lock(run):
        proc = robotrl("train", *SMALL_RUN, "total_steps=64", f"run_dir={run}")
    refused(proc, "in use by process", str(os.getpid()))
    assert not (run / "checkpoints").exists()
    # a lock file left by a killed run (no process holds it) is stale: the next run takes it
    (run / ".lock").write_text("999999\n")
    assert robotrl("train", *SMALL_RUN, "total_steps=64", f"run_dir={run}").returncode == 0


def test_disk_full_while_checkpointing_keeps_the_last_good_one(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert robotrl("train", *SMALL_RUN, "total_steps=64", f"run_dir={run}").returncode == 0
    last = run / "checkpoints" / "last.pt"
    before = last.read_bytes()
    limit = len(before) // 2  # room for config.yaml, not for a checkpoint

    def small_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a full disk fails writes, kills nothing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = robotrl("train", *SMALL_RUN, "total_steps=128", f"run_dir={run}", f"resume={last}",
                   preexec_fn=small_disk)
    refused(proc, "could not write checkpoint", "File too large", "unchanged")
    assert last.read_bytes() == before
    assert sorted(p.name for p in last.parent.iterdir()) == ["best.pt", "last.pt"]


def test_checkpoint_holds_data_only(tmp_path: Path) -> None:
    """Whatever is not data is refused when saving, so no loader ever meets it."""
    with pytest.raises(TypeError, match="cannot go in a checkpoint"):
        save_checkpoint(tmp_path / "x.pt", {"f": lambda: 0})
    import numpy as np

    state = {"rng": np.random.get_state(), "s": np.float32(1.5), 3: "int key", "$x": 1,
             "nan": float("nan"), "t": (1, [2.0, None]), "b": torch.ones(2, dtype=torch.bool)}
    back = load_checkpoint(save_checkpoint(tmp_path / "y.pt", state))
    assert back["rng"][0] == "MT19937" and np.array_equal(back["rng"][1], state["rng"][1])
    assert type(back["s"]) is np.float32 and back["s"] == 1.5
    assert back[3] == "int key" and back["$x"] == 1 and back["nan"] != back["nan"]
    assert back["t"] == (1, [2.0, None]) and back["b"].dtype == torch.bool


def test_malicious_pt2_export_runs_nothing(tmp_path: Path) -> None:
    """A pt2 archive whose tensors were replaced by a pickle that runs a command: plain
    ``torch.export.load`` runs it (its fallback unpickles); ``robotrl deploy``'s loader not."""
    import io
    import zipfile

    from robotrl.sim2real.verify import load_torch_module

    program = torch.export.export(torch.nn.Linear(3, 2), (torch.zeros(1, 3),))
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    evil = tmp_path / "evil.pt2"
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as src, zipfile.ZipFile(evil, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("sample_inputs/model.pt"):
                sentinel_bytes = io.BytesIO()
                torch.save(Sentinel(tmp_path / "pwned"), sentinel_bytes)
                data = sentinel_bytes.getvalue()
            dst.writestr(item, data)
    with pytest.raises(Exception):  # noqa: B017 - whatever torch raises on a refused pickle
        load_torch_module(str(evil), "pt2")
    assert not (tmp_path / "pwned").exists()
    torch_runs_it(lambda: torch.export.load(str(evil)), tmp_path / "pwned")


def test_hdf5_holding_a_pickle_runs_nothing(tmp_path: Path) -> None:
    """A D4RL-style file whose field holds a pickle (as opaque bytes, or as HDF5 object data)
    is refused by its dtype; nothing is unpickled."""
    import pickle

    import h5py
    import numpy as np

    from robotrl.data import DatasetError, load_dataset

    payload = pickle.dumps(Sentinel(tmp_path / "pwned"))
    for kind in ("opaque", "bytes"):
        path = tmp_path / f"{kind}.hdf5"
        with h5py.File(path, "w") as f:
            f["observations"] = np.zeros((4, 3), np.float32)
            f["actions"] = np.zeros((4, 2), np.float32)
            f["rewards"] = np.zeros(4, np.float32)
            f["terminals"] = np.zeros(4, bool)
            if kind == "opaque":
                f["timeouts"] = np.array([np.void(payload)] * 4)
            else:
                f.create_dataset("timeouts", data=np.array([payload] * 4, dtype=f"S{len(payload)}"))
        with pytest.raises(DatasetError, match="dtype .* is not allowed"):
            load_dataset(str(path))
        assert robotrl("train", "algo=bc", f"dataset={path}", f"run_dir={tmp_path / 'r'}"
                       ).returncode == 2
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "r").exists()


def test_pt2_shape_expression_that_runs_code_is_refused(tmp_path: Path) -> None:
    """torch.export.load ``sympify``s (``eval``s) the archive's symbolic shapes: an expression
    that calls ``os.system`` is refused before torch sees it."""
    import io
    import zipfile

    from robotrl.sim2real.verify import load_torch_module

    batch = torch.export.Dim("batch")
    program = torch.export.export(torch.nn.Linear(3, 2), (torch.zeros(4, 3),),
                                  dynamic_shapes=({0: batch},))
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    evil = tmp_path / "evil.pt2"
    attack = f"__import__('os').system('touch {tmp_path / 'pwned'}')*0 + "
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as src, zipfile.ZipFile(evil, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("models/model.json"):
                data = data.replace(b'"expr_str": "Symbol', f'"expr_str": "{attack}Symbol'.encode())
                assert attack.encode() in data
            dst.writestr(item, data)
    with pytest.raises(ValueError, match="not plain arithmetic"):
        load_torch_module(str(evil), "pt2")
    assert not (tmp_path / "pwned").exists()
    torch_runs_it(lambda: torch.export.load(str(evil)), tmp_path / "pwned")


def test_a_checkpoint_cannot_steer_where_a_resumed_run_writes(tmp_path: Path) -> None:
    """resume= continues in the checkpoint's own run directory (never one its config names),
    refuses interpolations in the saved config, and a state that does not fit the learner is
    one line and exit 2."""
    run = tmp_path / "run"
    assert robotrl("train", *SMALL_RUN, "total_steps=64", f"run_dir={run}").returncode == 0
    last = run / "checkpoints" / "last.pt"
    ckpt = load_checkpoint(last)
    elsewhere = tmp_path / "elsewhere"
    ckpt["config"]["run_dir"] = str(elsewhere)
    save_checkpoint(last, ckpt)
    proc = robotrl("train", "total_steps=128", f"resume={last}")
    assert proc.returncode == 0, proc.stderr
    assert not elsewhere.exists() and load_checkpoint(last)["global_step"] == 128
    ckpt["config"]["env"]["options"] = {"home": "${oc.env:HOME}"}
    save_checkpoint(last, ckpt)
    refused(robotrl("train", "total_steps=192", f"resume={last}"), "interpolation")
    ckpt["config"]["env"]["options"] = {}
    ckpt["algo"] = {"policy": 3}
    save_checkpoint(last, ckpt)
    refused(robotrl("eval", f"checkpoint={last}"), "does not fit")
    refused(robotrl("train", "total_steps=192", f"resume={last}"), "does not fit")


def test_hdf5_compression_bomb_is_refused(tmp_path: Path) -> None:
    import h5py
    import numpy as np

    from robotrl.data import DatasetError, load_dataset

    path = tmp_path / "bomb.hdf5"
    rows = 2_000_000
    with h5py.File(path, "w") as f:  # zeros: gzip stores 48 MB of observations in kilobytes
        for name, width in (("observations", 6), ("actions", 2), ("rewards", 0),
                            ("terminals", 0), ("timeouts", 0)):
            f.create_dataset(name, data=np.zeros((rows, width) if width else rows, np.float32),
                             compression="gzip")
    assert path.stat().st_size < 1 << 20
    with pytest.raises(DatasetError, match="compression bomb"):
        load_dataset(str(path))
