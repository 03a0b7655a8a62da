"""``robotrl train``: Hydra composes ``configs/train.yaml``; we validate and run.

Overrides are checked against the typed config before Hydra runs, so a typo fails at once with
the allowed keys; values are type-checked when the composed config becomes dataclasses.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robotrl.config import (
    BackendConfig,
    EnvConfig,
    LoggerConfig,
    RandomizationConfig,
    TrainConfig,
    from_dict,
    to_dict,
    validate,
)
from robotrl.registry import POLICIES, algo_config_class, policy_config_class

if TYPE_CHECKING:
    from robotrl.distributed import Rank

GROUPS = ("algo", "env", "policy", "backend", "logger", "randomization")


def _config_dir() -> Path:
    """The installed ``robotrl.configs`` folder."""
    import robotrl.configs

    return Path(robotrl.configs.__file__).parent


def group_options(group: str) -> list[str]:
    """Option names available for a config group (its YAML files)."""
    return sorted(p.stem for p in (_config_dir() / group).glob("*.yaml"))


class ConfigError(ValueError):
    """A bad key or value in the run configuration."""


def _fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def check_overrides(overrides: list[str]) -> None:
    """Reject unknown keys and group options before Hydra composes anything."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    chosen = {"algo": "ppo", "policy": "mlp"}
    for o in parsed:
        if o.key_or_group in chosen and not o.is_sweep_override():
            chosen[o.key_or_group] = str(o.value())
    algo = chosen["algo"]
    top = _fields(TrainConfig)
    nested = {"env": _fields(EnvConfig), "backend": _fields(BackendConfig),
              "logger": _fields(LoggerConfig), "randomization": _fields(RandomizationConfig)}
    for o in parsed:
        key = o.key_or_group
        if key.startswith("hydra") or o.is_delete():
            continue
        parts = key.split(".")
        if parts[0] not in top:
            raise ConfigError(f"unknown config key {key!r}; allowed top-level keys: {top}")
        if len(parts) == 1:
            if parts[0] in GROUPS:
                values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [
                    str(o.value())]
                options = group_options(parts[0])
                for v in values:
                    if v not in options:
                        raise ConfigError(f"unknown {parts[0]} {v!r}; available: {options}")
            continue
        if parts[0] == "algo":
            allowed = _fields(algo_config_class(algo))
        elif parts[0] == "policy":
            if chosen["policy"] not in POLICIES:
                raise ConfigError(f"unknown policy {chosen['policy']!r}; available: "
                                  f"{list(POLICIES)}")
            allowed = _fields(policy_config_class(chosen["policy"]))
        elif parts[0] in nested:
            if parts[0] == "env" and parts[1] == "options":
                continue  # task options are checked by the task's own config
            allowed = nested[parts[0]]
        else:
            raise ConfigError(f"{parts[0]!r} is a plain value, not a group: use {parts[0]}=VALUE")
        if parts[0] == "randomization" and len(parts) == 3 and parts[1] in allowed:
            from robotrl.envs.randomization import Range

            if parts[2] in _fields(Range):
                continue  # randomization.body_mass.low=0.5
            raise ConfigError(f"unknown config key {key!r}; allowed keys of a range: "
                              f"{_fields(Range)}")
        if parts[1] not in allowed or len(parts) > 2:
            raise ConfigError(f"unknown config key {key!r}; allowed keys in {parts[0]}: {allowed}")


def hydra_overrides(overrides: list[str]) -> list[str]:
    """Overrides as Hydra should see them: validated keys become ``++key=value``.

    The dataclasses, not the YAML, define which keys exist, so a field the YAML leaves at its
    default (``algo.num_steps``, ``env.options.<task option>``) is added rather than rejected.
    """
    out = []
    for o in overrides:
        key = o.split("=", 1)[0]
        if "=" not in o or key.startswith(("+", "~", "hydra")) or key in GROUPS:
            out.append(o)
        else:
            out.append("++" + o)
    return out


FIXED_ON_RESUME = ("algo", "env", "backend", "randomization", "num_envs", "dataset")
"""Keys a resumed run cannot change: the checkpoint's weights, optimizer, world and randomizer
state are shaped by them. Repeating their saved value is accepted."""


def _identity(key: str, value: Any) -> Any:
    """What an override of ``key`` selects, comparable between a composed and a saved config:
    the algorithm, task or backend name; the value itself otherwise (randomization's mapping,
    num_envs)."""
    if isinstance(value, dict) and key in ("algo", "backend"):
        return value.get("name")
    if isinstance(value, dict) and key == "env":
        return value.get("task")
    return value


def resolve_config(composed: dict[str, Any], overrides: list[str]) -> TrainConfig:
    """Typed config for the run; with ``resume`` the checkpoint's config plus explicit overrides.

    ``composed`` is what the command line means on its own; when resuming, an override of a
    ``FIXED_ON_RESUME`` key must select what the checkpoint has (so the original command with
    ``resume=`` added is accepted), any other value is refused naming the old and new value.
    """
    resume = composed.get("resume") or ""
    if not resume:
        cfg = from_dict(TrainConfig, composed)
        task_from_dataset(cfg, overrides)
        return cfg
    from omegaconf import OmegaConf

    from robotrl.checkpoint import load_checkpoint, resolve_path

    saved = load_checkpoint(resume, required=("config",))["config"]
    check_saved_config(saved, resume)
    explicit = [o for o in overrides if not o.startswith(("resume=", "hydra", "-"))]
    changes, groups = [], {}
    for o in explicit:
        key = o.split("=", 1)[0].lstrip("+")
        if key not in FIXED_ON_RESUME:
            if key in GROUPS:  # logger=none: the option's composed contents
                groups[key] = composed[key]
            else:
                changes.append(o)
            continue
        old, new = _identity(key, saved.get(key)), _identity(key, composed.get(key))
        if old != new:
            raise ConfigError(f"cannot change {key!r} when resuming: the checkpoint has "
                              f"{key}={old!r}, the command asks for {key}={new!r}")
    merged = OmegaConf.merge(OmegaConf.create(saved), OmegaConf.from_dotlist(changes))
    data = {**OmegaConf.to_container(merged, resolve=True), **groups}
    data["resume"] = resume
    if not any(o.split("=", 1)[0].lstrip("+") == "run_dir" for o in explicit):
        # the run continues where its checkpoint lies, never where the file says it was
        path = resolve_path(resume)
        if path.parent.name != "checkpoints":
            raise ConfigError(f"resume={resume} is not inside a run's checkpoints/ folder: give "
                              "run_dir=DIR for the resumed run")
        data["run_dir"] = str(path.parent.parent)
    return from_dict(TrainConfig, data)


def check_saved_config(saved: Any, resume: str) -> None:
    """A checkpoint's config is a mapping of plain values, already resolved: an OmegaConf
    interpolation (``${...}``) in it would read environment variables or blow up on merging."""
    from robotrl.checkpoint import CheckpointError

    def strings(value: Any) -> Any:
        if isinstance(value, dict):
            for k, v in value.items():
                yield from strings(k)
                yield from strings(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                yield from strings(v)
        elif isinstance(value, str):
            yield value

    if not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint {resume!r} holds a config that is not a mapping")
    if any("${" in text for text in strings(saved)):
        raise CheckpointError(f"checkpoint {resume!r} holds an interpolation (${{...}}) in its "
                              "config; robotrl writes resolved configs only")


def task_from_dataset(cfg: TrainConfig, overrides: list[str]) -> None:
    """Set ``cfg.env.task`` from the card of ``cfg.dataset`` (its Gymnasium id mapped to the
    built-in task that reproduces it) and the task options it was recorded with under those
    the command gives; an explicit ``env=`` that disagrees is refused."""
    if not cfg.dataset:
        return
    from robotrl.data import load_card
    from robotrl.envs import list_tasks
    from robotrl.envs.registry import task_class

    card = load_card(cfg.dataset)
    explicit = any(o.split("=", 1)[0].lstrip("+") in ("env", "env.task") for o in overrides)
    if not card.task:
        if explicit:
            return
        raise ConfigError(f"dataset {cfg.dataset} does not say which task it was recorded on; "
                          f"give env=<task> ({list_tasks()})")
    task = next((t for t in list_tasks() if task_class(t).gym_id == card.task), card.task)
    if explicit and cfg.env.task != task:
        raise ConfigError(f"env={cfg.env.task} but dataset {cfg.dataset} was recorded on "
                          f"{card.task} (task {task}); drop env= or pick another dataset")
    cfg.env.task = task
    # the task options the data was recorded with, unless the command sets them itself
    cfg.env.options = {**card.task_options, **cfg.env.options}


def save_config(cfg: TrainConfig) -> Path:
    """Write the resolved config to ``run_dir/config.yaml`` atomically."""
    from omegaconf import OmegaConf

    from robotrl.checkpoint import atomic_open

    path = Path(cfg.run_dir) / "config.yaml"
    with atomic_open(path, "w") as f:
        f.write(OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg))))
    return path


def run_training(cfg: TrainConfig) -> dict[str, float] | None:
    """Validate, build, (resume,) train, evaluate; return the final evaluation (None on the
    ranks other than 0 of a data-parallel run)."""
    import torch

    from robotrl import distributed
    from robotrl.checkpoint import run_lock

    validate(cfg)
    torch.set_num_threads(cfg.torch_threads or os.cpu_count() or 1)
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
    from robotrl.cli.build import build_runner
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
        result = {**result, "best": runner.best_eval}  # what a sweep's table shows beside it
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
            console.print(f"eval{where}: return {result[p + 'return_mean']:.1f} ± "
                          f"{result[p + 'return_std']:.1f}, length {result[p + 'length_mean']:.0f} "
                          f"over {result[p + 'episodes']} episodes{success}{score}")
    return result


def train_main(argv: list[str]) -> None:
    """Entry point: validate overrides, then hand over to Hydra."""
    import hydra
    from omegaconf import DictConfig, OmegaConf

    overrides = [a for a in argv if not a.startswith("-")]
    try:
        check_overrides(overrides)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        raise SystemExit(2) from None

    def refuse(kind: str, err: Exception, run_dir: str) -> None:
        """Exit 2 naming the problem; the run directory Hydra made for it goes if empty."""
        from robotrl.checkpoint import remove_if_empty

        print(f"{kind} error: {err}", file=sys.stderr)
        if run_dir:
            remove_if_empty(run_dir)
        raise SystemExit(2) from None

    @hydra.main(config_path="pkg://robotrl.configs", config_name="train", version_base="1.3")
    def _hydra_entry(dcfg: DictConfig) -> float:
        """One run; returns the sweep objective (``robotrl.cli.sweep.objective``)."""
        from robotrl.checkpoint import CheckpointError, RunLocked
        from robotrl.cli.sweep import objective, record_job
        from robotrl.data import DatasetError
        from robotrl.video import VideoUnavailable

        composed = OmegaConf.to_container(dcfg, resolve=True)
        try:
            cfg = resolve_config(composed, overrides)
            validate(cfg)
        except CheckpointError as err:  # resume= names a missing, corrupt or foreign file
            refuse("checkpoint", err, str(composed.get("run_dir", "")))
        except (ConfigError, ValueError, TypeError) as err:
            refuse("config", err, str(composed.get("run_dir", "")))
        try:
            result = run_training(cfg)
        except DatasetError as err:  # found when the data is read: nothing written yet
            refuse("dataset", err, cfg.run_dir)
        except RunLocked as err:  # the directory is another run's: touch nothing there
            print(f"run error: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        except CheckpointError as err:  # unreadable resume=, or unwritable (disk full)
            refuse("checkpoint", err, cfg.run_dir)
        except VideoUnavailable as err:  # logger.video=true where videos cannot be made
            refuse("video", err, cfg.run_dir)
        if result is not None or not cfg.distributed:  # data-parallel: rank 0 speaks for it
            record_job(cfg.run_dir, result)
        return objective(result)

    flags = [a for a in argv if a.startswith("-")]
    sys.argv = ["robotrl train", *flags, *hydra_overrides(overrides)]
    _hydra_entry()
