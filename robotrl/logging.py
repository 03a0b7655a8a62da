"""The one place metrics are written: TensorBoard scalars, Weights & Biases (``logger.wandb``,
the ``wandb`` extra) and a rich progress bar."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True, soft_wrap=True)
"""The CLI's messages on stderr, one line each (``soft_wrap``): a path or a number is never broken
across lines in a log file or a pipe, where rich would otherwise wrap at 80 columns; a terminal
wraps long lines itself. Tables pass ``soft_wrap=False`` to fit the width."""


WANDB_EXTRA = "pip install 'robotrl[wandb]' (in a checkout: pip install -e \".[wandb]\")"
WANDB_ID_FILE = "wandb_id.json"
"""In the run directory: ``{"id": ...}``, the W&B run a resumed run continues."""


def import_wandb() -> ModuleType:
    """The ``wandb`` module, or an ImportError whose one line names the extra to install."""
    try:
        import wandb
    except ImportError:
        raise ImportError(f"logger.wandb=true needs wandb: {WANDB_EXTRA}") from None
    return wandb


@dataclasses.dataclass
class WandbSettings:
    """Where a run logs in Weights & Biases (``LoggerConfig``'s ``wandb_*`` keys). The mode
    (online, ``offline``, ``disabled``) and credentials come from W&B's own environment
    (``WANDB_MODE``, ``WANDB_API_KEY``, ``wandb login``)."""

    project: str = "robotrl"
    """W&B project."""
    entity: str = ""
    """W&B team or user ('': the account's default entity)."""
    group: str = ""
    """W&B group ('': none)."""
    tags: list[str] = dataclasses.field(default_factory=list)
    """W&B tags."""
    artifacts: bool = False
    """Upload ``checkpoints/last.pt`` and ``best.pt`` as a model artifact at the end."""


class WandbRun:
    """One W&B run per run directory, its files in ``run_dir/wandb/``; a resumed run continues
    the W&B run whose id ``run_dir/wandb_id.json`` holds (``resume="allow"``)."""

    def __init__(self, run_dir: Path, settings: WandbSettings, config: dict[str, Any],
                 resuming: bool) -> None:
        wandb = import_wandb()
        self._wandb, self.settings = wandb, settings
        run_dir.mkdir(parents=True, exist_ok=True)
        id_file = run_dir / WANDB_ID_FILE
        run_id = _read_id(id_file) if resuming else None  # None: W&B makes one
        # create_new: a seed batch holds one run per seed in one process (wandb >= 0.19.10)
        self.run = wandb.init(
            project=settings.project, entity=settings.entity or None,
            group=settings.group or None, tags=list(settings.tags) or None, name=run_dir.name,
            config=config, dir=str(run_dir), id=run_id, resume="allow", reinit="create_new")
        if run_id is None:
            from robotrl.checkpoint import write_json

            write_json(id_file, {"id": self.run.id})
        self._first_step = int(self.run.starting_step)
        """Logs below it are skipped: online, a resumed W&B run starts after its last logged
        step and would drop (with a warning each) the steps a resume redoes after its
        checkpoint, whose first values it keeps (TensorBoard purges and rewrites them)."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        if step >= self._first_step:
            self.run.log(metrics, step=step)

    def video(self, tag: str, path: Path, step: int) -> None:
        if step >= self._first_step:
            self.run.log({tag: self._wandb.Video(str(path), format="mp4")}, step=step)

    def upload(self, files: list[Path], step: int) -> None:
        """``files`` that exist, as one ``model`` artifact ``checkpoints-<run id>``."""
        files = [f for f in files if f.is_file()]
        if not self.settings.artifacts or not files:
            return
        artifact = self._wandb.Artifact(f"checkpoints-{self.run.id}", type="model",
                                        metadata={"global_step": step})
        for f in files:
            artifact.add_file(str(f), name=f.name)
        self.run.log_artifact(artifact, aliases=["latest", f"step-{step}"])

    def finish(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def _read_id(path: Path) -> str | None:
    """The W&B run id in ``path`` (``WANDB_ID_FILE``), or None (absent or unreadable: a new
    W&B run, said on the console)."""
    if not path.is_file():
        return None
    try:
        run_id = json.loads(path.read_text())["id"]
    except (ValueError, KeyError, TypeError):
        run_id = None
    if not isinstance(run_id, str) or not run_id.isalnum() or len(run_id) > 64:
        console.print(f"[yellow]{path} holds no W&B run id: this resume starts a new W&B "
                      "run[/yellow]")
        return None
    return run_id


class Logger:
    """Flat, namespaced scalars (``loss/*``, ``train/*``, ``rollout/*``, ``reward/*``, ``perf/*``)
    to TensorBoard and, with ``wandb`` settings, to Weights & Biases at the same steps."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True, purge_step: int | None = None,
                 wandb: WandbSettings | None = None, config: dict[str, Any] | None = None):
        """Args: ``purge_step``: the step a resumed run continues from (TensorBoard drops its
        later events, W&B continues the run of ``wandb_id.json``), None for a fresh run;
        ``config``: the resolved run config, recorded by W&B."""
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(run_dir), purge_step=purge_step)
        self.wandb = None if wandb is None else WandbRun(Path(run_dir), wandb, config or {},
                                                          resuming=purge_step is not None)
        self.latest: dict[str, float] = {}

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` at env step ``step``; non-finite values are kept (and visible)."""
        values = {key: float(value) for key, value in metrics.items()}
        self.latest.update(values)
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(values, step)

    def video(self, tag: str, frames: list, step: int, fps: float,
              path: Path | None = None) -> None:
        """Show ``frames`` ([H, W, 3] uint8) in TensorBoard's Images tab as an animated GIF, and
        ``path`` (their MP4, already written) in W&B."""
        if self.wandb is not None and path is not None:
            self.wandb.video(tag, path, step)
        if self.writer is None or not frames:
            return
        from tensorboard.compat.proto.summary_pb2 import Summary

        from robotrl.video import gif_bytes

        h, w = frames[0].shape[:2]
        image = Summary.Image(height=h, width=w, colorspace=3,
                              encoded_image_string=gif_bytes(frames, fps))
        self.writer._get_file_writer().add_summary(  # noqa: SLF001 - what add_video does
            Summary(value=[Summary.Value(tag=tag, image=image)]), step)

    def upload_checkpoints(self, files: list[Path], step: int) -> None:
        """At the end of a run: ``files`` (``last.pt``, ``best.pt``) as a W&B artifact where
        ``logger.wandb_artifacts`` asks for it; nothing otherwise."""
        if self.wandb is not None:
            self.wandb.upload(files, step)

    def close(self, failed: bool = False) -> None:
        """Flush and close; ``failed`` (interrupted, stopped on a non-finite value) marks the
        W&B run failed. A second call does nothing."""
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None
        if self.wandb is not None:
            self.wandb.finish(failed)
            self.wandb = None


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
