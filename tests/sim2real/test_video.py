"""Evaluation videos (``robotrl.video``): the task's view camera keeps a travelling robot in
frame; ``robotrl eval video=true`` writes an MP4 of world 0's episode, first to last frame, and
``logger.video=true`` films each evaluation of a run into its directory and TensorBoard.

MuJoCo picks its OpenGL backend when it is first imported, long before this module in a full
test run, so everything that renders runs in a child process with ``MUJOCO_GL=egl`` (skipped,
with the reason, where no offscreen GL exists).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

GL_ENV = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}

_PROBE = """
import mujoco
mujoco.Renderer(mujoco.MjModel.from_xml_string("<mujoco/>"), 8, 8).render()
"""


@pytest.fixture(scope="module")
def gl() -> None:
    run = subprocess.run([sys.executable, "-c", _PROBE], env=GL_ENV, capture_output=True,
                         text=True, timeout=120)
    if run.returncode != 0:
        pytest.skip(f"no offscreen OpenGL here (MUJOCO_GL={GL_ENV['MUJOCO_GL']}): "
                    f"{run.stderr.strip().splitlines()[-1]}")


def _robotrl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "robotrl.cli.main", *args], env=env or GL_ENV,
                          capture_output=True, text=True, timeout=600)



def test_rendering_then_torchs_compiler_in_one_process(gl: None) -> None:
    """An env that rendered (Mesa's EGL driver, with its LLVM, loaded), then ``torch._dynamo``
    (``torch.export`` and transformers import it, and with it Triton where torch's CUDA wheel
    installed it) in the same process: Triton loaded after Mesa crashed it (a segmentation
    fault, every CI worker that collected tests/envs/test_dmc.py before tests/vla). The env
    loads Triton before its first renderer (``before_opengl``)."""
    code = """
from robotrl.envs import make
make("hopper", num_envs=1).render(0, 32, 32)
import torch._dynamo
print("ok")
"""
    run = subprocess.run([sys.executable, "-c", code], env=GL_ENV, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]

_TRACKING = """
import copy, json
import mujoco, numpy as np
from robotrl.envs import make

env = make("halfcheetah", num_envs=1)
env.reset(seed=0)
base = getattr(env, "unwrapped", env)
state = env.get_state()
state[0, 1] += 100.0  # the root's x (mjSTATE_INTEGRATION: time, then qpos): 100 m down the track
env.set_state(state)
data = base.batch.get_data(0)
mujoco.mj_forward(base.model, data)
robot = np.flatnonzero(base.model.geom_bodyid != 0)
env.render(0, 240, 240)  # the env's renderer, whose model draws the floor 1 km each way
renderer = base._renderer
renderer.enable_segmentation_rendering()

def robot_pixels(camera, geoms=robot):
    renderer.update_scene(data, camera=camera)
    seg = renderer.render()
    return int((np.isin(seg[..., 0], geoms) & (seg[..., 1] == mujoco.mjtObj.mjOBJ_GEOM)).sum())

view = base.view_camera(data)
static = copy.copy(view)
static.lookat[:] = base._view_lookat  # the same camera left where the episode started

# the last frame of an episode (render(final=True) after the step that ended it) is the state
# before the auto-reset: the same world stepped on without a time limit shows the same frame
import torch
cut, on = make("hopper", num_envs=1, max_episode_steps=3), make("hopper", num_envs=1)
cut.reset(seed=1), on.reset(seed=1)
for _ in range(3):
    action = torch.full((1, 3), 0.5)
    out, _ = cut.step(action), on.step(action)
final_equal = bool(np.array_equal(cut.render(0, 64, 64, final=True), on.render(0, 64, 64)))
reset_differs = not np.array_equal(cut.render(0, 64, 64), on.render(0, 64, 64))
floor = np.flatnonzero(base.model.geom_type == mujoco.mjtGeom.mjGEOM_PLANE)
print(json.dumps({"view": robot_pixels(view), "static": robot_pixels(static),
                  "floor": robot_pixels(view, floor),
                  "frame": list(env.render(0, 96, 64).shape), "truncated": bool(out.truncated[0]),
                  "final_equal": final_equal, "reset_differs": reset_differs}))
"""


def test_view_camera_follows_the_robot_to_the_last_frame(gl: None) -> None:
    """HalfCheetah 100 m down the track: in the view camera's frame, on a floor (Gymnasium's
    ends at 40 m), gone from a camera that stays put (what Gymnasium's free camera does, and
    what our videos did before); an
    episode's last frame is its final state, not the next episode's first."""
    run = subprocess.run([sys.executable, "-c", _TRACKING], env=GL_ENV, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    pixels = json.loads(run.stdout.strip().splitlines()[-1])
    assert pixels["view"] > 500, pixels
    assert pixels["static"] == 0, pixels
    assert pixels["floor"] > 240 * 240 // 4, pixels  # past Gymnasium's 40 m floor: still drawn
    assert pixels["frame"] == [64, 96, 3]
    assert pixels["truncated"] and pixels["final_equal"] and pixels["reset_differs"], pixels


def _robot_pixels(frame: np.ndarray) -> int:
    """Pixels of Gymnasium's robot brown (rgba 0.8 0.6 0.4) in a decoded frame: the floor,
    sky and shadows are grey, blue or black."""
    f = frame.astype(int)
    return int(((f[..., 0] - f[..., 2] > 60) & (f[..., 0] > 120)).sum())


@pytest.mark.slow  # two robotrl processes filming 3 episodes (~13 s, the longest here); the
# default run keeps the view camera (above) and the no-GL refusal (below)
def test_train_and_eval_write_videos_of_the_robot(gl: None, tmp_path: Path) -> None:
    pytest.importorskip("imageio_ffmpeg", reason="the video extra is not installed")
    import imageio.v2 as imageio

    run = tmp_path / "run"
    train = _robotrl("train", "env=hopper", "num_envs=2", "total_steps=64", "algo.rollout_steps=16",
                     "eval_interval=1", "eval_episodes=1", "logger.video=true",
                     "logger.progress=false", f"run_dir={run}")
    assert train.returncode == 0, train.stderr
    videos = sorted((run / "videos").glob("*.mp4"))
    assert [v.name for v in videos] == [f"step_{s:010d}.mp4" for s in (32, 64)]
    assert all(len(imageio.mimread(v)) > 1 for v in videos)
    assert not list((run / "videos").glob(".*"))  # no temporary file left behind
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run), size_guidance={"images": 0}).Reload()
    gifs = events.Images("eval/video")
    assert [g.step for g in gifs] == [32, 64] and gifs[0].encoded_image_string[:3] == b"GIF"

    out = tmp_path / "eval.json"
    ev = _robotrl("eval", f"checkpoint={run}", "episodes=1", f"out={out}", "video=true")
    assert ev.returncode == 0, ev.stderr
    length = int(json.loads(out.read_text())["length_mean"])
    frames = imageio.mimread(tmp_path / "eval.mp4", memtest=False)
    assert len(frames) == length + 1  # the reset state, then one frame per step
    assert frames[0].shape == (480, 480, 3)
    assert _robot_pixels(frames[0]) > 200 and _robot_pixels(frames[-1]) > 200


def test_video_without_gl_says_how_to_get_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "DISPLAY",
                                                           "WAYLAND_DISPLAY")}
    train = _robotrl("train", "env=inverted_pendulum", "num_envs=2", "total_steps=32",
                     "algo.rollout_steps=16", "logger.video=true", "logger.progress=false",
                     f"run_dir={run}", env=env)
    if train.returncode == 0:
        pytest.skip("a default OpenGL context works here without MUJOCO_GL")
    assert train.returncode == 2
    assert "video error" in train.stderr and "MUJOCO_GL=egl" in train.stderr, train.stderr
    assert not run.exists()  # refused before anything was written
