"""What the benchmark scripts share: the machine they ran on, checks and JSON files, the
timed runs and evaluations of ours and of Stable-Baselines3 (SB3), and the cells of the
``robotrl bench`` peers (``benchmarks/peers/``: ``PeerCell``).

The scripts import it as ``from common import ...``: run as ``python benchmarks/<script>.py``,
Python puts ``benchmarks/`` on ``sys.path`` itself. SB3 (a dev extra) is imported only by the
functions that use it, so scripts without an SB3 contestant run without it.

Evaluations are seeded as ``robotrl train`` seeds its own (``robotrl.seeding``): the
evaluation worlds from the ``eval-env`` stream of the run seed, their resets from its
``eval-reset`` stream, for ours and for SB3's Gymnasium worlds alike.

Importing it sets glibc's heap thresholds as a run does (``robotrl.nn.heap``), so that a script
times ours as ``robotrl train`` runs it (contestants in the same process share the setting).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mujoco
import torch
from rich.console import Console

import robotrl.envs
from robotrl.bench.harness import PEER_PROGRESS
from robotrl.checkpoint import atomic_open
from robotrl.config import TrainConfig, to_dict
from robotrl.experiment import check_overrides, resolve_config, save_config, validate
from robotrl.experiment.build import build_env, build_runner
from robotrl.experiment.compose import hydra_overrides
from robotrl.nn.heap import keep_freed_memory
from robotrl.nn.linear import cpu_fields
from robotrl.runners.base import Runner
from robotrl.runners.evaluation import PolicyFn, evaluate
from robotrl.seeding import derive_seed, seed_everything

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

keep_freed_memory()
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
COLOURS = {"PASS": "green", "FAIL": "red", "SKIP": "yellow"}


# ---------------------------------------------------------------------------- the machine
def cpu_name() -> str:
    """The CPU model with its family and model numbers (``AMD EPYC (family 25, model 17)``:
    virtual machines often hide the marketing name, and the generation decides which float32
    kernels are fastest, ``robotrl.nn.linear``), else what ``platform`` knows."""
    fields = cpu_fields()
    if "model name" not in fields:
        return platform.processor() or platform.machine()
    name = fields["model name"]
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def warn_if_loaded(console: Console) -> float:
    """The 1-minute load average; says so when other processes already load the cores (the
    timings would not be representative)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > 0.5:
        console.print(f"[yellow]load average {load:.1f} before starting: other processes share "
                      "the cores, so the timings are not representative[/]")
    return load


def sb3_version() -> str:
    import stable_baselines3

    return stable_baselines3.__version__


def banner(title: str, *details: str, sb3: bool = False) -> str:
    """``title | CPU, cores | versions | details...``: a script's first line."""
    versions = f"mujoco {mujoco.__version__}, torch {torch.__version__}"
    versions += f", SB3 {sb3_version()}" if sb3 else ""
    return " | ".join((title, f"{cpu_name()}, {CORES} cores", versions, *details))


def machine_meta(sb3: bool = False) -> dict[str, Any]:
    """The machine and versions a JSON file's ``meta`` starts with."""
    meta: dict[str, Any] = {"cores": CORES, "cpu": cpu_name(), "mujoco": mujoco.__version__,
                            "torch": torch.__version__}
    if sb3:
        meta["sb3"] = sb3_version()
    return {**meta, "python": platform.python_version()}


# ---------------------------------------------------------------------------- figures, checks
def best_median(rates: list[float]) -> dict[str, float]:
    return {"best": max(rates), "median": statistics.median(rates)}


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def check(name: str, value: Any, ok: bool | None, **extra: Any) -> dict[str, Any]:
    """A PASS/FAIL line of a script's verdict; SKIP where ``ok`` is None (not measured)."""
    status = "SKIP" if ok is None else "PASS" if ok else "FAIL"
    return {"name": name, "value": value, **extra, "status": status}


def print_checks(console: Console, checks: list[dict[str, Any]],
                 value: Callable[[dict[str, Any]], str] | None = None) -> None:
    """One coloured line per check; ``value(check)`` is appended where the value is known."""
    for c in checks:
        shown = "" if value is None or c["value"] is None else value(c)
        console.print(f"[{COLOURS[c['status']]}]{c['status']}[/] {c['name']}{shown}")


def write_json(path: str | Path, payload: dict[str, Any], console: Console) -> None:
    """``payload`` to ``path`` (its folder made; a temp file renamed over it, so a crash leaves
    the old file or the whole new one), objects JSON lacks as their ``str``."""
    with atomic_open(path, "w") as f:
        json.dump(payload, f, indent=2, default=str)
    console.print(f"results written to {path}")


def plain(x: Any) -> Any:
    """``x`` with classes and callables replaced by their names, for printing and JSON."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, type) or callable(x):
        return getattr(x, "__name__", repr(x))
    return x


def fresh_dir(path: Path, console: Console) -> Path:
    """Empty ``path`` (a run directory this script writes), so old event files don't mix in."""
    if path.exists():
        console.print(f"[dim]replacing {path}[/]")
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


# ---------------------------------------------------------------------------- evaluations
def ours_eval(cfg: TrainConfig) -> Callable[[PolicyFn], dict[str, float]]:
    """``evaluate`` on ``cfg.eval_episodes`` fresh worlds of ours (nominal physics, one episode
    each), seeded as ``robotrl train`` seeds its evaluations; for any deterministic policy."""
    env = build_env(cfg, cfg.eval_episodes, derive_seed(cfg.seed, "eval-env"), train=False)
    return lambda policy: evaluate(policy, env, seed=derive_seed(cfg.seed, "eval-reset"))


def ours_evaluation(runner: Runner, cfg: TrainConfig) -> Callable[[], dict[str, float]]:
    """Deterministic evaluation of ``runner``'s learner (``ours_eval``)."""
    run = ours_eval(cfg)
    return lambda: run(runner.alg.act_deterministic)


def sb3_policy(model: Any, norm: Any | None) -> PolicyFn:
    """Deterministic SB3 actions for the ``policy`` group; observations normalized with
    ``norm``'s (a ``VecNormalize``) statistics, frozen."""

    def policy(obs: dict[str, torch.Tensor]) -> torch.Tensor:
        x = obs["policy"].cpu().numpy()
        action, _ = model.predict(norm.normalize_obs(x) if norm is not None else x,
                                  deterministic=True)
        return torch.as_tensor(action, dtype=torch.float32)

    return policy


def sb3_eval(task: str, episodes: int, seed: int) -> Callable[[PolicyFn], dict[str, float]]:
    """``evaluate`` on ``episodes`` fresh Gymnasium worlds of ``task`` (one episode each),
    seeded as ours' evaluation worlds of run seed ``seed``."""
    env = robotrl.envs.make(task, episodes, backend="gymnasium",
                            seed=derive_seed(seed, "eval-env"))
    return lambda policy: evaluate(policy, env, seed=derive_seed(seed, "eval-reset"))


# ---------------------------------------------------------------------------- synthetic data
def synthetic_dataset(rows: int, obs_dim: int, act_dim: int) -> Any:
    """An offline ``Dataset`` of random transitions (seed 0), episodes of 1000 rows ending in a
    termination: speed measurements, where the values do not matter."""
    from robotrl.data import Dataset, DatasetCard

    g = torch.Generator().manual_seed(0)
    return Dataset(torch.randn(rows, obs_dim, generator=g),
                   torch.rand(rows, act_dim, generator=g) * 2 - 1,
                   torch.randn(rows, generator=g), torch.randn(rows, obs_dim, generator=g),
                   torch.arange(rows) % 1000 == 999, torch.zeros(rows, dtype=torch.bool),
                   torch.arange(0, rows, 1000), DatasetCard(task="", kind="medium"))


# ---------------------------------------------------------------------------- ours' runner
def ours_runner(cfg: TrainConfig) -> Runner:
    """The runner ``robotrl train`` builds for ``cfg`` (validated, seeded, on its config's torch
    threads), with its own evaluations off: the benchmark evaluates where it chooses."""
    validate(cfg)
    torch.set_num_threads(cfg.torch_threads or CORES)
    seed_everything(cfg.seed)
    runner = build_runner(cfg)
    runner.evaluator = None
    return runner


# ---------------------------------------------------------------------------- wall clock
class TimedEvals:
    """Deterministic evaluations every ``every`` seconds of training time, logged to TensorBoard.

    Training time is wall time since ``begin`` minus the time spent evaluating, so evaluations
    cost neither contestant any budget. Events carry ``walltime = start + training seconds``:
    plotted against wall time relative to the first event, they lie on the training clock.
    """

    def __init__(self, run: Callable[[], dict[str, float]], writer: SummaryWriter, every: float,
                 budget_s: float, train_returns: Callable[[], list[float]] | None = None) -> None:
        self.run, self.writer, self.every, self.budget_s = run, writer, every, budget_s
        self.train_returns = train_returns
        self.curve: list[dict[str, float]] = []
        self.eval_s = 0.0
        self.start = self.wall0 = self.next = 0.0

    def begin(self) -> None:
        """Evaluate the untrained policy at step 0, then start the training clock."""
        result = self.run()
        self.start, self.wall0 = time.perf_counter(), time.time()
        self._record(0, 0.0, result)

    def seconds(self) -> float:
        return time.perf_counter() - self.start - self.eval_s

    def due(self) -> bool:
        return self.seconds() >= self.next

    def out_of_time(self) -> bool:
        return self.seconds() >= self.budget_s

    def evaluate(self, step: int, t: float | None = None) -> float:
        """Evaluate now, at env step ``step`` (recorded at training second ``t``, default
        now); return the seconds it took."""
        t = self.seconds() if t is None else t
        t0 = time.perf_counter()
        result = self.run()
        dt = time.perf_counter() - t0
        self.eval_s += dt
        self._record(step, t, result)
        return dt

    def finish(self, step: int) -> float:
        """The training seconds at the end; a last evaluation at ``step`` unless the last one
        was there (e.g. right after the final update); the events file closed."""
        seconds = self.seconds()
        if self.curve[-1]["steps"] != step:
            self.evaluate(step, seconds)
        self.writer.close()
        return seconds

    def _record(self, step: int, t: float, result: dict[str, float]) -> None:
        point = {"seconds": t, "steps": step, "return": result["return_mean"],
                 "std": result["return_std"], "length": result["length_mean"]}
        self.curve.append(point)
        walltime = self.wall0 + t
        for key in ("return", "std", "length"):
            tag = "eval/return_std" if key == "std" else f"eval/{key}"
            self.writer.add_scalar(tag, point[key], step, walltime=walltime)
        returns = self.train_returns() if self.train_returns else []
        if returns:
            self.writer.add_scalar("rollout/return", sum(returns) / len(returns), step,
                                   walltime=walltime)
        self.writer.flush()
        self.next = t + self.every


def compose_ours(task: str, minutes: float, run_dir: Path, args: argparse.Namespace,
                 extra: list[str]) -> TrainConfig:
    """``robotrl train env=<task> max_minutes=..`` composed by Hydra, tuned configs included."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import robotrl.configs

    path = str(run_dir) if re.fullmatch(r"[\w/.\-]+", str(run_dir)) else f"'{run_dir}'"
    mine = {"env": task, "max_minutes": f"{minutes:g}", "run_dir": path, "eval_interval": "0",
            "logger.progress": "false", "eval_episodes": str(args.eval_episodes),
            "seed": str(args.seed)}
    given = {o.split("=", 1)[0].lstrip("+"): o for o in extra}
    overrides = [f"{k}={v}" for k, v in mine.items() if k not in given] + list(given.values())
    check_overrides(overrides)
    config_dir = str(Path(robotrl.configs.__file__).resolve().parent)
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        composed = compose(config_name="train", overrides=hydra_overrides(overrides))
    return resolve_config(OmegaConf.to_container(composed, resolve=True), overrides)


def ours_wallclock(task: str, minutes: float, name: str, extra: list[str],
                   args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """Ours from the Hydra configs for ``minutes`` of training, evaluated every
    ``args.eval_every`` seconds on the training clock (``TimedEvals``) into ``args.runs/name``."""
    from torch.utils.tensorboard import SummaryWriter

    run_dir = fresh_dir(Path(args.runs) / name, console)
    cfg = compose_ours(task, minutes, run_dir, args, extra)
    runner = ours_runner(cfg)  # TimedEvals evaluates, on the training clock
    save_config(cfg)
    evals = TimedEvals(ours_evaluation(runner, cfg),
                       SummaryWriter(str(run_dir), filename_suffix=".evals"),
                       args.eval_every, 60 * minutes)
    batch = cfg.algo.rollout_steps * cfg.num_envs
    update = runner.alg.update

    update_s = [0.0]

    def update_then_evaluate(progress: float = 0.0) -> dict[str, float]:
        t0 = time.perf_counter()
        metrics = update(progress=progress)
        update_s[0] += time.perf_counter() - t0
        if evals.due():
            # the runner's budget (wall time since train() began) grows by the evaluation time
            runner.settings.max_minutes += evals.evaluate(runner.global_step + batch) / 60
        return metrics

    runner.alg.update = update_then_evaluate
    console.print(f"[dim]{task}: ours ({name}), {cfg.num_envs} worlds, {minutes:g} min ...[/]")
    evals.begin()
    runner.train()
    seconds = evals.finish(runner.global_step)
    early = runner.global_step >= cfg.total_steps and seconds < 60 * minutes
    if early:
        console.print(f"[dim]{name} reached total_steps={cfg.total_steps:,} after "
                      f"{seconds:.0f} s, before its {minutes:g}-min budget[/]")
    label = "ours long" if name.endswith("_long") else "ours"
    return {"label": f"{label} ({minutes:g} min)", "budget_min": minutes, "run_dir": str(run_dir),
            "train_seconds": seconds, "eval_seconds": evals.eval_s, "steps": runner.global_step,
            "update_seconds": update_s[0], "final": evals.curve[-1], "curve": evals.curve,
            "stopped_at_total_steps": early,
            "config": to_dict(cfg)}


def train_subprocess(overrides: list[str], run: Path, label: str) -> tuple[float, str | None]:
    """``robotrl train <overrides> run_dir=<run>`` in a subprocess, logged to ``run/train.log``,
    resumed from ``run/checkpoints/last.pt`` when an earlier attempt left one (an interrupted
    benchmark continues). Returns (wall seconds, None), or (wall seconds, the log's tail) after
    printing it with ``label`` when the run failed."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "robotrl.cli.main", "train", *overrides, f"run_dir={run}"]
    resume = run / "checkpoints" / "last.pt"
    if resume.exists():
        cmd.append(f"resume={resume}")
    run.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(run / "train.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    wall = time.perf_counter() - start
    if proc.returncode == 0:
        return wall, None
    tail = (run / "train.log").read_text()[-800:]
    print(f"FAILED {label} (exit {proc.returncode}):\n{tail}", flush=True)
    return wall, tail


# ---------------------------------------------------------------------------- peer cells
class PeerCell:
    """A peer's cell of ``robotrl bench`` (``robotrl.bench.harness.run_peer`` runs ``python
    benchmarks/peers/<peer>.py CELL.json``): the cell's fields, the peer's evaluations and the
    ``result.json`` it ends with, the schema robotrl's own runs write.

    Evaluations follow robotrl's protocol (the peer passes a callable running ``ours_eval`` or
    ``sb3_eval``, seeded from the run seed's ``eval-env`` and ``eval-reset`` streams,
    deterministic policy, ``options.episodes`` episodes, default 10) every
    ``options.eval_every`` env steps (default: budget / 10) and at the end. Seconds are
    training seconds: from ``start()``, less the time spent evaluating.

    A peer that can put itself back where it was saves its state with ``save_state`` (in
    ``peer_state.pt``, written atomically, data only: ``robotrl.checkpoint``; its step and
    evaluations in ``PEER_PROGRESS`` for ``robotrl bench``) and, started again
    on the same cell, takes it back with ``load_state``: the evaluations and training seconds
    so far are restored, and ``result.json`` names each resumption (``resumed``: the step and
    the machine) and every machine the run trained on.
    """

    STATE = "peer_state.pt"
    """The saved state's file in the run directory, ``PEER_PROGRESS`` beside it (both deleted
    once ``result.json`` is written)."""

    def __init__(self, path: str | Path) -> None:
        spec = json.loads(Path(path).read_text())
        self.algo: str = spec["algo"]
        """The peer's name of the algorithm (the grid's ``peers.<name>.algos`` value)."""
        self.our_algo: str = spec["our_algo"]
        self.target: str = spec["target"]
        self.offline: bool = bool(spec["offline"])
        self.seed: int = int(spec["seed"])
        self.budget: int = int(spec["budget"])
        self.run_dir = Path(spec["run_dir"])
        self.options: dict[str, Any] = dict(spec.get("options") or {})
        self.episodes = int(self.options.get("episodes", 10))
        self.eval_every = int(self.options.get("eval_every") or max(1, self.budget // 10))
        self.evaluations: list[dict[str, Any]] = []
        self.next_eval = self.eval_every
        self.identity = {k: spec.get(k) for k in ("algo", "our_algo", "target", "offline",
                                                  "seed", "budget", "options")}
        """What a saved state must have been saved for to be resumed here."""
        self.resumed: list[dict[str, Any]] = []
        self.machines: list[str] = []
        self._start: float | None = None
        self._eval_s = 0.0
        self._prior_s = 0.0

    @classmethod
    def from_argv(cls, argv: list[str], peer: str) -> PeerCell:
        if len(argv) != 2:
            raise SystemExit(f"usage: python benchmarks/peers/{peer}.py CELL.json (written by "
                             "robotrl bench run)")
        return cls(argv[1])

    def start(self) -> None:
        """Start the training clock (where a resumed run's seconds left off)."""
        from robotrl.experiment.run import machine

        self._start = time.perf_counter()
        self._eval_s = 0.0
        self.machines.append(machine())

    def seconds(self) -> float:
        """Training seconds so far (evaluations excluded), over every resumption."""
        assert self._start is not None, "start() first"
        return self._prior_s + time.perf_counter() - self._start - self._eval_s

    def save_state(self, step: int, state: dict[str, Any]) -> None:
        """Save the peer's ``state`` at env step ``step`` (tensors, arrays, numbers, strings
        and containers of them) with the cell's evaluations and seconds so far."""
        from robotrl.checkpoint import save_checkpoint, write_json

        save_checkpoint(self.run_dir / self.STATE, {
            "cell": self.identity, "step": int(step), "evaluations": self.evaluations,
            "seconds": self.seconds(), "resumed": self.resumed, "machines": self.machines,
            "state": state})
        write_json(self.run_dir / PEER_PROGRESS, {"step": int(step),
                                                  "evaluations": self.evaluations}, indent=1)

    def load_state(self) -> tuple[int, dict[str, Any]] | None:
        """(step, the peer's state) saved by an interrupted run of this cell, its evaluations
        and seconds restored; None to start from scratch (nothing saved, or saved for another
        cell or unreadable: said so)."""
        from robotrl.checkpoint import CheckpointError, load_checkpoint
        from robotrl.experiment.run import machine

        path = self.run_dir / self.STATE
        if not path.is_file():
            return None
        try:
            saved = load_checkpoint(path, required=("cell", "step", "evaluations", "seconds",
                                                    "resumed", "machines", "state"))
        except CheckpointError as err:
            print(f"note: not resuming, starting over: {err}", flush=True)
            return None
        if saved["cell"] != self.identity:
            print(f"note: not resuming, starting over: {path} was saved for another cell "
                  f"({saved['cell']})", flush=True)
            return None
        step = int(saved["step"])
        self.evaluations = list(saved["evaluations"])
        self._prior_s = float(saved["seconds"])
        self.machines = list(saved["machines"])
        self.resumed = [*saved["resumed"], {"step": step, "machine": machine()}]
        while self.next_eval <= step:
            self.next_eval += self.eval_every
        print(f"resuming at {step:,} of {self.budget:,} steps ({self._prior_s:.0f} s of "
              "training so far)", flush=True)
        return step, saved["state"]

    def due(self, step: int) -> bool:
        """Whether an evaluation is due at env step ``step``."""
        return step >= self.next_eval

    def evaluate(self, step: int, run: Callable[[], dict[str, float]]) -> dict[str, Any]:
        """``run()`` (one evaluation) recorded at env step ``step``, off the training clock."""
        seconds = self.seconds()
        t0 = time.perf_counter()
        result = run()
        self._eval_s += time.perf_counter() - t0
        self.evaluations.append({"step": int(step), "seconds": seconds, **result})
        # one line per evaluation in the cell's peer.log: a long peer cell's progress
        print(f"{step:,} of {self.budget:,} steps, {seconds:.0f} s: "
              + ", ".join(f"{k} {v:.1f}" for k, v in result.items()
                          if k in ("return_mean", "normalized_score")), flush=True)
        while self.next_eval <= step:
            self.next_eval += self.eval_every
        return result

    def finish(self, step: int, run: Callable[[], dict[str, float]],
               files: dict[str, Any] | None = None) -> dict[str, Any]:
        """Evaluate at ``step`` unless the last evaluation was there, then write
        ``result.json`` (last, atomically) and return it; ``files`` (name -> JSON data) are
        written into the run directory before it."""
        from robotrl.checkpoint import write_json as write_atomic
        from robotrl.experiment import RESULT_FILE
        from robotrl.experiment.run import machine

        train_seconds = self.seconds()
        if not self.evaluations or self.evaluations[-1]["step"] != step:
            self.evaluate(step, run)
        last = {k: v for k, v in self.evaluations[-1].items() if k not in ("step", "seconds")}
        best = max(e["return_mean"] for e in self.evaluations)
        for name, data in (files or {}).items():
            write_atomic(self.run_dir / name, data, indent=1)
        result = {"step": int(step), "total_steps": self.budget, "final": {**last, "best": best},
                  "train_seconds": train_seconds, "evaluations": self.evaluations,
                  "machine": " then ".join(dict.fromkeys(self.machines or [machine()]))}
        if self.resumed:
            result["resumed"] = self.resumed
        write_atomic(self.run_dir / RESULT_FILE, result, indent=1)
        for spent in (self.STATE, PEER_PROGRESS):
            (self.run_dir / spent).unlink(missing_ok=True)
        return result
