"""Episode videos: world 0's first evaluation episode, shot from the task's view camera
(``MujocoTask.view``: Gymnasium's camera settings, following the robot).

``robotrl eval checkpoint=RUN video=true`` writes one next to its JSON; ``robotrl train
logger.video=true`` writes one per evaluation to ``RUN/videos/`` and shows it in TensorBoard
(an animated GIF under ``eval/video``). MP4s need the ``video`` extra (imageio with ffmpeg);
rendering needs an offscreen OpenGL (``MUJOCO_GL=egl``, or ``osmesa``).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from robotrl.types import BatchedEnv, StepOut

VIDEO_EXTRA = "pip install 'robotrl[video]'"
NEEDS_FFMPEG = f"writing videos needs imageio with ffmpeg: {VIDEO_EXTRA}"
EVAL_SIZE = 480
"""Pixels square of ``robotrl eval video=true`` (Gymnasium's default render size)."""
TRAIN_SIZE = 240
"""Pixels square of the films ``logger.video=true`` makes during training (cheaper to draw)."""


class VideoUnavailable(RuntimeError):
    """Videos cannot be made here; the message says what is missing."""


def check_video(env: BatchedEnv, size: int, backend: str = "") -> None:
    """Render one frame of world 0 at ``size`` pixels square (the renderer the film then
    reuses) and find imageio's ffmpeg, or raise ``VideoUnavailable`` saying why videos cannot
    be made here (a backend without a renderer, no offscreen OpenGL, no ``video`` extra),
    before any work is spent."""
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        raise VideoUnavailable(NEEDS_FFMPEG) from None
    try:
        env.render(0, size, size)
    except NotImplementedError:
        raise VideoUnavailable(f"the {backend or type(env).__name__} backend cannot render "
                               "videos; use backend=mujoco") from None
    except Exception as err:  # noqa: BLE001 - GL backends fail in many ways
        raise VideoUnavailable(
            f"offscreen rendering is not available ({type(err).__name__}: {err}); set "
            f"MUJOCO_GL=egl (or osmesa after apt-get install libosmesa6) before starting "
            f"(now MUJOCO_GL={os.environ.get('MUJOCO_GL')!r})") from None


class EpisodeRecorder:
    """Frames of world 0's first episode: ``start`` after the reset, then pass the recorder as
    ``run_episodes``' ``on_step``. The last frame is the episode's final state (before the
    auto-reset), so a fall or a success is on film."""

    def __init__(self, size: int = EVAL_SIZE) -> None:
        self.size = size
        self.frames: list[np.ndarray] = []
        self.ended = False
        self.fps = 0.0
        """Frames per second of real time: the env's control rate."""

    def start(self, env: BatchedEnv) -> None:
        self.frames, self.ended = [env.render(0, self.size, self.size)], False
        self.fps = 1.0 / env.spec.control_dt

    def __call__(self, env: BatchedEnv, out: StepOut) -> None:
        if not self.ended:
            self.ended = bool(out.terminated[0] | out.truncated[0])
            self.frames.append(env.render(0, self.size, self.size, final=self.ended))


def write_mp4(path: str | Path, frames: list[np.ndarray], fps: float) -> Path:
    """Write ``frames`` ([H, W, 3] uint8 each) as an H.264 MP4 at ``fps``, atomically (a
    temporary file renamed into place: an interrupted write leaves no broken video)."""
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise VideoUnavailable(NEEDS_FFMPEG) from None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}.mp4")
    try:
        writer = imageio.get_writer(tmp, fps=fps, macro_block_size=1)
    except (ValueError, ImportError):  # imageio without its ffmpeg plugin
        raise VideoUnavailable(NEEDS_FFMPEG) from None
    try:
        for frame in frames:
            writer.append_data(frame)
        writer.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def gif_bytes(frames: list[np.ndarray], fps: float, max_frames: int = 150) -> bytes:
    """``frames`` as a looping animated GIF at real speed, keeping every k-th frame so at most
    ``max_frames`` remain (a TensorBoard image stays a few MB)."""
    from PIL import Image

    k = max(1, -(-len(frames) // max_frames))
    images = [Image.fromarray(f) for f in frames[::k]]
    buf = io.BytesIO()
    images[0].save(buf, format="GIF", save_all=True, append_images=images[1:],
                   duration=round(1000 * k / fps), loop=0)
    return buf.getvalue()
