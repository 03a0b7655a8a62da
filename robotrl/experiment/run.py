"""Running an experiment and reading its run directory back: the public API the CLI and every
benchmark call.

    from robotrl.experiment import Experiment, RunDir

    exp = Experiment.from_overrides(["algo=sac", "env=hopper", "total_steps=200000",
                                     "run_dir=runs/sac-hopper"])   # composed and validated once
    result = exp.run()             # {"return_mean": ..., "best": ...}; also run_dir/result.json
    run = RunDir("runs/sac-hopper")
    run.config.algo, run.finished, run.eval()["return_mean"], run.scalars()["train/return"]

A run directory is the unit of everything: ``config.yaml`` (the resolved config),
``checkpoints/last.pt`` and ``best.pt`` (learner, counters, every evaluation),
TensorBoard event files (every logged scalar) and, once training reached its budget,
``result.json`` (the final and best evaluation). Reports and benchmark tables are computed
from run directories only.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robotrl.checkpoint import write_json
from robotrl.config import TrainConfig, from_dict, to_dict
from robotrl.experiment.build import build_runner
from robotrl.experiment.compose import compose, validate

if TYPE_CHECKING:
    from robotrl.distributed import Rank
    from robotrl.runners.base import Runner

RESULT_FILE = "result.json"
"""Written by rank 0 when a run reaches its budget: ``{step, total_steps, final (the last
evaluation, with ``best``), train_seconds, evaluations (every one: step, seconds, scores),
machine, config (``config_digest``)}``;
the compact record a benchmark keeps."""


PLACE_KEYS = ("run_dir", "resume", "logger")
"""Config keys that say where a run writes and how it reports, not what it trains: left out of
``config_fields`` (a resumed or moved run is the same run)."""


def config_fields(cfg: TrainConfig) -> dict[str, Any]:
    """What a run trains, flattened (``algo.gamma`` -> value; lists for tuples): every config
    field except ``PLACE_KEYS``. Two runs with equal fields train the same thing."""
    def flat(prefix: str, value: Any, out: dict[str, Any]) -> dict[str, Any]:
        if isinstance(value, dict):
            for k, v in value.items():
                flat(f"{prefix}{k}.", v, out)
        else:
            out[prefix[:-1]] = list(value) if isinstance(value, tuple) else value
        return out

    data = {k: v for k, v in to_dict(cfg).items() if k not in PLACE_KEYS}
    return flat("", data, {})


def config_digest(cfg: TrainConfig) -> str:
    """A short fingerprint of ``config_fields``: a benchmark record carries it, so a record whose
    config has since changed (a tuned file, a default) is not passed off as the current one."""
    import hashlib

    text = json.dumps(config_fields(cfg), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def machine(device: str = "cpu") -> str:
    """What a run ran on, for the tables that report it: CPU model and cores, or the GPU; on an
    AMD CPU whose MKL runs its Intel kernels (``benchmarks/mkl_intel_path.c`` preloaded), says
    so: its products round, and its updates time, otherwise than the same CPU's default."""
    import platform

    import torch

    from robotrl.nn.linear import cpu_fields, mkl_intel_path

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    fields = cpu_fields()
    name = fields.get("model name") or platform.processor() or platform.machine()
    mkl = (", MKL's Intel kernels" if fields.get("vendor_id") == "AuthenticAMD"
           and mkl_intel_path() else "")
    return f"{name}, {cores} cores{mkl}"


class Experiment:
    """One run: a validated config, built and trained on demand."""

    def __init__(self, cfg: TrainConfig) -> None:
        validate(cfg)  # the one validation of the run: nothing is built before it
        self.cfg = cfg

    @classmethod
    def from_overrides(cls, overrides: list[str]) -> Experiment:
        """``robotrl train OVERRIDES`` as an object: Hydra composition (``configs/tuned/``
        included), a resume's saved config merged, validated."""
        return cls(compose(list(overrides)))

    @property
    def run_dir(self) -> RunDir:
        return RunDir(self.cfg.run_dir)

    def build(self) -> Runner:
        """The runner ``run`` would train (seeded, on the config's torch threads), for code that
        drives it itself; nothing is written to the run directory."""
        import torch

        from robotrl.nn.heap import keep_freed_memory
        from robotrl.seeding import seed_everything

        torch.set_num_threads(self.cfg.torch_threads or os.cpu_count() or 1)
        keep_freed_memory()
        seed_everything(self.cfg.seed)
        return build_runner(self.cfg)

    def run(self) -> dict[str, float] | None:
        """Train (resuming where ``cfg.resume`` says), evaluate, write the run directory; the
        final evaluation with the best one under ``"best"`` (None on ranks other than 0)."""
        return _run(self.cfg)


class RunDir:
    """What a run directory holds, read back without building anything (data-only loaders:
    ``robotrl.checkpoint`` and YAML's safe loader)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def config(self) -> TrainConfig:
        """The run's resolved config (``config.yaml``)."""
        import yaml

        file = self.path / "config.yaml"
        if not file.is_file():
            raise FileNotFoundError(f"{self.path} is not a run directory (no config.yaml)")
        return from_dict(TrainConfig, yaml.safe_load(file.read_text()))

    @property
    def result(self) -> dict[str, Any] | None:
        """``result.json`` (written when the run reached its budget), or None."""
        file = self.path / RESULT_FILE
        if not file.is_file():
            return None
        return json.loads(file.read_text())

    @property
    def finished(self) -> bool:
        """Whether the run reached its budget and evaluated there."""
        result = self.result
        return result is not None and result["step"] >= result["total_steps"]

    def checkpoint(self, name: str = "last") -> dict[str, Any] | None:
        """``checkpoints/<name>.pt`` (data only), or None before the first one."""
        from robotrl.checkpoint import load_checkpoint

        file = self.path / "checkpoints" / f"{name}.pt"
        return load_checkpoint(file) if file.is_file() else None

    def evaluations(self) -> list[dict[str, float]]:
        """Every evaluation of the run so far (``step``, ``seconds``, ``return_mean``, ...)."""
        ckpt = self.checkpoint()
        return list(ckpt.get("evaluations", [])) if ckpt else []

    def eval(self) -> dict[str, float]:
        """The final evaluation of a finished run, else the latest one; ``{}`` before any."""
        result = self.result
        if result is not None:
            return dict(result["final"])
        evals = self.evaluations()
        return dict(evals[-1]) if evals else {}

    def scalars(self) -> dict[str, list[tuple[int, float]]]:
        """Every scalar the run logged to TensorBoard: tag -> [(step, value)] in step order
        (the last write of a step wins, as after a resume)."""
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        out: dict[str, dict[int, float]] = {}
        for events in sorted(self.path.glob("events.out.tfevents.*")):
            acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
            acc.Reload()
            for tag in acc.Tags()["scalars"]:
                series = out.setdefault(tag, {})
                for e in acc.Scalars(tag):
                    series[int(e.step)] = float(e.value)
        return {tag: sorted(s.items()) for tag, s in out.items()}


def run_training(cfg: TrainConfig) -> dict[str, float] | None:
    """Validate, build, (resume,) train, evaluate; return the final evaluation (None on the
    ranks other than 0 of a data-parallel run)."""
    return Experiment(cfg).run()


def _run(cfg: TrainConfig) -> dict[str, float] | None:
    """``Experiment.run`` of a validated config."""
    import torch

    from robotrl import distributed
    from robotrl.checkpoint import run_lock
    from robotrl.nn.heap import keep_freed_memory

    torch.set_num_threads(cfg.torch_threads or os.cpu_count() or 1)
    keep_freed_memory()  # large CPU tensors without page faults every update
    if cfg.num_seeds > 1:
        return _train_seeds(cfg)
    rank = distributed.init(cfg.device) if cfg.distributed else distributed.current()
    try:
        # rank 0 owns the run directory: a second run pointed at it is refused (RunLocked)
        with run_lock(cfg.run_dir) if rank.main else contextlib.nullcontext():
            return _train(cfg, rank)
    finally:
        if cfg.distributed:
            distributed.shutdown()


def _train(cfg: TrainConfig, rank: Rank) -> dict[str, float] | None:
    import torch

    from robotrl import distributed
    from robotrl.logging import console
    from robotrl.seeding import seed_everything

    seed_everything(cfg.seed)  # every rank: the same initial parameters
    runner = build_runner(cfg)
    if not rank.main:  # then rank r's own stream, as a run seeded with it (its worlds too)
        seed_everything(rank.seed(cfg.seed))
        generator = getattr(runner.alg, "generator", None)
        if isinstance(generator, torch.Generator):  # drawn from the global RNG, as at build
            generator.manual_seed(int(torch.randint(2**31 - 1, ())))
    if cfg.resume:
        path = distributed.rank_path(cfg.resume)
        if not path.is_file():
            raise ValueError(f"resume: rank {rank.rank}'s checkpoint {path} is missing (a "
                             "data-parallel run resumes with the number of processes it had)")
        runner.load(path)
        if rank.main:
            console.print(f"resumed from {cfg.resume} at step {runner.global_step:,}")
    if not rank.main:
        return runner.train()
    save_config(cfg)
    where = (f"dataset {cfg.dataset}, {cfg.total_steps:,} updates" if cfg.dataset else
             f"{cfg.num_envs} worlds ({cfg.backend.name}), {cfg.total_steps:,} steps")
    if rank.world_size > 1:
        where += f" x {rank.world_size} ranks"
    console.print(f"[bold]robotrl train[/bold] {cfg.env.task} with {type(cfg.algo).__name__} "
                  f"on {where} -> {cfg.run_dir}")
    network_cost = getattr(runner.alg, "network_cost", None)
    if network_cost is not None:  # learners whose cost grows with depth (CRL) say what it is
        for name, c in network_cost().items():
            console.print(f"  {name}: {c['params'] / 1e6:.2f}M parameters; per update "
                          f"{c['flops'] / 1e9:.2f} GFLOP, {c['activation_bytes'] / 2**20:.1f} "
                          "MiB activations")
    result = runner.train()
    if result is not None:
        result = _record(cfg, runner, result)
    return result


def _tracking(cfg: TrainConfig, runner: Runner) -> dict[str, float]:
    """A velocity task's tracking report on the fixed command grid (``robotrl.runners.
    tracking``: ``lin_vel_rmse``, ``yaw_rate_rmse``, ``falls_per_minute``, ``mean_abs_torque``,
    ``off_feet_fraction``)
    for the run's final policy, on nominal worlds; empty for other tasks and backends."""
    import torch

    from robotrl.experiment.build import tracking_report, tracks_velocity
    from robotrl.seeding import derive_seed
    from robotrl.types import Obs, obs_to

    if not tracks_velocity(cfg):
        return {}
    device = torch.device(cfg.device)

    def policy(obs: Obs) -> torch.Tensor:
        return runner.alg.act_deterministic(obs_to(obs, device)).cpu()

    report = tracking_report(cfg, policy, derive_seed(cfg.seed, "eval-env"),
                             derive_seed(cfg.seed, "eval-reset"))
    return {k: report[k] for k in ("lin_vel_rmse", "yaw_rate_rmse", "falls_per_minute",
                                   "mean_abs_torque", "off_feet_fraction")}


def _record(cfg: TrainConfig, runner: Runner, result: dict[str, float],
            label: str = "") -> dict[str, float]:
    """Write a run's ``result.json`` and print its final evaluation (after ``label``, e.g. the
    seed of a seed batch); the result with ``best``."""
    from robotrl.logging import console

    result = {**result, **_tracking(cfg, runner), "best": runner.best_eval}
    write_json(Path(cfg.run_dir) / RESULT_FILE, {
        "step": runner.global_step, "total_steps": cfg.total_steps, "final": result,
        "train_seconds": runner.train_seconds, "evaluations": runner.evaluations,
        "machine": machine(cfg.device), "config": config_digest(cfg)}, indent=1)
    score = (f", normalized score {result['normalized_score']:.1f}"
             if "normalized_score" in result else "")
    # a group run (GRPO) reports its train and test initial states apart
    splits = ([("", " (train initial states)"), ("test_", " (test initial states)")]
              if "test_return_mean" in result else [("", "")])
    for p, where in splits:
        success = f", success {100 * result[p + 'success']:.0f}%" if p + "success" in result else ""
        if p + "final_distance" in result:  # goal-conditioned tasks
            reached = result[p + "time_to_goal"]
            success += (f", final goal distance {result[p + 'final_distance']:.3f}, "
                        + (f"time to goal {reached:.1f} steps" if reached == reached
                           else "goal never reached"))
        if "lin_vel_rmse" in result:  # velocity tasks
            success += (f", tracking RMSE {result['lin_vel_rmse']:.3f} m/s and "
                        f"{result['yaw_rate_rmse']:.3f} rad/s, "
                        f"{result['falls_per_minute']:.2f} falls/min, off its feet "
                        f"{result['off_feet_fraction']:.0%} of the time")
        console.print(f"{label}eval{where}: return {result[p + 'return_mean']:.1f} ± "
                      f"{result[p + 'return_std']:.1f}, length {result[p + 'length_mean']:.0f} "
                      f"over {result[p + 'episodes']} episodes{success}{score}")
    return result


def seed_configs(cfg: TrainConfig) -> list[TrainConfig]:
    """The ordinary runs a ``num_seeds`` config stands for: seeds ``seed .. seed + num_seeds -
    1``, each in ``run_dir/s<seed>`` with ``num_seeds=1`` (what it would be run alone)."""
    import copy
    import dataclasses

    return [dataclasses.replace(copy.deepcopy(cfg), seed=cfg.seed + i, num_seeds=1,
                                run_dir=str(Path(cfg.run_dir) / f"s{cfg.seed + i}"))
            for i in range(cfg.num_seeds)]


def _train_seeds(cfg: TrainConfig) -> dict[str, float] | None:
    """``num_seeds`` runs in one process: each built as it would be alone (seeded first), their
    learners batched by the algorithm's seed-batched learner, trained in lockstep. Returns the
    mean over the seeds that finished of each final-evaluation number (None if none did)."""
    from robotrl.checkpoint import run_lock
    from robotrl.logging import console
    from robotrl.registry import algorithm, resolve
    from robotrl.runners.seed_batch import SeedBatchRunner
    from robotrl.seeding import seed_everything

    cfgs = seed_configs(cfg)
    if cfg.logger.wandb and not cfg.logger.wandb_group:  # the seeds side by side in W&B
        for c in cfgs:
            c.logger.wandb_group = Path(cfg.run_dir).name
    with contextlib.ExitStack() as locks:
        for c in cfgs:
            locks.enter_context(run_lock(c.run_dir))
        runners = []
        for c in cfgs:
            seed_everything(c.seed)
            runners.append(build_runner(c))
        batch = resolve(algorithm(cfg.algo).seed_batch)([r.alg for r in runners])
        for c in cfgs:
            save_config(c)
        data = (f"dataset {cfg.dataset}, {cfg.total_steps:,} updates" if cfg.dataset else
                f"{cfg.num_envs} worlds each, {cfg.total_steps:,} steps")
        console.print(f"[bold]robotrl train[/bold] {cfg.env.task} with {type(cfg.algo).__name__}"
                      f" on {data}, seeds {cfgs[0].seed}..{cfgs[-1].seed} batched -> "
                      f"{cfg.run_dir}/s<seed>")
        results = SeedBatchRunner(runners, batch).train()
        done = [_record(c, r, res, f"seed {c.seed} ")
                for c, r, res in zip(cfgs, runners, results, strict=True) if res is not None]
    if not done:
        return None
    keys = [k for k, v in done[0].items() if isinstance(v, (int, float)) and v is not None]
    return {k: sum(d[k] for d in done) / len(done) for k in keys} | {"seeds": float(len(done))}


def save_config(cfg: TrainConfig) -> Path:
    """Write the resolved config to ``run_dir/config.yaml`` atomically."""
    from omegaconf import OmegaConf

    from robotrl.checkpoint import atomic_open

    path = Path(cfg.run_dir) / "config.yaml"
    with atomic_open(path, "w") as f:
        f.write(OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg))))
    return path


