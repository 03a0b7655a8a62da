"""The training loop shared by the on- and off-policy runners.

Each iteration steps every world ``steps_per_env`` times under inference mode (the algorithm
records what it needs), lets the algorithm learn, then logs, checkpoints and evaluates. It
speaks only the env protocol (``robotrl.envs.base``) and the algorithm protocols
(``robotrl.types``); it never imports a concrete algorithm.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from robotrl.checkpoint import load_checkpoint, save_checkpoint
from robotrl.envs.base import BatchedEnv
from robotrl.envs.wrappers import finished_episodes
from robotrl.logging import Logger, ProgressBar, console
from robotrl.runners.evaluation import evaluate
from robotrl.seeding import derive_seed, rng_state, seed_streams, set_rng_state
from robotrl.types import OffPolicyAlgorithm, OnPolicyAlgorithm


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
    seed: int = 0
    """The run seed; evaluation resets use its ``eval-reset`` stream (``robotrl.seeding``)."""


class Runner:
    """Drives ``alg`` on ``env`` (a BatchedEnv whose step info carries ``episode`` stats).

    Subclasses say how a rollout ends (``_end_rollout``).
    """

    def __init__(
        self,
        env: BatchedEnv,
        alg: OnPolicyAlgorithm | OffPolicyAlgorithm,
        settings: RunnerSettings,
        device: torch.device,
        make_eval_env: Callable[[], BatchedEnv] | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.env, self.alg, self.s, self.device = env, alg, settings, device
        self.make_eval_env = make_eval_env
        self.config = config or {}
        self.iteration = 0
        self.global_step = 0
        self.recent_returns: deque[float] = deque(maxlen=100)
        self.recent_lengths: deque[float] = deque(maxlen=100)
        self.history: list[dict[str, float]] = []
        """Every logged metrics dict, in order (tests compare resumed and uninterrupted runs)."""
        self.last_eval: dict[str, float] | None = None
        self.obs = env.reset().to(device)
        self.checkpoint_path = Path(settings.run_dir) / "checkpoints" / "last.pt"
        self._eval_env: BatchedEnv | None = None

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: Path | None = None) -> Path:
        """Write the whole run state atomically (model, optimizer, normalizers, env, RNG)."""
        payload = {
            "config": self.config,
            "algo": self.alg.state_dict(),
            "env": self.env.state_dict(),
            "obs": self.obs.cpu(),
            "iteration": self.iteration,
            "global_step": self.global_step,
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
            "rng": rng_state(),
            "seeds": seed_streams(self.s.seed),
        }
        return save_checkpoint(path or self.checkpoint_path, payload)

    def load(self, path: str | Path) -> None:
        """Continue from a checkpoint: the run proceeds exactly as if never interrupted."""
        ckpt = load_checkpoint(path, required=("algo", "env", "obs", "iteration", "rng"))
        self.alg.load_state_dict(ckpt["algo"])
        self.env.load_state_dict(ckpt["env"])
        self.obs = ckpt["obs"].to(self.device)
        self.iteration = int(ckpt["iteration"])
        self.global_step = int(ckpt["global_step"])
        self.recent_returns.extend(ckpt["recent_returns"])
        self.recent_lengths.extend(ckpt["recent_lengths"])
        set_rng_state(ckpt["rng"])

    # ------------------------------------------------------------------ loop
    def _end_rollout(self, obs: torch.Tensor) -> None:
        """Called after each rollout with the observation [N, obs_dim] that follows it."""

    def _collect(self) -> dict[str, float]:
        """``steps_per_env`` steps in every world; returns per-step reward-term means."""
        env, alg, dev = self.env, self.alg, self.device
        term_sums: dict[str, torch.Tensor] = {}
        episodes: list[dict[str, torch.Tensor]] = []
        with torch.inference_mode():
            obs = self.obs
            for _ in range(self.s.steps_per_env):
                out = env.step(alg.act(obs))
                obs = out.obs.to(dev)
                alg.process_env_step(out.reward.to(dev), out.terminated.to(dev),
                                     out.truncated.to(dev), out.info["final_obs"].to(dev))
                for name, value in out.info.get("reward_terms", {}).items():
                    term_sums[name] = term_sums.get(name, 0.0) + value.sum()
                if "episode" in out.info:
                    episodes.append(out.info["episode"])
            self._end_rollout(obs)
            # read once per rollout: a per-step read would wait for the device every step
            returns, lengths = finished_episodes(episodes)
            self.recent_returns.extend(returns)
            self.recent_lengths.extend(lengths)
            self.obs = obs
        n = self.s.steps_per_env * env.num_envs
        means = torch.stack(list(term_sums.values())).div(n).tolist() if term_sums else []
        return {f"reward/{k}": v for k, v in zip(term_sums, means, strict=True)}

    def _iterations_total(self) -> int:
        return math.ceil(self.s.total_steps / (self.s.steps_per_env * self.env.num_envs))

    def mean_return(self) -> float:
        return sum(self.recent_returns) / len(self.recent_returns) if self.recent_returns else math.nan

    def train(self) -> dict[str, float] | None:
        """Train to ``total_steps`` or the time budget; checkpoint and evaluate at the end.

        Returns the final evaluation. Ctrl-C saves a checkpoint first; a NaN/Inf in a loss or
        the parameters (``FloatingPointError`` from the algorithm) stops without overwriting the
        last good checkpoint.
        """
        s = self.s
        logger = Logger(s.run_dir, s.tensorboard, purge_step=self.global_step or None)
        start = time.perf_counter()
        total_iters = self._iterations_total()
        out_of_time = False
        try:
            with ProgressBar(s.total_steps, s.progress, start=self.global_step) as bar:
                while self.iteration < total_iters:
                    if s.max_minutes and time.perf_counter() - start > 60 * s.max_minutes:
                        out_of_time = True
                        break
                    t0 = time.perf_counter()
                    metrics = self._collect()
                    t1 = time.perf_counter()
                    metrics.update(self.alg.update(progress=self.global_step / s.total_steps))
                    t2 = time.perf_counter()
                    self.iteration += 1
                    self.global_step += s.steps_per_env * self.env.num_envs
                    sps = s.steps_per_env * self.env.num_envs / (t2 - t0)
                    if self.recent_returns:
                        metrics["rollout/return"] = self.mean_return()
                        metrics["rollout/length"] = sum(self.recent_lengths) / len(self.recent_lengths)
                    metrics.update({"perf/sps": sps, "perf/collect_s": t1 - t0,
                                    "perf/update_s": t2 - t1})
                    self.history.append(metrics)
                    if self.iteration % s.log_interval == 0:
                        logger.log(metrics, self.global_step)
                    bar.update(self.global_step, sps, self.mean_return())
                    if self.iteration % s.checkpoint_interval == 0:
                        self.save()
                    if s.eval_interval and self.iteration % s.eval_interval == 0:
                        logger.log(self._eval_metrics(), self.global_step)
        except KeyboardInterrupt:
            path = self.save()
            console.print(f"[yellow]interrupted: checkpoint saved to {path}[/yellow]")
            logger.close()
            raise
        except FloatingPointError as err:
            logger.close()
            kept = self.checkpoint_path if self.checkpoint_path.exists() else "none written yet"
            raise FloatingPointError(
                f"training stopped at iteration {self.iteration + 1}: {err}. "
                f"Last good checkpoint: {kept}"
            ) from err
        if out_of_time:
            console.print(f"[yellow]max_minutes={s.max_minutes} reached at step "
                          f"{self.global_step:,}: checkpointing and evaluating[/yellow]")
        self.save()
        final = self._eval_metrics() if self.make_eval_env is not None else None
        if final is not None:
            logger.log(final, self.global_step)
        logger.close()
        return self.last_eval

    def _eval_metrics(self) -> dict[str, float]:
        if self.make_eval_env is None:
            return {}
        if self._eval_env is None:
            self._eval_env = self.make_eval_env()
        dev = self.device

        def policy(obs: torch.Tensor) -> torch.Tensor:
            return self.alg.act_deterministic(obs.to(dev)).to(self._eval_env.device)

        result = evaluate(policy, self._eval_env, seed=derive_seed(self.s.seed, "eval-reset"))
        self.last_eval = result
        return {"eval/return": result["return_mean"], "eval/return_std": result["return_std"],
                "eval/length": result["length_mean"]}
