"""The one place metrics are written: TensorBoard scalars and a rich progress bar."""

from __future__ import annotations

import math
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True)


class Logger:
    """Flat, namespaced scalars (``loss/*``, ``train/*``, ``rollout/*``, ``reward/*``, ``perf/*``)."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True, purge_step: int | None = None):
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(run_dir), purge_step=purge_step)
        self.latest: dict[str, float] = {}

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` at env step ``step``; non-finite values are kept (and visible)."""
        for key, value in metrics.items():
            value = float(value)
            self.latest[key] = value
            if self.writer is not None:
                self.writer.add_scalar(key, value, step)

    def video(self, tag: str, frames: list, step: int, fps: float) -> None:
        """Show ``frames`` ([H, W, 3] uint8) in TensorBoard's Images tab as an animated GIF."""
        if self.writer is None or not frames:
            return
        from tensorboard.compat.proto.summary_pb2 import Summary

        from robotrl.video import gif_bytes

        h, w = frames[0].shape[:2]
        image = Summary.Image(height=h, width=w, colorspace=3,
                              encoded_image_string=gif_bytes(frames, fps))
        self.writer._get_file_writer().add_summary(  # noqa: SLF001 - what add_video does
            Summary(value=[Summary.Value(tag=tag, image=image)]), step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()


class ProgressBar:
    """Steps, steps/s, ETA and the latest mean return; silent when disabled."""

    def __init__(self, total_steps: int, enabled: bool = True, start: int = 0,
                 label: str = "train") -> None:
        self.enabled = enabled
        self._progress = Progress(
            TextColumn(f"[bold]{label}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[sps]} steps/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TextColumn("return {task.fields[ret]}"),
            console=console,
            disable=not enabled,
        )
        self._task = self._progress.add_task("train", total=total_steps, completed=start,
                                             sps="-", ret="-")

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, step: int, sps: float, mean_return: float) -> None:
        ret = "-" if math.isnan(mean_return) else f"{mean_return:.1f}"
        self._progress.update(self._task, completed=step, sps=f"{sps:,.0f}", ret=ret)
