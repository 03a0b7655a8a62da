"""``logger=wandb``: Weights & Biases beside TensorBoard, offline (``WANDB_MODE=offline``, no
network). Each test reads the offline run back from its ``run-<id>.wandb`` file: the scalars
TensorBoard has, at the same steps; the resolved config; the videos; the checkpoint artifact;
one W&B run continued over a resume; a multirun's jobs in one group; and the one-line refusal
when the ``wandb`` extra is missing."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from robotrl.config import TrainConfig, to_dict
from robotrl.experiment import ConfigError, Experiment, RunDir, build_runner, run_training
from robotrl.types import BatchedEnv, StepOut
from robotrl.video import EpisodeRecorder

needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                                 reason="needs the wandb extra")
MakeConfig = Callable[..., TrainConfig]
"""The ``make_config`` fixture of tests/conftest.py."""
WANDB_LOGGER = {"tensorboard": True, "progress": False, "log_interval": 1, "wandb": True}


def _offline_env(home: Path) -> dict[str, str]:
    """W&B offline and quiet, every file of its own (cache, staged artifacts) under ``home``."""
    return {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(home),
            "WANDB_CACHE_DIR": str(home / "cache"), "WANDB_DATA_DIR": str(home / "data"),
            "WANDB_CONFIG_DIR": str(home / "config"),
            "WANDB_ARTIFACT_DIR": str(home / "artifacts")}


@pytest.fixture(autouse=True)
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in _offline_env(tmp_path / "wandb-home").items():
        monkeypatch.setenv(key, value)


def _records(path: Path) -> list[bytes]:
    """The records of a ``.wandb`` file: a 7-byte header (``:W&B``, magic, version), then
    LevelDB-log blocks of 32 KiB, each record [crc32 u32, length u16, type u8] + data, type
    1 full, 2 first, 3 middle, 4 last (wandb's datastore format)."""
    raw, block, pos, out, parts = path.read_bytes(), 32768, 7, [], b""
    assert raw[:4] == b":W&B"
    while pos + 7 <= len(raw):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is zero padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        data, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            out.append(data)
        elif kind == 2:
            parts = data
        elif kind == 3:
            parts += data
        elif kind == 4:
            out.append(parts + data)
    return out


def wandb_runs(run_dir: Path) -> list[dict[str, Any]]:
    """Every offline W&B run under ``run_dir/wandb`` in the order they started: id, group,
    tags, name, resume (the policy ``wandb sync`` applies), config, history rows (``_step`` and the logged values) and
    artifacts (type and file names)."""
    import wandb
    from wandb.proto import wandb_internal_pb2 as pb

    # run.finish() returns before W&B's service has written everything (a race seen here,
    # with an artifact to stage); its shutdown waits for the writes (the next run starts a
    # new service). A CLI process does the same at exit.
    wandb.teardown()
    runs = []
    for file in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        run: dict[str, Any] = {"history": [], "artifacts": []}
        for data in _records(file):
            rec = pb.Record()
            rec.ParseFromString(data)
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                r = rec.run
                run.update(id=r.run_id, group=r.run_group, tags=list(r.tags), name=r.display_name,
                           project=r.project, resume=r.resume,
                           config={i.key: json.loads(i.value_json) for i in r.config.update
                                   if i.key != "_wandb"})
            elif kind == "history":
                run["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                       for i in rec.history.item})  # media: "tag/_type", ...
            elif kind == "artifact":
                run["artifacts"].append({"type": rec.artifact.type, "name": rec.artifact.name,
                                         "files": sorted(e.path for e in
                                                         rec.artifact.manifest.contents)})
        runs.append(run)
    return runs


def scalars(run: dict[str, Any]) -> dict[str, dict[int, float]]:
    """A W&B run's history as tag -> {step: value}, W&B's own keys (``_step``, ...) left out."""
    out: dict[str, dict[int, float]] = {}
    for row in run["history"]:
        for key, value in row.items():
            if not key.startswith("_") and isinstance(value, (int, float)):
                out.setdefault(key, {})[int(row["_step"])] = float(value)
    return out


@needs_wandb
def test_wandb_logs_what_tensorboard_logs_and_a_resume_continues_the_run(
        tmp_path: Path, make_config: MakeConfig) -> None:
    run_dir = tmp_path / "run"
    cfg = make_config(run_dir, logger={**WANDB_LOGGER, "wandb_tags": ["smoke"],
                                       "wandb_artifacts": True}, eval_interval=2)
    run_training(cfg)

    [run] = wandb_runs(run_dir)
    tensorboard = {tag: dict(series) for tag, series in RunDir(run_dir).scalars().items()}
    assert {"loss/policy", "train/entropy", "rollout/return", "perf/sps",
            "eval/return"} <= set(tensorboard)
    logged = scalars(run)
    assert set(logged) == set(tensorboard)
    for tag, series in tensorboard.items():  # TensorBoard keeps float32
        assert logged[tag] == pytest.approx(series, rel=1e-6, nan_ok=True), tag
    # the resolved config, whole; where the run is and what it is called
    assert run["config"] == json.loads(json.dumps(to_dict(cfg)))
    assert (run["project"], run["name"], run["tags"], run["group"]) == (
        "robotrl", "run", ["smoke"], "")
    assert json.loads((run_dir / "wandb_id.json").read_text()) == {"id": run["id"]}
    # on request, the checkpoints as one model artifact at the end
    assert run["artifacts"] == [{"type": "model", "name": f"checkpoints-{run['id']}",
                                 "files": ["best.pt", "last.pt"]}]

    more = dataclasses.replace(cfg, total_steps=2 * cfg.total_steps,
                               resume=str(run_dir / "checkpoints" / "last.pt"))
    run_training(more)
    first, second = wandb_runs(run_dir)
    # offline, W&B cannot look the run up: the id and resume="allow" join them when synced
    assert second["id"] == first["id"] and second["resume"]
    assert json.loads((run_dir / "wandb_id.json").read_text()) == {"id": first["id"]}
    steps = sorted(scalars(second)["loss/policy"])
    assert steps[0] > max(scalars(first)["loss/policy"]) and steps[-1] == more.total_steps


class _Film(EpisodeRecorder):
    """Films world 0's episode in flat grey frames (no OpenGL needed): what the runner does
    with a film, not how it is drawn."""

    def start(self, env: BatchedEnv) -> None:
        self.frames, self.ended, self.fps = [np.full((16, 16, 3), 99, np.uint8)], False, 20.0

    def __call__(self, env: BatchedEnv, out: StepOut) -> None:
        if not self.ended:
            self.frames.append(self.frames[0])
            self.ended = bool(out.terminated[0] | out.truncated[0])


@needs_wandb
def test_evaluation_videos_are_the_runs_mp4s(tmp_path: Path, make_config: MakeConfig) -> None:
    pytest.importorskip("imageio_ffmpeg", reason="the video extra is not installed")
    run_dir = tmp_path / "run"
    runner = build_runner(make_config(run_dir, logger={**WANDB_LOGGER, "tensorboard": False},
                                      eval_interval=3))
    runner.evaluator.recorder = _Film()  # what logger.video=true films
    runner.train()
    videos = sorted((run_dir / "videos").glob("step_*.mp4"))
    assert [v.name for v in videos] == ["step_0000000096.mp4", "step_0000000192.mp4"]
    [run] = wandb_runs(run_dir)
    assert run["artifacts"] == []  # checkpoints are uploaded on request only
    rows = [row for row in run["history"] if "eval/video/_type" in row]
    assert [row["_step"] for row in rows] == [96, 192]
    [files] = (run_dir / "wandb").glob("offline-run-*/files")
    for row, video in zip(rows, videos, strict=True):
        assert row["eval/video/_type"] == "video-file"
        assert (files / row["eval/video/path"]).read_bytes() == video.read_bytes()


@needs_wandb
def test_multirun_jobs_share_a_group_unless_one_is_given(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "robotrl.cli.main", "train", "-m", "env=inverted_pendulum",
         "num_envs=2", "total_steps=32", "algo.rollout_steps=16", "eval_episodes=1",
         "backend.num_threads=1", "logger=wandb", "logger.progress=false",
         "logger.tensorboard=false", "seed=0,1", "logger.wandb_group='',mine",
         f"run_dir={tmp_path}/j${{hydra:job.num}}", f"hydra.sweep.dir={tmp_path}/sweep1"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, **_offline_env(tmp_path / "wandb-home")})
    assert proc.returncode == 0, proc.stderr
    runs = {j: wandb_runs(tmp_path / f"j{j}") for j in range(4)}
    assert all(len(r) == 1 for r in runs.values())
    groups = sorted((r[0]["config"]["seed"], r[0]["group"]) for r in runs.values())
    assert groups == [(0, "mine"), (0, "sweep1"), (1, "mine"), (1, "sweep1")]
    assert len({r[0]["id"] for r in runs.values()}) == 4


def test_missing_extra_is_refused_before_anything_is_written(
        tmp_path: Path, make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"pip install 'robotrl\[wandb\]'"):
        Experiment(make_config(run_dir, logger=WANDB_LOGGER))
    assert not run_dir.exists()
    # the default run never imports wandb (it would fail here)
    run_training(make_config(run_dir))
    assert (run_dir / "result.json").is_file() and not (run_dir / "wandb").exists()


def test_cli_without_the_extra_says_what_to_install(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    code = ("import sys; sys.modules['wandb'] = None; from robotrl.cli.main import main; "
            f"main(['train', 'env=inverted_pendulum', 'logger=wandb', 'run_dir={run_dir}'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("config error: logger.wandb=true needs wandb: pip install "
                                   "'robotrl[wandb]' (in a checkout: pip install -e \".[wandb]\")")
    assert not run_dir.exists()
