"""Offline runner: gradient updates from a dataset, evaluation in the simulator.

No worlds are stepped for learning. An iteration is ``steps_per_env`` (the algorithm's
``updates_per_iteration``) gradient updates on batches of the dataset, which the learner holds on its own
device (``attach``); ``total_steps`` counts gradient updates. Evaluation, ``best.pt``,
checkpoints (resume continues exactly: the learner's sampling generator and optimizers are in
them), TensorBoard, the progress bar and the NaN guard are the shared ``Runner``'s. The
evaluation logs the dataset's normalized score (``eval/normalized_score``) beside the return.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from robotrl.data.dataset import Dataset
from robotrl.runners.base import Runner, RunnerSettings
from robotrl.types import BatchedEnv, OfflineAlgorithm

__all__ = ["OfflineRunner", "RunnerSettings"]


class OfflineRunner(Runner):
    """The shared loop without a collector; see the module docstring."""

    alg: OfflineAlgorithm
    learns_from = "dataset"
    iteration_key = "updates_per_iteration"

    def __init__(self, dataset: Dataset, alg: OfflineAlgorithm, settings: RunnerSettings,
                 device: torch.device, make_eval_env: Callable[[], BatchedEnv] | None = None,
                 config: dict[str, Any] | None = None) -> None:
        super().__init__(None, alg, settings, device, make_eval_env, config)
        alg.attach(dataset)
        self.dataset = dataset
        if self.evaluator is not None:
            self.evaluator.score = dataset.card.normalized_score

    def steps_per_iteration(self) -> int:
        """An iteration's gradient updates: offline, ``global_step`` counts updates."""
        return self.settings.steps_per_env

    def _iteration(self) -> dict[str, float]:
        steps = self.steps_per_iteration()
        t0 = time.perf_counter()
        metrics = self.alg.update(progress=self.global_step / self.settings.total_steps)
        elapsed = time.perf_counter() - t0
        self.iteration += 1
        self.global_step += steps
        metrics.update({"perf/sps": steps / elapsed, "perf/update_s": elapsed})
        return metrics
