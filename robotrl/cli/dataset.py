"""``robotrl dataset collect|info``: record offline datasets on the batched simulator.

    robotrl dataset collect task=hopper kind=random steps=100000 expert=runs/hopper/checkpoints/best.pt
    robotrl dataset collect kind=expert checkpoint=runs/hopper/checkpoints/best.pt steps=1000000
    robotrl dataset collect kind=medium checkpoint=runs/hopper_short/checkpoints/last.pt \\
        expert=runs/hopper/checkpoints/best.pt
    robotrl dataset collect kind=medium-replay checkpoint=runs/hopper_short/checkpoints/last.pt \\
        expert=runs/hopper/checkpoints/best.pt        # what that run saw until its checkpoint
    robotrl dataset collect kind=medium-expert checkpoint=MEDIUM.pt expert=EXPERT.pt
    robotrl dataset collect kind=medium-expert checkpoint=MEDIUM.pt expert=EXPERT.pt \
        backend=gymnasium id=gymnasium/hopper/medium-expert-v0   # Gymnasium's own Hopper-v5
    robotrl dataset collect task=tabletop kind=scripted steps=20000 noise=0.3   # demonstrations
    robotrl dataset collect task=tabletop kind=scripted options.templates=[reach] \
        options.image_size=16                         # task options (the card records them)
    robotrl dataset collect kind=medium recipe=d4rl checkpoint=runs/hopper_sac_short/checkpoints/last.pt \
        expert=runs/hopper_sac/checkpoints/last.pt   # D4RL's recipe: a SAC agent's sampled actions
    robotrl dataset info robotrl/hopper/expert-v0

``recipe`` (``robotrl.data.recipes``): ``mean-noise`` (default; the v0 suite) acts with the
checkpoint's mean action plus ``noise``; ``d4rl`` records as D4RL's and Minari's MuJoCo
datasets were: actions sampled from a SAC agent's stochastic policy, ``random`` the untrained
agent, ``medium-expert`` ``steps`` of each half, and D4RL's published reference scores where
D4RL has the task (the card's ``reference`` says which). The card records the recipe and the
behaviour return with its 95% interval.

Reference scores go in the card: ``ref_min_score`` is a uniform-random policy's mean return and
``ref_max_score`` the expert checkpoint's deterministic mean return, both measured here on
``eval_episodes`` worlds. ``kind=scripted`` records a task's scripted expert (tasks with one:
tabletop) with Gaussian action noise ``noise`` (for diverse demonstrations), every observation
group the task has (image and instruction tokens included) and the noise-free expert as
``ref_max_score``. ``options.KEY=VALUE`` sets a task option (``env.options`` of a run; values
are YAML) for ``kind=random`` and ``kind=scripted``; the kinds that act with a checkpoint use
its run's options. The card records them (``task_options``), and offline runs on the dataset
evaluate with them. ``backend`` (default ``mujoco``) is the simulator that records, references
included: ``gymnasium`` steps Gymnasium's own env of the task (``gymnasium.make_vec`` of its
Gymnasium id), the same policies acting; the card records it (``simulator``). ``medium-replay``
repeats a training run in that run's own simulator and takes no ``backend``. The dataset is written with Minari (``out`` is the datasets root,
default ``MINARI_DATASETS_PATH``) or, when ``out`` ends in ``.hdf5``, as a D4RL-style file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from robotrl.cli.args import parse_kv, split_options

KINDS: tuple[str, ...] = ("random", "medium", "expert", "medium-replay", "medium-expert",
                          "scripted")
"""Dataset kinds ``collect`` records."""

COLLECT_KEYS: dict[str, type] = {
    "task": str, "kind": str, "checkpoint": str, "expert": str, "steps": int, "num_envs": int,
    "seed": int, "noise": float, "out": str, "id": str, "eval_episodes": int, "progress": bool,
    "backend": str, "recipe": str,
}


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _checkpoint_policy(run: tuple[Any, dict[str, Any]], num_envs: int, seed: int,
                       backend: str = "mujoco", sampled: bool = False,
                       untrained: bool = False) -> tuple[Any, Any]:
    """(env, policy) of a trained run (``load_run``'s config and checkpoint), on nominal
    physics, simulated by ``backend``: its deterministic policy, or with ``sampled`` actions
    drawn from its stochastic policy (seeded by ``seed``); ``untrained``: the same learner
    freshly initialized (seeded), not the checkpoint's weights."""
    import dataclasses

    from robotrl.experiment.build import build_algo, build_env

    cfg, ckpt = run
    if backend != cfg.backend.name:
        cfg = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, name=backend))
    env = build_env(cfg, num_envs, seed, train=False)
    with torch.random.fork_rng(devices=[], enabled=untrained):  # untrained: a seeded init
        if untrained:
            torch.manual_seed(seed)
        algo = build_algo(cfg, env.spec, None if untrained else ckpt["algo"])
    if not sampled:
        return env, algo.act_deterministic
    generator = torch.Generator().manual_seed(seed)
    return env, lambda obs: algo.act_sampled(obs, generator)


def _behaviour(run: tuple[Any, dict[str, Any]], path: str) -> str | None:
    """Why ``path`` cannot be recipe=d4rl's behaviour policy, or None when it can."""
    from robotrl.registry import algorithm

    entry = algorithm(run[0].algo)
    if hasattr(entry.learner_class(), "act_sampled"):
        return None
    return (f"recipe=d4rl records a SAC agent's sampled actions; {path} was trained with "
            f"algo={entry.name}, which has no stochastic policy to sample (train the behaviour "
            "policy with algo=sac, or record with recipe=mean-noise)")


def _training_replay(path: str, card: Any, progress: bool) -> Any:
    """Everything the training run that wrote checkpoint ``path`` saw until that checkpoint
    (D4RL's medium-replay): the run is repeated from its config and seed, to the checkpoint's
    step, with its worlds recorded (exploration actions as applied, every world's episodes)."""
    import os
    import tempfile

    from robotrl.experiment.build import build_runner, load_run
    from robotrl.runners.collect import RecordTransitions
    from robotrl.seeding import seed_everything

    cfg, ckpt = load_run(path)
    cfg.total_steps, cfg.resume, cfg.eval_interval = int(ckpt["global_step"]), "", 0
    cfg.checkpoint_interval = 2**62
    cfg.logger.tensorboard, cfg.logger.progress = False, progress
    with tempfile.TemporaryDirectory() as tmp:
        cfg.run_dir = tmp
        torch.set_num_threads(cfg.torch_threads or os.cpu_count() or 1)
        seed_everything(cfg.seed)  # as run_training: the same run, step for step
        runner = build_runner(cfg)
        runner.evaluator = None
        stats = runner.collector.env  # episode statistics around the worlds
        recorder = RecordTransitions(stats.env, runner.collector.obs)
        stats.env = recorder
        runner.train()
    card.policy = f"training replay of {path} ({cfg.total_steps:,} steps)"
    return recorder.dataset(card)


def _scripted(env: Any, noise: float, seed: int) -> Any:
    """The task's scripted expert acting in ``env`` with Gaussian action noise ``noise``."""
    generator = torch.Generator().manual_seed(seed)
    return lambda obs: env.task.expert(env.sim, generator, noise)


def _interval(card: Any) -> str:
    """The card's behaviour return with its 95% interval, e.g. ``1043.2 [1020.1, 1066.3]``."""
    if card.policy_return_low is None or card.policy_return_high is None:
        return f"{card.policy_return:.1f}"
    return (f"{card.policy_return:.1f} [{card.policy_return_low:.1f}, "
            f"{card.policy_return_high:.1f}]")


def _mean_return(env: Any, policy: Any, seed: int) -> float:
    from robotrl.runners.evaluation import evaluate

    return float(evaluate(policy, env, seed=seed)["return_mean"])


def collect_main(argv: list[str]) -> None:
    from robotrl.data import DatasetCard, DatasetError, datasets_root, save_hdf5, save_minari
    from robotrl.data.dataset import Dataset
    from robotrl.data.recipes import D4RL_REFERENCE_SOURCE, RECIPES, published_reference
    from robotrl.envs import list_tasks, make
    from robotrl.envs.registry import task_class
    from robotrl.logging import console
    from robotrl.runners.collect import collect, uniform_policy
    from robotrl.seeding import derive_seed

    options, argv = split_options(argv)
    args = parse_kv(argv, COLLECT_KEYS)
    kind = str(args.get("kind", "random"))
    if kind not in KINDS:
        _fail(f"unknown kind {kind!r}; available: {list(KINDS)}")
    recipe = str(args.get("recipe", RECIPES[0]))
    if recipe not in RECIPES:
        _fail(f"unknown recipe {recipe!r}; available: {list(RECIPES)}")
    d4rl = recipe == "d4rl"
    if d4rl and "noise" in args:
        _fail("recipe=d4rl records the behaviour policy's own sampled actions, with no noise "
              "added; noise= belongs to recipe=mean-noise")
    if d4rl and kind == "scripted":
        _fail("recipe=d4rl records SAC agents; kind=scripted records a task's scripted expert "
              "(recipe=mean-noise)")
    steps, num_envs = int(args.get("steps", 1_000_000)), int(args.get("num_envs", 64))
    seed, episodes = int(args.get("seed", 0)), int(args.get("eval_episodes", 20))
    if steps < 1 or num_envs < 1 or episodes < 1:
        _fail("steps, num_envs and eval_episodes must be >= 1")
    checkpoint, expert = str(args.get("checkpoint", "")), str(args.get("expert", ""))
    if kind == "expert":
        expert = expert or checkpoint
        checkpoint = checkpoint or expert
    if kind not in ("random", "scripted") and not checkpoint:
        _fail(f"kind={kind} acts with a trained policy: give checkpoint=PATH")
    if d4rl and kind == "random" and not (checkpoint or expert):
        _fail("recipe=d4rl's random data is the behaviour learner untrained: give expert=PATH "
              "(its configuration builds the untrained agent, and it is the expert reference)")
    if kind == "medium-expert" and not expert:
        _fail("kind=medium-expert joins checkpoint= (medium) and expert= (expert) data")
    backend = str(args.get("backend", "mujoco"))
    if backend not in ("mujoco", "gymnasium"):
        _fail(f"backend={backend!r}: datasets are recorded on 'mujoco' or 'gymnasium'")
    if backend != "mujoco" and kind in ("medium-replay", "scripted"):
        _fail(f"kind={kind} records on the mujoco backend only (medium-replay repeats the "
              "training run in its own simulator; scripted experts are robotrl tasks')")
    task = str(args.get("task", ""))
    from robotrl.experiment.build import load_run

    runs = {path: load_run(path) for path in (checkpoint, expert) if path}  # read once
    for path, (cfg, _) in runs.items():
        if task and task != cfg.env.task:
            _fail(f"task={task} but {path} was trained on {cfg.env.task}")
        task = cfg.env.task
    if runs and options:
        _fail("options.* set the task options of kind=random and kind=scripted; the checkpoint "
              "kinds act in their run's env (its env.options)")
    if runs:
        options = dict(runs[checkpoint or expert][0].env.options)
    for path, run in runs.items() if d4rl else ():
        why = _behaviour(run, path)
        if why:
            _fail(why)
    if task not in list_tasks():
        _fail(f"unknown task {task!r}; available tasks: {list_tasks()}")
    noise = float(args.get("noise", 0.0 if kind == "random" or d4rl else 0.1))
    progress = bool(args.get("progress", True))
    dataset_id = str(args.get("id", f"robotrl/{task}/{kind}-v0"))
    ref_seed = derive_seed(seed, "eval-reset")
    out = str(args.get("out", ""))
    target = (Path(out) if out.endswith((".hdf5", ".h5"))
              else Path(out or datasets_root()) / dataset_id)
    if target.exists():  # before minutes of collection, not after
        _fail(f"{target} exists; pick another out= or id=, or remove it")

    # reference scores first: a failure here costs seconds, not a collection
    try:
        rand_env = make(task, episodes, backend=backend, seed=derive_seed(seed, "eval-env"),
                        **options)
    except (TypeError, ValueError) as err:
        _fail(f"task {task!r} options {options}: {err}")
    ref_min = _mean_return(rand_env, uniform_policy(rand_env, torch.Generator().manual_seed(seed)),
                           ref_seed)
    ref_max = None
    if expert:
        env, policy = _checkpoint_policy(runs[expert], episodes, derive_seed(seed, "eval-env"),
                                         backend)
        ref_max = _mean_return(env, policy, ref_seed)
    if kind == "scripted":
        if not hasattr(task_class(task), "expert"):
            _fail(f"task {task!r} has no scripted expert (tasks with one: tabletop)")
        ref_max = _mean_return(rand_env, _scripted(rand_env, 0.0, seed), ref_seed)
    console.print(f"reference returns: random {ref_min:.1f}, expert "
                  f"{'n/a (no expert=)' if ref_max is None else f'{ref_max:.1f}'}")
    if ref_max is None:
        console.print("[yellow]without expert= the card has no expert reference: runs on this "
                      "dataset get no normalized score and robotrl bench refuses it (metric "
                      "normalized_score)[/yellow]")

    reference = "measured here: a uniform-random policy, the expert's deterministic mean"
    published = published_reference(task) if d4rl else None
    if published is not None:
        ref_min, ref_max = published
        reference = f"{D4RL_REFERENCE_SOURCE} for {task}"
        console.print(f"normalized with D4RL's published references: random {ref_min:.1f}, "
                      f"expert {ref_max:.1f}")
    card = DatasetCard(task=task_class(task).gym_id, dataset_id=dataset_id, kind=kind,
                       ref_min_score=ref_min, ref_max_score=ref_max, simulator=backend,
                       recipe=recipe, reference=reference)
    try:  # a card the readers would refuse is refused before the collection, not after
        card.check_reference(f"task {task!r}")
    except DatasetError as err:
        _fail(f"{err}: the expert scores what a uniform-random policy does")
    parts = []
    if kind == "scripted":
        groups = ("policy", *rand_env.task.observation_groups())
        env = make(task, num_envs, seed=seed, observations=groups, **options)
        parts.append(collect(env, _scripted(env, noise, seed), steps,
                             DatasetCard(task=card.task, policy=f"scripted expert, noise {noise}"),
                             seed, 0.0, progress, groups))
    # medium-expert: D4RL's is 1M medium + 1M expert; mean-noise's halves make up steps
    medium, rest = (steps, steps) if d4rl else (steps // 2, steps - steps // 2)
    sources = {"random": [(checkpoint or expert if d4rl else "", steps)], "scripted": [],
               "medium": [(checkpoint, steps)], "expert": [(checkpoint, steps)],
               "medium-replay": [], "medium-expert": [(checkpoint, medium), (expert, rest)]}[kind]
    if kind == "medium-replay":
        parts.append(_training_replay(checkpoint, DatasetCard(task=card.task), progress))
        noise = 0.0  # the run's own exploration
    untrained = d4rl and kind == "random"
    for i, (path, n) in enumerate(sources):
        part_seed = seed + i  # a second source must not replay the first one's noise
        if path:
            env, policy = _checkpoint_policy(runs[path], num_envs, part_seed, backend,
                                             sampled=d4rl, untrained=untrained)
        else:
            env = make(task, num_envs, backend=backend, seed=part_seed, **options)
            policy = uniform_policy(env, torch.Generator().manual_seed(part_seed))
        acting = f"{path}, untrained" if untrained else (path or "uniform random")
        part_card = DatasetCard(task=card.task, policy=acting + (", sampled" if d4rl else ""))
        parts.append(collect(env, policy, n, part_card, part_seed, noise, progress))
    if len(parts) == 1:
        card.policy = parts[0].card.policy
        card.policy_return_low = parts[0].card.policy_return_low
        card.policy_return_high = parts[0].card.policy_return_high
    else:
        card.policy = " + ".join(f"{p.card.policy} (return {_interval(p.card)})" for p in parts)
    card.policy_return = sum(p.card.policy_return * len(p) for p in parts) / sum(map(len, parts))
    card.seed, card.action_noise = seed, noise
    card.observations = parts[0].card.observations
    card.task_options = options
    data = parts[0] if len(parts) == 1 else Dataset.concat(parts, card)
    data.card = card
    try:
        if out.endswith((".hdf5", ".h5")):
            where = save_hdf5(data, out)
        else:
            where = save_minari(data, dataset_id, out or None)
    except DatasetError as err:
        _fail(str(err))
    console.print(f"wrote {len(data):,} transitions, {data.num_episodes} episodes "
                  f"(policy return {_interval(card)}, normalized "
                  f"{card.normalized_score(card.policy_return):.1f}) to {where}")


def info_main(argv: list[str]) -> None:
    from robotrl.data import DatasetError, load_dataset

    if len(argv) != 1:
        _fail("usage: robotrl dataset info <Minari id | directory | file.hdf5>")
    try:
        data = load_dataset(argv[0])
    except DatasetError as err:
        _fail(str(err))
    returns = data.episode_returns()
    card = data.card
    print(f"{card.source}\n  task {card.task}, kind {card.kind or '-'}, policy {card.policy or '-'}"
          f", simulated by {card.simulator or '-'}")
    print(f"  {len(data):,} transitions, {data.num_episodes} episodes, obs {data.obs_dim}, "
          f"action {data.act_dim}; {int(data.terminations.sum())} terminations, "
          f"{int(data.truncations.sum())} truncations")
    print(f"  episode return {returns.mean():.1f} (min {returns.min():.1f}, max {returns.max():.1f})"
          f"; normalized {card.normalized_score(float(returns.mean())):.1f} "
          f"(ref min {card.ref_min_score}, max {card.ref_max_score}"
          f"{'; ' + card.reference if card.reference else ''})")
    if card.recipe or card.policy_return is not None:
        behaviour = "-" if card.policy_return is None else _interval(card)
        print(f"  recorded by recipe {card.recipe or '-'}; behaviour return {behaviour}")


def dataset_main(argv: list[str]) -> None:
    commands = {"collect": collect_main, "info": info_main}
    if not argv or argv[0] not in commands:
        _fail(f"usage: robotrl dataset {{{'|'.join(commands)}}} ...; see robotrl --help")
    commands[argv[0]](argv[1:])
