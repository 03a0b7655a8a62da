"""The training loop shared by every runner kind, composed of small parts they all reuse.

- ``Collector`` steps every world ``steps_per_env`` times under inference mode, handing each
  step to the learner (``act``, ``process_env_step``); episode statistics come from the env's
  ``RecordEpisodeStatistics`` (the one place returns are tracked).
- ``Evaluator`` runs deterministic episodes on its own worlds (nominal physics).
- ``Checkpointer`` writes and reads the whole run state atomically.
- ``robotrl.logging.Logger`` writes the metrics; ``ProgressBar`` shows them.

``Runner.train`` loops: collect, close the rollout (``_end_rollout``, per runner kind), update,
then log, checkpoint and evaluate on their intervals. It speaks only the env protocol
(``robotrl.envs.base``) and the learner protocol (``robotrl.types``); it never imports a
concrete algorithm. Offline and group runners reuse the evaluator, checkpointer and logger and
bring their own collection.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch

from robotrl import distributed
from robotrl.checkpoint import load_checkpoint, restoring, save_checkpoint
from robotrl.envs.wrappers import RecordEpisodeStatistics
from robotrl.logging import Logger, ProgressBar, WandbSettings, console
from robotrl.runners.evaluation import evaluate
from robotrl.seeding import derive_seed, rng_state, seed_streams, set_rng_state
from robotrl.types import BatchedEnv, Learner, Obs, obs_to
from robotrl.video import TRAIN_SIZE, EpisodeRecorder, write_mp4


@dataclasses.dataclass
class RunnerSettings:
    """What the runner needs from the run config."""

    total_steps: int
    """Env steps to train for (summed over worlds)."""
    steps_per_env: int
    """Env steps per world per iteration (the rollout length T of on-policy algorithms)."""
    run_dir: Path
    """Where checkpoints/ and TensorBoard events go."""
    max_minutes: float = 0.0
    """Wall-clock budget of this process (0: none)."""
    checkpoint_interval: int = 50
    """Iterations between ``checkpoints/last.pt`` writes."""
    eval_interval: int = 0
    """Iterations between evaluations (0: only at the end)."""
    log_interval: int = 1
    """Iterations between metric logs."""
    progress: bool = True
    """Show the progress bar."""
    tensorboard: bool = True
    """Write TensorBoard events."""
    wandb: WandbSettings | None = None
    """Also log to Weights & Biases (``robotrl.logging.WandbRun``); None: not."""
    seed: int = 0
    """The run seed; evaluation resets use its ``eval-reset`` stream (``robotrl.seeding``)."""
    video: bool = False
    """Film each evaluation's first episode (``robotrl.video``) into ``run_dir/videos/``."""
    history_size: int = 10_000
    """Iterations whose metrics ``Runner.history`` keeps in memory (the oldest are dropped)."""


class Collector:
    """Steps ``env`` with ``learner`` and keeps the observation between rollouts.

    Attributes:
        env: the training worlds, wrapped in ``RecordEpisodeStatistics`` if they were not.
        obs: the observation (every group, [N, ...]) the next rollout starts from, on ``device``.
    """

    def __init__(self, env: BatchedEnv, learner: Learner, device: torch.device) -> None:
        self.env = env if isinstance(env, RecordEpisodeStatistics) else RecordEpisodeStatistics(env)
        self.learner, self.device = learner, device
        self.obs = obs_to(self.env.reset(), device)

    def collect(self, steps: int) -> dict[str, float]:
        """``steps`` steps in every world; returns the per-step means of the reward terms
        (``reward/<term>``) and of the env's ``info["metrics"]`` (``env/<name>``), read with one
        host sync."""
        env, learner, device = self.env, self.learner, self.device
        term_sums: dict[str, torch.Tensor] = {}
        obs = self.obs
        for _ in range(steps):
            out = env.step(learner.act(obs))
            obs = obs_to(out.obs, device)
            learner.process_env_step(out.reward.to(device), out.terminated.to(device),
                                     out.truncated.to(device), obs_to(out.info["final_obs"], device))
            for name, value in out.info.get("reward_terms", {}).items():
                term_sums[f"reward/{name}"] = term_sums.get(f"reward/{name}", 0.0) + value.sum()
            for name, value in out.info.get("metrics", {}).items():  # e.g. a terrain level
                term_sums[f"env/{name}"] = term_sums.get(f"env/{name}", 0.0) + value.sum()
        self.obs = obs
        n = steps * env.num_envs
        means = torch.stack(list(term_sums.values())).div(n).tolist() if term_sums else []
        return dict(zip(term_sums, means, strict=True))

    def episode_metrics(self) -> dict[str, float]:
        """``rollout/return`` and ``rollout/length`` over the last finished episodes (one host
        sync, in the statistics wrapper); empty before the first episode ends."""
        returns, lengths = self.env.recent_returns, self.env.recent_lengths
        if not returns:
            return {}
        return {"rollout/return": sum(returns) / len(returns),
                "rollout/length": sum(lengths) / len(lengths)}


class Evaluator:
    """Deterministic evaluation of a learner on worlds made on first use.

    Attributes:
        last: the latest ``evaluate`` result (``return_mean``, ...), or None.
    """

    def __init__(self, make_env: Callable[[], BatchedEnv], seed: int, device: torch.device,
                 video_size: int = 0) -> None:
        """Args: ``make_env`` builds the evaluation worlds; ``seed`` is the run seed (resets
        use its ``eval-reset`` stream); ``device`` is the learner's; ``video_size`` > 0 films
        world 0's episode at that many pixels square (``frames``)."""
        self.make_env, self.seed, self.device = make_env, seed, device
        self.env: BatchedEnv | None = None
        self.last: dict[str, float] | None = None
        self.recorder = EpisodeRecorder(video_size) if video_size else None
        """The last evaluation's film (``recorder.frames``), or None: not filming."""
        self.score: Callable[[float], float] | None = None
        """Maps a mean return to a normalized score (an offline dataset's card), or None."""

    select = "eval/return"
    """The metric ``best.pt`` is chosen on (highest wins)."""

    def __call__(self, learner: Learner) -> dict[str, float]:
        """One episode per evaluation world; returns ``eval/*`` metrics."""
        if self.env is None:
            self.env = self.make_env()
        env, device = self.env, self.device

        def policy(obs: Obs) -> torch.Tensor:
            return learner.act_deterministic(obs_to(obs, device)).to(env.device)

        self.last = evaluate(policy, env, seed=derive_seed(self.seed, "eval-reset"),
                             recorder=self.recorder)
        metrics = {"eval/return": self.last["return_mean"],
                   "eval/return_std": self.last["return_std"], "eval/length": self.last["length_mean"]}
        for key in ("success", "final_distance", "reached", "time_to_goal"):  # goal tasks
            if key in self.last:
                metrics[f"eval/{key}"] = self.last[key]
        if self.score is not None:
            self.last["normalized_score"] = self.score(self.last["return_mean"])
            metrics["eval/normalized_score"] = self.last["normalized_score"]
        return metrics


class Checkpointer:
    """Atomic writes of the run state to ``path``; reads validate the required entries."""

    REQUIRED: tuple[str, ...] = ("algo", "env", "obs", "iteration", "global_step", "rng")
    """Entries a resumable checkpoint must have."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def save(self, payload: dict[str, Any], path: Path | None = None) -> Path:
        return save_checkpoint(path or self.path, payload)

    def load(self, path: str | Path) -> dict[str, Any]:
        return load_checkpoint(path, required=self.REQUIRED)


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[Callable[[], bool]]:
    """Ctrl-C asks to stop at the next iteration boundary instead of raising wherever the main
    thread is; yields ``requested()``. A second Ctrl-C raises ``KeyboardInterrupt`` at once.

    Raising inside torch is unsafe: a ``KeyboardInterrupt`` delivered during ``backward()``
    hung torch 2.14.1's autograd engine (seen in CI, stacks in issue 24's note), and an
    interrupted optimizer step would leave half-updated parameters in the checkpoint.
    """
    requested = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield requested.is_set  # signal handlers can only be set from the main thread
        return

    def handler(signum: int, frame: object) -> None:
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield requested.is_set
    finally:
        signal.signal(signal.SIGINT, previous)


class Runner:
    """Drives a learner on ``env``; runner kinds say how a rollout ends (``_end_rollout``).

    ``learns_from`` tells the builder what the first argument is: ``"env"`` (training worlds)
    or ``"dataset"`` (the offline runner).

    Attributes:
        env, alg: the training worlds (with episode statistics) and the learner.
        settings: the ``RunnerSettings``.
        collector, checkpointer: the parts above; ``evaluator`` may be None (no evaluation).
        iteration, global_step: progress (iterations done, env steps summed over worlds).
        history: the logged metrics of the last ``settings.history_size`` iterations, in order.
    """

    learns_from: ClassVar[str] = "env"
    iteration_key: ClassVar[str] = ""
    """The algorithm config field that sizes one iteration (``RunnerSettings.steps_per_env``):
    each runner kind names its own (``rollout_steps``, ``collect_steps``,
    ``updates_per_iteration``, ``horizon``)."""
    evaluate_first: ClassVar[bool] = False
    """Evaluate once before the first iteration of a fresh run (step 0)."""
    heldout_states: ClassVar[bool] = False
    """Takes ``make_heldout_env`` (worlds drawing the task's held-out compositions)."""

    def __init__(
        self,
        env: BatchedEnv | None,
        alg: Learner,
        settings: RunnerSettings,
        device: torch.device,
        make_eval_env: Callable[[], BatchedEnv] | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.alg, self.settings, self.device = alg, settings, device
        self.config = config or {}
        self.rank = distributed.current()
        """This process's rank: only rank 0 logs, shows progress, evaluates and writes the
        run's ``last.pt``/``best.pt``; rank r keeps its own state in ``last.rank<r>.pt``."""
        if not self.rank.main:
            make_eval_env = None
        # the offline runner has no training worlds: env None, no collector
        self.collector = None if env is None else Collector(env, alg, device)
        self.env = None if self.collector is None else self.collector.env
        self.evaluator = None if make_eval_env is None else Evaluator(
            make_eval_env, settings.seed, device, video_size=TRAIN_SIZE if settings.video else 0)
        self.checkpointer = Checkpointer(
            distributed.rank_path(Path(settings.run_dir) / "checkpoints" / "last.pt"))
        self.best_path = self.checkpointer.path.with_name("best.pt")
        """Where the best evaluation so far is kept (SB3's EvalCallback ``best_model``)."""
        self.best_eval: float | None = None
        """Mean return of the best evaluation so far (saved in checkpoints, so resume keeps it)."""
        self.evaluations: list[dict[str, float]] = []
        """Every evaluation of the run (``step`` and the evaluator's result), in order; saved in
        checkpoints, so a resumed run's curve is whole (benchmarks read it, not TensorBoard)."""
        self.train_seconds = 0.0
        """Wall-clock seconds spent in ``train`` over every process of the run (resumes add up)."""
        self._clock: tuple[float, float] | None = None
        self.iteration = 0
        self.global_step = 0
        self.history: deque[dict[str, float]] = deque(maxlen=settings.history_size)

    @property
    def checkpoint_path(self) -> Path:
        return self.checkpointer.path

    @property
    def last_eval(self) -> dict[str, float] | None:
        return None if self.evaluator is None else self.evaluator.last

    @property
    def recent_returns(self) -> list[float]:
        """Returns of the last finished training episodes (the statistics wrapper's window)."""
        return [] if self.env is None else list(self.env.recent_returns)

    def _seconds(self) -> float:
        """Training seconds so far, over resumes (inside ``train()``: up to now)."""
        if self._clock is None:
            return self.train_seconds
        base, t0 = self._clock
        return base + time.perf_counter() - t0

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: Path | None = None) -> Path:
        """Write the whole run state atomically (model, optimizer, normalizers, env, RNG)."""
        self.train_seconds = self._seconds()
        return self.checkpointer.save({
            "config": self.config,
            "algo": self.alg.state_dict(),
            "env": {} if self.env is None else self.env.state_dict(),
            "obs": {} if self.collector is None else obs_to(self.collector.obs, "cpu"),
            "iteration": self.iteration,
            "global_step": self.global_step,
            "rng": rng_state(),
            "seeds": seed_streams(self.settings.seed),
            "best_eval": self.best_eval,
            "evaluations": self.evaluations,
            "train_seconds": self.train_seconds,
            **self._extra_state(),
        }, path)

    def _extra_state(self) -> dict[str, Any]:
        """What a runner kind adds to checkpoints (its own generators)."""
        return {}

    def _load_extra_state(self, ckpt: dict[str, Any]) -> None:
        """Restore what ``_extra_state`` added."""

    def load(self, path: str | Path) -> None:
        """Continue from a checkpoint: the run proceeds exactly as if never interrupted."""
        ckpt = self.checkpointer.load(path)
        with restoring(f"checkpoint {str(path)!r}"):  # a file that does not fit: named error
            self.alg.load_state_dict(ckpt["algo"])
            if self.collector is not None:
                self.env.load_state_dict(ckpt["env"])
                obs = ckpt["obs"]  # a flat tensor in checkpoints from before observation groups
                self.collector.obs = obs_to(obs if isinstance(obs, dict) else {"policy": obs},
                                            self.device)
            self.iteration = int(ckpt["iteration"])
            self.global_step = int(ckpt["global_step"])
            self.best_eval = ckpt.get("best_eval")
            self.evaluations = list(ckpt.get("evaluations", []))  # absent before issue 13
            self.train_seconds = float(ckpt.get("train_seconds", 0.0))
            self._load_extra_state(ckpt)
            set_rng_state(ckpt["rng"])

    def _evaluate(self, logger: Logger) -> None:
        """Evaluate, log, and write ``best.pt`` (atomically) when the return beats the best."""
        assert self.evaluator is not None
        metrics = self.evaluator(self.alg)
        logger.log(metrics, self.global_step)
        self.evaluations.append({"step": self.global_step, "seconds": self._seconds(),
                                 **self.evaluator.last})
        recorder = self.evaluator.recorder
        if recorder is not None:
            video = Path(self.settings.run_dir) / "videos" / f"step_{self.global_step:010d}.mp4"
            write_mp4(video, recorder.frames, recorder.fps)
            logger.video("eval/video", recorder.frames, self.global_step, recorder.fps,
                         path=video)
        value = metrics[self.evaluator.select]
        if not math.isnan(value) and (self.best_eval is None or value > self.best_eval):
            self.best_eval = value
            self.save(self.best_path)

    # ------------------------------------------------------------------ loop
    def _end_rollout(self, obs: Obs) -> None:
        """Called after each rollout with the observation that follows it."""

    def steps_per_iteration(self) -> int:
        """What one iteration adds to ``global_step`` (env steps summed over worlds, of every
        rank in a data-parallel run)."""
        return self.settings.steps_per_env * self.env.num_envs * self.rank.world_size

    def _collect(self) -> dict[str, float]:
        """An iteration's collection: ``steps_per_env`` steps of every world, handed to the
        learner; returns the rollout's metrics."""
        with torch.inference_mode():
            metrics = self.collector.collect(self.settings.steps_per_env)
            self._end_rollout(self.collector.obs)
        return metrics

    def _iteration(self) -> dict[str, float]:
        """One collect-and-update iteration; returns its metrics."""
        steps = self.steps_per_iteration()
        t0 = time.perf_counter()
        metrics = self._collect()
        t1 = time.perf_counter()
        metrics.update(self.alg.update(progress=self.global_step / self.settings.total_steps))
        t2 = time.perf_counter()
        self.iteration += 1
        self.global_step += steps
        metrics.update(self.collector.episode_metrics())
        metrics.update({"perf/sps": steps / (t2 - t0), "perf/collect_s": t1 - t0,
                        "perf/update_s": t2 - t1})
        return metrics

    def train(self) -> dict[str, float] | None:
        """Train to ``total_steps`` or the time budget; checkpoint and evaluate at the end.

        Returns the final evaluation. Every evaluation that beats the best so far also writes
        ``checkpoints/best.pt`` (the whole run state, so eval/export/resume take it). Ctrl-C
        stops at the end of the running iteration and saves a checkpoint first
        (``deferred_interrupt``); a NaN/Inf in a loss or the parameters (``FloatingPointError``
        from the algorithm) stops without overwriting the last good checkpoint.
        """
        s = self.settings
        main = self.rank.main
        logger = self._start()
        start = time.perf_counter()
        out_of_time = False
        try:
            with (deferred_interrupt() as stop_requested,
                  ProgressBar(s.total_steps, s.progress and main, start=self.global_step) as bar):
                if self.evaluate_first and self.evaluator and not self.evaluations:
                    self._evaluate(logger)
                while self.global_step < s.total_steps:
                    late = bool(s.max_minutes) and time.perf_counter() - start > 60 * s.max_minutes
                    stop, late = distributed.any_rank(stop_requested(), late)  # ranks stop together
                    if stop:
                        raise KeyboardInterrupt
                    if late:
                        out_of_time = True
                        break
                    metrics = self._iteration()
                    bar.update(self.global_step, metrics["perf/sps"],
                               metrics.get("rollout/return", math.nan))
                    self._after_iteration(metrics, logger)
        except KeyboardInterrupt:
            path = self.save()
            if main:
                console.print(f"[yellow]interrupted: checkpoint saved to {path}[/yellow]")
            logger.close(failed=True)
            raise
        except FloatingPointError as err:
            logger.close(failed=True)
            kept = self.checkpoint_path if self.checkpoint_path.exists() else "none written yet"
            raise type(err)(
                f"training stopped at iteration {self.iteration + 1}: {err}. "
                f"Last good checkpoint: {kept}"
            ) from err
        if out_of_time and main:
            console.print(f"[yellow]max_minutes={s.max_minutes} reached at step "
                          f"{self.global_step:,}: checkpointing and evaluating[/yellow]")
        return self._finish(logger)

    # The parts of ``train`` that a driver of several runners in lockstep (a seed batch,
    # ``robotrl.runners.seed_batch``) calls itself: open, after each iteration, close.
    def _start(self) -> Logger:
        """Open the run's logger and start its wall clock."""
        s = self.settings
        logger = Logger(s.run_dir, s.tensorboard and self.rank.main,
                        purge_step=self.global_step or None,
                        wandb=s.wandb if self.rank.main else None, config=self.config)
        self._clock = (self.train_seconds, time.perf_counter())
        return logger

    def _after_iteration(self, metrics: dict[str, float], logger: Logger) -> None:
        """An iteration's bookkeeping: history, logging, the periodic evaluation (first:
        ``last.pt`` then records the best so far) and checkpoint."""
        s = self.settings
        self.history.append(metrics)
        if self.iteration % s.log_interval == 0:
            logger.log(metrics, self.global_step)
        if self.evaluator and s.eval_interval and self.iteration % s.eval_interval == 0:
            self._evaluate(logger)
        if self.iteration % s.checkpoint_interval == 0:
            self.save()

    def _finish(self, logger: Logger) -> dict[str, float] | None:
        """Evaluate at the last step (unless the last periodic evaluation was there), save,
        stop the clock, close the logger; the final evaluation."""
        evaluated = bool(self.evaluations) and self.evaluations[-1]["step"] == self.global_step
        if self.evaluator is not None and not evaluated:
            self._evaluate(logger)
        self.save()
        self._clock = None
        logger.upload_checkpoints([self.checkpoint_path, self.best_path], self.global_step)
        logger.close()
        return self.last_eval
