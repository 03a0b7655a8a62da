"""S runs trained in lockstep by one seed-batched learner (``num_seeds``).

Each seed is an ordinary runner (``OfflineRunner``, or ``OffPolicyRunner`` with its own
worlds) with its own learner, run directory, evaluation worlds, TensorBoard writer and
checkpoints; only the gradient updates are shared. An iteration: every seed's runner collects
in its own worlds as alone (``Runner._collect``; offline runs have none), one call of the batch
(``robotrl.algos.seed_batch``) updates every seed's learner in place, then each runner does
what its own ``train`` loop does after an iteration (``Runner._after_iteration``: history,
logging, periodic evaluation and checkpoint) and at the end (``Runner._finish``).
So every seed's directory is a run directory like any other: ``robotrl eval``, export, resume
(alone: ``resume=RUN/s<seed>/checkpoints/last.pt``) and every report read it as one.

A seed the batch stops (a non-finite loss or gradient) keeps its last good parameters, is
checkpointed and gets ``failed.json`` naming the value; the others go on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from robotrl.checkpoint import write_json
from robotrl.logging import ProgressBar, console
from robotrl.runners.base import Runner, deferred_interrupt


class SeedBatch(Protocol):
    """What the driver needs of a seed-batched learner (``SeedBatchTD3BC``)."""

    stopped: dict[int, Any]
    """Seed position -> its stop record (``message()``)."""

    def update(self, progress: float = 0.0) -> dict[int, dict[str, float]]: ...


class SeedBatchRunner:
    """Drives ``runners`` (one per seed, in the batch's order) with ``batch``; see the module
    docstring."""

    def __init__(self, runners: Sequence[Runner], batch: SeedBatch) -> None:
        steps = {(r.global_step, r.settings.total_steps, r.settings.steps_per_env)
                 for r in runners}
        if len(steps) != 1:
            raise ValueError("the runs of a seed batch must be at the same step with the same "
                             f"budget, got (step, total, per iteration) {sorted(steps)}")
        self.runners = list(runners)
        self.batch = batch
        self.per_iteration = runners[0].steps_per_iteration()
        """What an iteration adds to each seed's ``global_step`` (env steps or updates)."""

    def train(self) -> list[dict[str, float] | None]:
        """Train every seed to the budget (or the time budget); each seed's final evaluation,
        None for a stopped seed. Ctrl-C checkpoints every seed, then raises."""
        lead = self.runners[0].settings
        loggers = [r._start() for r in self.runners]
        start = time.perf_counter()
        reported: set[int] = set()
        try:
            with (deferred_interrupt() as stop_requested,
                  ProgressBar(lead.total_steps, lead.progress,
                              start=self.runners[0].global_step) as bar):
                while self._active() and self._step() < lead.total_steps:
                    if stop_requested():
                        raise KeyboardInterrupt
                    if lead.max_minutes and time.perf_counter() - start > 60 * lead.max_minutes:
                        console.print(f"[yellow]max_minutes={lead.max_minutes} reached at "
                                      f"step {self._step():,}: checkpointing and "
                                      "evaluating[/yellow]")
                        break
                    t0 = time.perf_counter()
                    collected = {i: r._collect() for i, r in enumerate(self.runners)
                                 if i not in self.batch.stopped and r.collector is not None}
                    t1 = time.perf_counter()
                    per_seed = self.batch.update(progress=self._step() / lead.total_steps)
                    t2 = time.perf_counter()
                    elapsed = t2 - t0
                    for i, metrics in per_seed.items():
                        runner = self.runners[i]
                        runner.iteration += 1
                        runner.global_step += self.per_iteration
                        metrics = {**collected.get(i, {}), **metrics,
                                   **(runner.collector.episode_metrics() if i in collected
                                      else {}),
                                   "perf/sps": self.per_iteration / elapsed,
                                   "perf/collect_s": t1 - t0, "perf/update_s": t2 - t1}
                        runner._after_iteration(metrics, loggers[i])
                    self._report_stops(reported)
                    bar.update(self._step(), self.per_iteration / elapsed, math.nan)
        except KeyboardInterrupt:
            for runner, logger in zip(self.runners, loggers, strict=True):
                runner.save()
                logger.close(failed=True)
            console.print(f"[yellow]interrupted: every seed's checkpoint saved "
                          f"({', '.join(str(r.checkpoint_path) for r in self.runners)})[/yellow]")
            raise
        self._report_stops(reported)
        results: list[dict[str, float] | None] = []
        for i, (runner, logger) in enumerate(zip(self.runners, loggers, strict=True)):
            if i in self.batch.stopped:
                runner.save()  # its last good parameters, resumable alone
                runner._clock = None
                logger.close(failed=True)
                results.append(None)
            else:
                results.append(runner._finish(logger))
        return results

    def _active(self) -> list[Runner]:
        return [r for i, r in enumerate(self.runners) if i not in self.batch.stopped]

    def _step(self) -> int:
        return self._active()[0].global_step

    def _report_stops(self, reported: set[int]) -> None:
        for i, stop in self.batch.stopped.items():
            if i in reported:
                continue
            reported.add(i)
            run_dir = Path(self.runners[i].settings.run_dir)
            write_json(run_dir / "failed.json", {"error": stop.message()}, indent=1)
            console.print(f"[red]{run_dir}: {stop.message()}; the other seeds go on[/red]")
