"""Explicit builders from the typed config: the only place concrete classes are chosen."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from robotrl import distributed
from robotrl.checkpoint import CheckpointError, load_checkpoint, restoring
from robotrl.config import RandomizationConfig, TrainConfig, from_dict, to_dict
from robotrl.envs import BatchedEnv, EnvSpec, make
from robotrl.experiment.compose import ConfigError
from robotrl.logging import WandbSettings
from robotrl.registry import algorithm, learner_class, policy_name
from robotrl.runners.base import Runner, RunnerSettings
from robotrl.seeding import derive_seed
from robotrl.types import BuildContext, Learner


def build_env(cfg: TrainConfig, num_envs: int, seed: int, train: bool = True,
              randomization: RandomizationConfig | str | None = None) -> BatchedEnv:
    """The simulator for ``cfg`` (the runner adds episode statistics to training envs), with
    the observation groups the learner reads.

    Training envs use ``cfg.randomization`` and ``cfg.env.train_options`` over the task
    options; evaluation envs (``train=False``) the task options and the nominal physics unless
    ``randomization`` (a preset name or config) is given.
    """
    learner = algorithm(cfg.algo).learner_class()
    observations = learner.observations(cfg.algo)
    token_policy = policy_name(cfg.policy) != "mlp"
    if token_policy:
        from robotrl.vla import TokenPolicy

        # and the privileged groups a token learner's auxiliary losses read (never the policy)
        extra = getattr(learner, "token_observations", None)
        observations = (*TokenPolicy.observations, *(extra(cfg.algo) if extra else ()))
    kwargs = {**cfg.env.options, **(cfg.env.train_options if train else {})}
    if cfg.backend.name == "mujoco":
        kwargs["num_threads"] = cfg.backend.num_threads
    dr = cfg.randomization if train else randomization
    if dr is not None:  # backends without randomization refuse an enabled one, naming it
        kwargs["randomization"] = dr
    if observations != ("policy",):  # backends without the groups refuse them, naming theirs
        kwargs["observations"] = observations
    # the JAX backends simulate on the learner's device (zero-copy); the others on the CPU
    device = cfg.device if cfg.backend.name in ("mjx", "brax") else "cpu"
    try:
        env = make(cfg.env.task, num_envs, backend=cfg.backend.name, device=device, seed=seed,
                   **kwargs)
    except ValueError as err:  # the config's: a group the task lacks, a bad option (exit 2)
        raise ConfigError(str(err)) from None
    if token_policy and cfg.policy.chunk > 1:
        from robotrl.envs.wrappers import ActionChunks

        env = ActionChunks(env, cfg.policy.chunk)
    stack = getattr(learner, "frame_stack", None)  # pixel learners: the last k images
    if stack is not None and stack(cfg.algo) > 1:
        from robotrl.envs.wrappers import FrameStack

        env = FrameStack(env, stack(cfg.algo))
    return env


def build_algo(cfg: TrainConfig, spec: EnvSpec, state: dict[str, Any] | None = None) -> Learner:
    """The learner for ``cfg.algo`` (its registry entry's ``build``), sized for ``spec`` and
    ``cfg.num_envs`` training worlds; with ``state`` (a checkpoint's ``"algo"`` entry) it
    carries the trained weights."""
    token_policy = policy_name(cfg.policy) != "mlp"
    entry = algorithm(cfg.algo)
    cls = entry.learner_class()
    if token_policy and not getattr(cls, "token_policies", False):
        from robotrl.registry import ALGORITHMS

        able = [n for n in ALGORITHMS if getattr(learner_class(n), "token_policies", False)]
        raise ValueError(f"algo={entry.name} trains MLP networks only; "
                         f"policy={policy_name(cfg.policy)} is trained by {able}")
    rank = distributed.current()
    ctx = BuildContext(device=torch.device(cfg.device), num_envs=cfg.num_envs, rank=rank.rank,
                       world_size=rank.world_size, policy=cfg.policy if token_policy else None)
    alg = cls.build(spec, cfg.algo, ctx)
    if state is not None:
        with restoring("the checkpoint's learner state"):
            alg.load_state_dict(state)
    return alg


def load_run(checkpoint: str, device: str = "cpu") -> tuple[TrainConfig, dict[str, Any]]:
    """(run config with ``device`` set, checkpoint contents) of a trained run, for the commands
    that use a checkpoint's policy; a missing or corrupt file raises ``CheckpointError``."""
    ckpt = load_checkpoint(checkpoint, required=("config", "algo"))  # the CLI: exit 2
    try:
        cfg = from_dict(TrainConfig, ckpt["config"])
    except (TypeError, ValueError, OverflowError) as err:
        raise CheckpointError(f"checkpoint {checkpoint!r} holds an invalid config: {err}"
                              ) from None
    cfg.device = device
    return cfg, ckpt


@dataclasses.dataclass
class TrainedRun:
    """A trained run's learner on fresh evaluation worlds, seeded as a run seeded ``seeds["root"]``
    seeds its evaluations (the ``eval-env`` and ``eval-reset`` streams)."""

    cfg: TrainConfig
    env: BatchedEnv
    alg: Learner
    seeds: dict[str, int]

    def reset(self) -> Any:
        """The worlds' first observations, from the ``eval-reset`` stream."""
        return self.env.reset(seed=self.seeds["eval-reset"])


def load_trained(checkpoint: str, num_envs: int, seed: int | None = None, device: str = "cpu",
                 options: dict[str, Any] | None = None) -> TrainedRun:
    """The run checkpointed at ``checkpoint`` with its weights, on ``num_envs`` nominal-physics
    worlds seeded from ``seed`` (the run's own seed without it); ``options`` change task
    options for these worlds. A missing or corrupt file raises ``CheckpointError``, options
    the task refuses ``ValueError``."""
    cfg, ckpt = load_run(checkpoint, device)
    root = cfg.seed if seed is None else seed
    seeds = {"root": root, **{name: derive_seed(root, name) for name in ("eval-env", "eval-reset")}}
    if options:
        cfg.env.options = {**cfg.env.options, **options}
    try:
        env = build_env(cfg, num_envs, seeds["eval-env"], train=False)
    except TypeError as err:  # an option the task's constructor does not take
        raise ValueError(str(err)) from None
    return TrainedRun(cfg, env, build_algo(cfg, env.spec, ckpt["algo"]), seeds)


def init_from(alg: Learner, cfg: TrainConfig, spec: EnvSpec) -> None:
    """Start ``alg`` from the actor of the run checkpointed at ``cfg.init`` (its algorithm's
    ``export_actor``), for learners with ``init_from_actor`` (GRPO)."""
    if not hasattr(alg, "init_from_actor"):
        from robotrl.registry import ALGORITHMS

        able = [n for n in ALGORITHMS if hasattr(learner_class(n), "init_from_actor")]
        raise ValueError(f"algo={algorithm(cfg.algo).name} cannot start from init=; algorithms "
                         f"that can: {able}")
    src_cfg, ckpt = load_run(cfg.init, cfg.device)
    if src_cfg.env.task != cfg.env.task:
        raise ValueError(f"init={cfg.init} was trained on {src_cfg.env.task!r}, this run is "
                         f"on {cfg.env.task!r}")
    src = build_algo(src_cfg, spec, ckpt["algo"])
    if policy_name(src_cfg.policy) != "mlp":
        alg.init_from_policy(src.policy)
    else:
        alg.init_from_actor(src.export_actor())


def build_runner(cfg: TrainConfig) -> Runner:
    """Env (or dataset) + algorithm + the runner of the kind its registry entry names.

    Runners whose ``learns_from`` is ``"dataset"`` (offline) get the dataset ``cfg.dataset``
    names, checked against the task's observation and action sizes, instead of training worlds.
    """
    runner_cls = algorithm(cfg.algo).runner_class()
    eval_envs: list[BatchedEnv] = []

    def make_eval_env() -> BatchedEnv:
        """The evaluation worlds, made on first use (the offline runner needs their spec)."""
        if not eval_envs:
            eval_envs.append(build_env(cfg, cfg.eval_episodes, derive_seed(cfg.seed, "eval-env"),
                                       train=False))
        return eval_envs[0]

    if runner_cls.learns_from == "dataset":
        from robotrl.data import load_dataset

        spec = make_eval_env().spec
        source: Any = load_dataset(cfg.dataset, cfg.device)
        if policy_name(cfg.policy) == "mlp":  # a token learner checks its groups at attach
            source.check_spec(spec.obs_dim, spec.action_dim, cfg.env.task)
        alg = build_algo(cfg, spec)
    else:  # each rank of a data-parallel run its own worlds (rank 0: the run seed)
        source = build_env(cfg, cfg.num_envs, distributed.current().seed(cfg.seed))
        if cfg.env.train_options:  # the policy trained on them is evaluated on the task's
            spec = make_eval_env().spec
            for what in ("observations", "action_dim"):
                if getattr(source.spec, what) != getattr(spec, what):
                    raise ConfigError(
                        f"env.train_options={cfg.env.train_options} change the {what} of the "
                        f"training worlds ({getattr(source.spec, what)}, the evaluation worlds "
                        f"{getattr(spec, what)}); set options that change it in env.options")
        alg = build_algo(cfg, source.spec)
    if cfg.init and not cfg.resume:  # a resumed run's checkpoint has the weights already
        init_from(alg, cfg, source.spec if runner_cls.learns_from == "env" else spec)

    settings = RunnerSettings(
        total_steps=cfg.total_steps,
        steps_per_env=getattr(cfg.algo, runner_cls.iteration_key),
        run_dir=Path(cfg.run_dir),
        max_minutes=cfg.max_minutes,
        checkpoint_interval=cfg.checkpoint_interval,
        eval_interval=cfg.eval_interval,
        log_interval=cfg.logger.log_interval,
        progress=cfg.logger.progress,
        tensorboard=cfg.logger.tensorboard,
        wandb=WandbSettings(
            project=cfg.logger.wandb_project, entity=cfg.logger.wandb_entity,
            group=cfg.logger.wandb_group, tags=list(cfg.logger.wandb_tags),
            artifacts=cfg.logger.wandb_artifacts) if cfg.logger.wandb else None,
        seed=cfg.seed,
        video=cfg.logger.video,
    )
    if cfg.logger.video and distributed.current().main:  # no GL or ffmpeg: found now, not late
        from robotrl.video import TRAIN_SIZE, check_video

        check_video(make_eval_env(), TRAIN_SIZE, cfg.backend.name)
    extra: dict[str, Any] = {}
    heldout = heldout_options(cfg)
    if heldout and runner_cls.heldout_states:
        held_cfg = dataclasses.replace(cfg, env=dataclasses.replace(
            cfg.env, options={**cfg.env.options, **heldout}))
        extra["make_heldout_env"] = lambda: build_env(
            held_cfg, cfg.num_envs, derive_seed(cfg.seed, "eval-env"), train=False)
    return runner_cls(source, alg, settings, torch.device(cfg.device), make_eval_env,
                      config=to_dict(cfg), **extra)


def heldout_options(cfg: TrainConfig) -> dict[str, Any]:
    """The options under which ``cfg``'s task draws held-out compositions (``MujocoTask.
    heldout_options``); empty for tasks without them and for Gymnasium ids."""
    from robotrl.envs import list_tasks
    from robotrl.envs.registry import task_class

    if cfg.env.task not in list_tasks():
        return {}
    return dict(task_class(cfg.env.task).heldout_options)


def tracks_velocity(cfg: TrainConfig) -> bool:
    """Whether ``cfg`` trains a velocity task on the native backend (``go1_velocity``...), whose
    evaluations add the tracking report of ``robotrl.runners.tracking``."""
    from robotrl.envs import list_tasks
    from robotrl.envs.registry import config_fields

    return (cfg.backend.name == "mujoco" and cfg.env.task in list_tasks()
            and "command_grid" in config_fields(cfg.env.task))


def tracking_report(cfg: TrainConfig, policy: Any, seed: int, reset_seed: int,
                    randomization: RandomizationConfig | None = None,
                    seconds: float = 10.0) -> dict[str, Any]:
    """``robotrl.runners.tracking.velocity_tracking`` of ``policy`` (observation -> action) on
    fresh evaluation worlds of ``cfg``'s velocity task, one per command of ``COMMAND_GRID``,
    seeded ``seed`` and reset from ``reset_seed``, with nominal physics or ``randomization``."""
    import copy

    from robotrl.runners.tracking import COMMAND_GRID, velocity_tracking

    grid_cfg = copy.deepcopy(cfg)
    grid_cfg.env.options = {**cfg.env.options, "command_grid": COMMAND_GRID}
    env = build_env(grid_cfg, len(COMMAND_GRID), seed, train=False, randomization=randomization)
    try:
        return velocity_tracking(env, env.reset(seed=reset_seed), policy, seconds)
    finally:
        env.close()
