"""Composing a run's typed config: Hydra overrides checked against the dataclasses before Hydra
runs (a typo fails at once with the allowed keys), the composed mapping turned into
dataclasses, a resumed run's saved config merged with the command's changes, and a dataset's
card naming the task. Validated once, by ``robotrl.experiment.validate``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from robotrl.config import (
    BackendConfig,
    EnvConfig,
    LoggerConfig,
    RandomizationConfig,
    TrainConfig,
    from_dict,
    resolve_randomization,
)
from robotrl.registry import POLICIES, algo_config_class, algorithm, policy_config_class

RENAMED: dict[str, dict[str, str]] = {
    "num_steps": {"on_policy": "rollout_steps", "off_policy": "collect_steps",
                  "offline": "updates_per_iteration", "group": "horizon"},
}
"""Old algorithm keys -> runner kind -> the key that replaced them (``algo.num_steps`` meant a
rollout's length, env steps between update phases, updates per iteration or a round's horizon,
depending on the runner)."""
RENAMED_WHY = {"rollout_steps": "env steps per world in one rollout",
               "collect_steps": "env steps per world between update phases",
               "updates_per_iteration": "gradient updates per iteration",
               "horizon": "steps of a group round, 0: the episode limit"}

GROUPS = ("algo", "env", "policy", "backend", "logger", "randomization")


def _config_dir() -> Path:
    """The installed ``robotrl.configs`` folder."""
    import robotrl.configs

    return Path(robotrl.configs.__file__).parent


def group_options(group: str) -> list[str]:
    """Option names available for a config group (its YAML files; a file in a subfolder is
    ``folder/name``, as Hydra selects it: ``env=dmc/walker-run``)."""
    root = _config_dir() / group
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))


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
            if parts[0] == "env" and parts[1] in ("options", "train_options"):
                continue  # task options are checked by the task's own config
            allowed = nested[parts[0]]
        else:
            raise ConfigError(f"{parts[0]!r} is a plain value, not a group: use {parts[0]}=VALUE")
        if parts[0] == "randomization" and len(parts) == 3 and parts[1] in allowed:
            from robotrl.config import Range

            if parts[2] in _fields(Range):
                continue  # randomization.body_mass.low=0.5
            raise ConfigError(f"unknown config key {key!r}; allowed keys of a range: "
                              f"{_fields(Range)}")
        if parts[0] == "algo" and parts[1] in RENAMED and parts[1] not in allowed:
            new = RENAMED[parts[1]].get(algorithm(algo).runner)
            raise ConfigError(f"algo.{parts[1]} was renamed: algo={algo} calls it "
                              f"algo.{new} ({RENAMED_WHY[new]})")
        if parts[1] not in allowed or len(parts) > 2:
            raise ConfigError(f"unknown config key {key!r}; allowed keys in {parts[0]}: {allowed}")


def hydra_overrides(overrides: list[str]) -> list[str]:
    """Overrides as Hydra should see them: validated keys become ``++key=value``.

    The dataclasses, not the YAML, define which keys exist, so a field the YAML leaves at its
    default (``algo.rollout_steps``, ``env.options.<task option>``) is added rather than rejected.
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
    the algorithm, task or backend name; randomization's every field (a preset name or a few
    fields resolved); the value itself otherwise (num_envs)."""
    if isinstance(value, dict) and key in ("algo", "backend"):
        return value.get("name")
    if isinstance(value, dict) and key == "env":
        return value.get("task")
    if key == "randomization" and isinstance(value, (dict, str)):
        # the checkpoint saves every field resolved; a preset plus dotted overrides gives a few
        try:
            return dataclasses.asdict(resolve_randomization(value))
        except (TypeError, ValueError):
            return value
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
    # the default run_dir (configs/train.yaml: runs/${env.task}/...) was interpolated with the
    # default task before the card was read: name the dataset's
    default_dir = f"runs/{cfg.env.task}/"
    if (not any(o.split("=", 1)[0].lstrip("+") == "run_dir" for o in overrides)
            and cfg.run_dir.startswith(default_dir)):
        cfg.run_dir = f"runs/{task}/" + cfg.run_dir[len(default_dir):]
    cfg.env.task = task
    # the task options the data was recorded with, unless the command sets them itself
    cfg.env.options = {**card.task_options, **cfg.env.options}


def compose(overrides: list[str]) -> TrainConfig:
    """The typed config ``robotrl train OVERRIDES`` runs with: overrides checked, Hydra's
    composition of ``configs/train.yaml`` (``configs/tuned/`` files included), a resume's saved
    config merged and a dataset's task read from its card; not yet validated."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    check_overrides(overrides)
    if GlobalHydra.instance().is_initialized():  # inside a job of robotrl's own Hydra apps
        composed = hydra_compose(config_name="train", overrides=hydra_overrides(overrides))
    else:
        with initialize_config_module(config_module="robotrl.configs", version_base="1.3"):
            composed = hydra_compose(config_name="train", overrides=hydra_overrides(overrides))
    return resolve_config(OmegaConf.to_container(composed, resolve=True), overrides)


def validate(cfg: TrainConfig) -> None:
    """Every value check of a run, before anything is built: ``robotrl.config.validate`` (what
    the config alone decides) and the backend and task lists of ``robotrl.envs``."""
    from robotrl.config import validate as validate_values
    from robotrl.envs import list_tasks
    from robotrl.envs.registry import BACKEND_TABLE, check_options

    if cfg.backend.name not in BACKEND_TABLE:
        raise ValueError(f"unknown backend {cfg.backend.name!r}; available: {list(BACKEND_TABLE)}")
    if cfg.backend.name == "mujoco" and cfg.env.task not in list_tasks():
        raise ValueError(f"unknown task {cfg.env.task!r}; available tasks: {list_tasks()}")
    validate_values(cfg)
    if getattr(cfg.algo, "precision", "float32") == "bf16":  # this machine's CPU can run it
        import torch

        from robotrl.nn.linear import check_precision

        check_precision(torch.device(cfg.device), "bf16")
    if cfg.env.options or cfg.env.train_options:  # their names, before a run directory exists
        check_options(cfg.env.task, cfg.backend.name,
                      **{**cfg.env.options, **cfg.env.train_options})
    if cfg.env.train_options:
        entry = algorithm(cfg.algo)
        if entry.offline:
            raise ConfigError(f"env.train_options sets the training worlds; algo={entry.name} "
                              f"learns from a dataset and has none (use env.options)")
    if cfg.logger.wandb:  # a missing extra found before the run directory is touched
        from robotrl.logging import import_wandb

        try:
            import_wandb()
        except ImportError as err:
            raise ConfigError(str(err)) from None
