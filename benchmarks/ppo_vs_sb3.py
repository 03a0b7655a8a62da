"""Our PPO next to Stable-Baselines3's: end-to-end throughput, and return per wall-clock minute.

    python benchmarks/ppo_vs_sb3.py --mode throughput                 # HalfCheetah, 200k steps each
    python benchmarks/ppo_vs_sb3.py --mode throughput --steps 4096    # smoke test
    python benchmarks/ppo_vs_sb3.py --mode wallclock                  # halfcheetah hopper: ours 5 min, SB3 10 min
    python benchmarks/ppo_vs_sb3.py --mode wallclock --long           # + a 15-minute HalfCheetah run of ours
    python benchmarks/ppo_vs_sb3.py --mode wallclock --tasks hopper --ours-minutes 0.1 --sb3-minutes 0.1
    python benchmarks/plot_curves.py --runs benchmarks/results --out benchmarks/results/curves.png

* ``throughput``: the same task, env steps, networks and PPO hyperparameters (ours' config
  mapped onto SB3's ``PPO``, with ``VecNormalize`` for ours' observation and reward
  normalization); env-steps/s over the whole ``learn``/``train`` call, the final deterministic
  evaluation and the mean return of the last training episodes of each.
* ``wallclock``: ours from the Hydra configs (``configs/tuned/`` applies) for ``--ours-minutes``,
  SB3 with the rl-baselines3-zoo hyperparameters for ``--sb3-minutes``; both evaluated every
  ``--eval-every`` seconds of training time (evaluation time is not charged to the budget) and
  logged to TensorBoard under ``--out`` for ``plot_curves.py``.

Contestants run one after the other, never side by side. Why each choice was made is in
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mujoco
import stable_baselines3
import torch

# the sibling benchmark script (this folder is on sys.path when run as a script)
from env_throughput import CORES, cpu_name, warn_if_loaded  # noqa: E402
from rich.console import Console
from rich.table import Table
from stable_baselines3 import PPO as SB3PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize
from torch import nn
from torch.utils.tensorboard import SummaryWriter

import robotrl.envs
from robotrl.algos.ppo import PPOConfig
from robotrl.cli.build import build_env, build_runner
from robotrl.cli.train import check_overrides, hydra_overrides, resolve_config, save_config
from robotrl.config import TrainConfig, from_dict, to_dict, validate
from robotrl.envs.registry import task_class
from robotrl.nn.mlp import ACTIVATIONS
from robotrl.runners.evaluation import PolicyFn, evaluate
from robotrl.seeding import seed_everything

TARGET_SPEEDUP = 5.0
"""Throughput target: ours / SB3 end-to-end env-steps/s."""
TARGET_HC_5MIN, TARGET_HC_LONG = 5400.0, 6500.0
"""HalfCheetah evaluation returns ours must reach within 5 minutes, and within the long run."""
TIME_MARKS = (0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 15.0)
"""Minutes at which the best evaluation so far is reported."""
EVAL_ENV_SEED, EVAL_RESET_SEED = 7919, 1_000_003
"""Offsets from --seed of the evaluation worlds and their resets (those of OnPolicyRunner)."""

# rl-baselines3-zoo hyperparams/ppo.yml (the -v4 entries, the zoo's newest MuJoCo ones);
# normalize=True there means VecNormalize(gamma=gamma) on obs and reward.
ZOO: dict[str, dict[str, Any]] = {
    "halfcheetah": dict(
        n_envs=1, batch_size=64, n_steps=512, gamma=0.98, learning_rate=2.0633e-05,
        ent_coef=0.000401762, clip_range=0.1, n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8,
        vf_coef=0.58096, policy_kwargs=dict(log_std_init=-2, ortho_init=False,
                                            activation_fn=nn.ReLU,
                                            net_arch=dict(pi=[256, 256], vf=[256, 256]))),
    "hopper": dict(
        n_envs=1, batch_size=32, n_steps=512, gamma=0.999, learning_rate=9.80828e-05,
        ent_coef=0.00229519, clip_range=0.2, n_epochs=5, gae_lambda=0.99, max_grad_norm=0.7,
        vf_coef=0.835671, policy_kwargs=dict(log_std_init=-2, ortho_init=False,
                                             activation_fn=nn.ReLU,
                                             net_arch=dict(pi=[256, 256], vf=[256, 256]))),
}


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


# ---------------------------------------------------------------------------- policies, evals
def ours_policy(alg: Any) -> PolicyFn:
    return lambda obs: alg.act_deterministic(obs)


def sb3_policy(model: SB3PPO, norm: VecNormalize | None) -> PolicyFn:
    """Deterministic SB3 actions; observations normalized with ``norm``'s statistics, frozen."""

    def policy(obs: torch.Tensor) -> torch.Tensor:
        x = obs.cpu().numpy()
        action, _ = model.predict(norm.normalize_obs(x) if norm is not None else x,
                                  deterministic=True)
        return torch.as_tensor(action, dtype=torch.float32)

    return policy


def sb3_eval(task: str, episodes: int, seed: int) -> Callable[[PolicyFn], dict[str, float]]:
    """``evaluate`` on ``episodes`` fresh Gymnasium worlds of ``task`` (one episode each)."""
    env = robotrl.envs.make(task, episodes, backend="gymnasium", seed=seed + EVAL_ENV_SEED)
    return lambda policy: evaluate(policy, env, seed=seed + EVAL_RESET_SEED)


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

    def evaluate(self, step: int) -> float:
        """Evaluate now, at env step ``step``; return the seconds it took."""
        t, t0 = self.seconds(), time.perf_counter()
        result = self.run()
        dt = time.perf_counter() - t0
        self.eval_s += dt
        self._record(step, t, result)
        return dt

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


class StopAtBudget(BaseCallback):
    """SB3 callback: ``TimedEvals`` when due; stop once the training time reaches the budget."""

    def __init__(self, evals: TimedEvals) -> None:
        super().__init__()
        self.evals = evals

    def _on_step(self) -> bool:
        if self.evals.due():
            self.evals.evaluate(self.num_timesteps)
        return not self.evals.out_of_time()


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


# ---------------------------------------------------------------------------- throughput mode
def sb3_mapping(algo: PPOConfig, num_envs: int, sb3_envs: int) -> tuple[dict[str, Any],
                                                                          list[str]]:
    """SB3 ``PPO`` arguments as close to ours' ``algo`` as SB3 allows, and what differs.

    SB3's value loss is the plain MSE where ours is half of it, hence ``vf_coef = value_coef/2``.
    """
    notes: list[str] = []
    batch = algo.num_steps * num_envs
    n_steps = max(1, round(batch / sb3_envs))
    if n_steps * sb3_envs != batch:
        notes.append(f"rollout batch {batch} is not a multiple of --sb3-envs {sb3_envs}: SB3 "
                     f"collects {n_steps * sb3_envs}")
    if algo.clip_low != algo.clip_high:
        notes.append(f"SB3 clips symmetrically: clip_range = clip_low = {algo.clip_low}")
    lr: float | Callable[[float], float] = algo.learning_rate
    if algo.lr_schedule == "linear":
        # SB3 passes progress_remaining = 1 - progress, the factor of ours' linear schedule
        lr = lambda remaining: algo.learning_rate * remaining  # noqa: E731
    elif algo.lr_schedule == "adaptive":
        notes.append(f"SB3 has no KL-adaptive learning rate: fixed at {algo.learning_rate}")
    if algo.shared_backbone:
        notes.append("SB3 >= 1.8 has no shared trunk: separate pi/vf networks")
    if algo.state_dependent_std:
        notes.append("SB3's MlpPolicy has a state-independent log std")
    kwargs = dict(
        learning_rate=lr, n_steps=n_steps, batch_size=batch // algo.num_minibatches,
        n_epochs=algo.num_epochs, gamma=algo.gamma, gae_lambda=algo.gae_lambda,
        clip_range=algo.clip_low, clip_range_vf=algo.value_clip or None,
        normalize_advantage=algo.normalize_advantages, ent_coef=algo.entropy_coef,
        vf_coef=algo.value_coef / 2, max_grad_norm=algo.max_grad_norm or math.inf,
        policy_kwargs=dict(net_arch=dict(pi=list(algo.actor_hidden), vf=list(algo.critic_hidden)),
                           activation_fn=ACTIVATIONS[algo.activation],
                           log_std_init=algo.init_log_std, ortho_init=True),
    )
    return kwargs, notes


def ours_throughput(task: str, args: argparse.Namespace, console: Console) -> dict[str, Any]:
    run_dir = fresh_dir(Path(args.out) / "throughput" / f"ours_{task}", console)
    cfg = from_dict(TrainConfig, {
        "algo": {"name": "ppo", **args.algo_overrides}, "env": {"task": task},
        "num_envs": args.num_envs, "total_steps": args.steps, "seed": args.seed,
        "run_dir": str(run_dir), "logger": {"progress": False},
        "eval_episodes": args.eval_episodes})
    validate(cfg)
    torch.set_num_threads(cfg.torch_threads or CORES)  # ours: its own config's setting
    seed_everything(cfg.seed)
    runner = build_runner(cfg)
    runner.make_eval_env = None  # evaluated below, outside the timed call
    console.print(f"[dim]{task}: ours, {cfg.num_envs} worlds, {cfg.total_steps:,} steps ...[/]")
    t0 = time.perf_counter()
    runner.train()
    seconds = time.perf_counter() - t0
    eval_env = build_env(cfg, cfg.eval_episodes, cfg.seed + EVAL_ENV_SEED, train=False)
    final = evaluate(ours_policy(runner.alg), eval_env, seed=cfg.seed + EVAL_RESET_SEED)
    returns = list(runner.recent_returns)
    hist = runner.history
    return {"steps": runner.global_step, "seconds": seconds, "sps": runner.global_step / seconds,
            "final": final, "train_return": mean(returns), "train_episodes": len(returns),
            "collect_s": sum(m["perf/collect_s"] for m in hist),
            "update_s": sum(m["perf/update_s"] for m in hist), "config": to_dict(cfg)}


def sb3_throughput(task: str, cfg: dict[str, Any], args: argparse.Namespace,
                   console: Console) -> dict[str, Any]:
    algo = from_dict(TrainConfig, cfg).algo
    kwargs, notes = sb3_mapping(algo, cfg["num_envs"], args.sb3_envs)
    torch.set_num_threads(args.torch_threads)
    vec_cls, vec_kwargs = (SubprocVecEnv, {"start_method": "forkserver"}) \
        if args.sb3_vec == "subproc" else (DummyVecEnv, None)
    venv = make_vec_env(task_class(task).gym_id, n_envs=args.sb3_envs, seed=args.seed,
                        vec_env_cls=vec_cls, vec_env_kwargs=vec_kwargs)
    venv, norm = sb3_normalize(venv, algo)
    model = SB3PPO("MlpPolicy", venv, seed=args.seed, device="cpu", verbose=0, **kwargs)
    console.print(f"[dim]{task}: SB3, {args.sb3_vec} x {args.sb3_envs}, n_steps "
                  f"{kwargs['n_steps']}, {cfg['total_steps']:,} steps ...[/]")
    return sb3_learn(model, venv, norm, task, cfg["total_steps"], args,
                     {"hyperparameters": plain(kwargs), "notes": notes,
                      "vec_env": f"{args.sb3_vec} x {args.sb3_envs}"})


def sb3_normalize(venv: Any, algo: Any) -> tuple[Any, VecNormalize | None]:
    """(env, normalizer): SB3's VecNormalize doing what ``algo``'s observation normalization
    and reward scaling do (clip 10 as ours), or ``venv`` unchanged and None."""
    if not (algo.normalize_obs or algo.reward_scaling):
        return venv, None
    norm = VecNormalize(venv, norm_obs=algo.normalize_obs, norm_reward=algo.reward_scaling,
                        gamma=algo.gamma, clip_obs=10.0, clip_reward=10.0)
    return norm, norm


def sb3_learn(model: Any, venv: Any, norm: VecNormalize | None, task: str, total_steps: int,
              args: argparse.Namespace, extra: dict[str, Any]) -> dict[str, Any]:
    """Time ``model.learn(total_steps)``, evaluate deterministically, close ``venv``; the
    result dict every throughput comparison prints (plus ``extra``)."""
    t0 = time.perf_counter()
    model.learn(total_timesteps=total_steps)
    seconds = time.perf_counter() - t0
    final = sb3_eval(task, args.eval_episodes, args.seed)(sb3_policy(model, norm))
    returns = [float(ep["r"]) for ep in model.ep_info_buffer or []]
    venv.close()
    return {"steps": model.num_timesteps, "seconds": seconds, "sps": model.num_timesteps / seconds,
            "final": final, "train_return": mean(returns), "train_episodes": len(returns),
            **extra}


def print_end_to_end(console: Console, title: str, ours: dict[str, Any], peer: dict[str, Any],
                     peer_name: str, eval_episodes: int) -> None:
    """Table of two end-to-end runs (``sb3_learn``-style dicts) and their throughput ratio."""
    table = Table(title=title,
                  caption="steps/s: env steps / wall clock of the whole train()/learn() call")
    for col in ("", f"ours ({ours['config']['num_envs']} worlds)",
                f"{peer_name} ({peer['vec_env']})"):
        table.add_column(col, justify="right" if col else "left")
    rows = [
        ("env steps", lambda r: f"{r['steps']:,}"),
        ("wall clock (s)", lambda r: f"{r['seconds']:.1f}"),
        ("env-steps/s", lambda r: f"{r['sps']:,.0f}"),
        (f"final eval return ({eval_episodes} ep.)",
         lambda r: f"{r['final']['return_mean']:.1f} ± {r['final']['return_std']:.1f}"),
        ("train return (last episodes)",
         lambda r: "-" if r["train_return"] is None
         else f"{r['train_return']:.1f} ({r['train_episodes']} ep.)"),
    ]
    for label, cell in rows:
        table.add_row(label, cell(ours), cell(peer))
    table.add_section()
    table.add_row(f"ours/{peer_name} env-steps/s", f"{ours['sps'] / peer['sps']:.2f}x", "")
    console.print(table)


def throughput(args: argparse.Namespace, console: Console) -> tuple[dict, list[dict]]:
    results, checks = {}, []
    for task in args.tasks:
        ours = ours_throughput(task, args, console)
        sb3 = sb3_throughput(task, ours["config"], args, console)
        ratio = ours["sps"] / sb3["sps"]
        results[task] = {"ours": ours, "sb3": sb3, "ratio": ratio}
        print_end_to_end(console, f"{task} ({task_class(task).gym_id}): PPO end to end, "
                         f"{CORES} cores", ours, sb3, "SB3", args.eval_episodes)
        console.print(f"ours: {ours['collect_s']:.1f} s collecting, {ours['update_s']:.1f} s "
                      f"updating. SB3 arguments: {sb3['hyperparameters']}")
        for note in sb3["notes"]:
            console.print(f"[yellow]note:[/] {note}")
        checks.append({"name": f"{task}: ours/SB3 end-to-end env-steps/s >= {TARGET_SPEEDUP:g}x",
                       "value": ratio, "status": "PASS" if ratio >= TARGET_SPEEDUP else "FAIL"})
    return results, checks


# ---------------------------------------------------------------------------- wallclock mode
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
    run_dir = fresh_dir(Path(args.out) / name, console)
    cfg = compose_ours(task, minutes, run_dir, args, extra)
    validate(cfg)
    torch.set_num_threads(cfg.torch_threads or CORES)  # ours: its own config's setting
    seed_everything(cfg.seed)
    runner = build_runner(cfg)
    runner.make_eval_env = None  # TimedEvals evaluates, on the training clock
    save_config(cfg)
    eval_env = build_env(cfg, cfg.eval_episodes, cfg.seed + EVAL_ENV_SEED, train=False)
    writer = SummaryWriter(str(run_dir), filename_suffix=".evals")
    evals = TimedEvals(lambda: evaluate(ours_policy(runner.alg), eval_env,
                                        seed=cfg.seed + EVAL_RESET_SEED),
                       writer, args.eval_every, 60 * minutes)
    batch = cfg.algo.num_steps * cfg.num_envs
    update = runner.alg.update

    def update_then_evaluate(progress: float = 0.0) -> dict[str, float]:
        metrics = update(progress=progress)
        if evals.due():
            # the runner's budget (wall time since train() began) grows by the evaluation time
            runner.s.max_minutes += evals.evaluate(runner.global_step + batch) / 60
        return metrics

    runner.alg.update = update_then_evaluate
    console.print(f"[dim]{task}: ours ({name}), {cfg.num_envs} worlds, {minutes:g} min ...[/]")
    evals.begin()
    runner.train()
    seconds = evals.seconds()
    if evals.curve[-1]["steps"] != runner.global_step:  # else the last update just evaluated
        evals.evaluate(runner.global_step)
    writer.close()
    early = runner.global_step >= cfg.total_steps and seconds < 60 * minutes
    if early:
        console.print(f"[yellow]{name} reached total_steps={cfg.total_steps:,} after "
                      f"{seconds:.0f} s, before its budget: raise it with --ours-overrides "
                      "total_steps=N[/]")
    label = "ours long" if name.endswith("_long") else "ours"
    return {"label": f"{label} ({minutes:g} min)", "budget_min": minutes, "run_dir": str(run_dir),
            "train_seconds": seconds, "eval_seconds": evals.eval_s, "steps": runner.global_step,
            "final": evals.curve[-1], "curve": evals.curve, "stopped_at_total_steps": early,
            "config": to_dict(cfg)}


def sb3_wallclock(task: str, minutes: float, args: argparse.Namespace,
                  console: Console) -> dict[str, Any]:
    if task not in ZOO:
        raise ValueError(f"no rl-baselines3-zoo hyperparameters for {task!r}; known: {list(ZOO)}")
    run_dir = fresh_dir(Path(args.out) / f"sb3_{task}", console)
    hp = dict(ZOO[task])
    n_envs = hp.pop("n_envs")
    torch.set_num_threads(args.torch_threads)
    norm = VecNormalize(make_vec_env(task_class(task).gym_id, n_envs=n_envs, seed=args.seed),
                        gamma=hp["gamma"])
    model = SB3PPO("MlpPolicy", norm, seed=args.seed, device="cpu", verbose=0, **hp)
    run_eval = sb3_eval(task, args.eval_episodes, args.seed)
    writer = SummaryWriter(str(run_dir))
    evals = TimedEvals(lambda: run_eval(sb3_policy(model, norm)), writer, args.eval_every,
                       60 * minutes, lambda: [float(ep["r"]) for ep in model.ep_info_buffer or []])
    console.print(f"[dim]{task}: SB3 (rl-baselines3-zoo), {minutes:g} min ...[/]")
    evals.begin()
    # no schedule depends on total_timesteps here: the callback ends training at the budget
    model.learn(total_timesteps=10**10, callback=StopAtBudget(evals))
    seconds = evals.seconds()
    if evals.curve[-1]["steps"] != model.num_timesteps:
        evals.evaluate(model.num_timesteps)
    writer.close()
    norm.close()
    return {"label": f"SB3 zoo ({minutes:g} min)", "budget_min": minutes, "run_dir": str(run_dir),
            "train_seconds": seconds, "eval_seconds": evals.eval_s, "steps": model.num_timesteps,
            "final": evals.curve[-1], "curve": evals.curve,
            "hyperparameters": plain({"n_envs": n_envs, "normalize": True, **hp})}


def best_by(run: dict[str, Any], minutes: float) -> float | None:
    """Best evaluation within ``minutes`` of training; a run's budget covers its final eval."""
    if minutes > run["budget_min"] + 1e-9:
        return None
    whole = minutes >= run["budget_min"] - 1e-9
    pts = [p["return"] for p in run["curve"] if whole or p["seconds"] <= 60 * minutes]
    return max(pts) if pts else None


def wallclock_table(task: str, runs: dict[str, dict[str, Any]], console: Console) -> None:
    budgets = {r["budget_min"] for r in runs.values()}
    marks = sorted({m for m in TIME_MARKS if m <= max(budgets)} | budgets)
    table = Table(title=f"{task} ({task_class(task).gym_id}): deterministic eval return",
                  caption="training time excludes evaluations; '-' beyond a run's budget")
    table.add_column("")
    for run in runs.values():
        table.add_column(run["label"], justify="right")
    for m in marks:
        cells = [best_by(r, m) for r in runs.values()]
        table.add_row(f"best by {m:g} min", *("-" if c is None else f"{c:.1f}" for c in cells))
    table.add_section()
    rows = [("final eval at budget", lambda r: f"{r['final']['return']:.1f} ± "
                                               f"{r['final']['std']:.1f}"),
            ("env steps", lambda r: f"{r['steps']:,}"),
            ("training s", lambda r: f"{r['train_seconds']:.0f}"),
            ("evaluations (s)", lambda r: f"{len(r['curve'])} ({r['eval_seconds']:.0f} s)")]
    for label, cell in rows:
        table.add_row(label, *(cell(r) for r in runs.values()))
    console.print(table)


def wallclock_checks(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> list[dict]:
    def check(name: str, value: float | None, target: float | None) -> dict[str, Any]:
        status = "SKIP" if value is None or target is None else (
            "PASS" if value >= target else "FAIL")
        return {"name": name, "value": value, "target": target, "status": status}

    hc, hop = results.get("halfcheetah", {}), results.get("hopper", {})
    out = [check(f"halfcheetah: ours best eval within 5 min >= {TARGET_HC_5MIN:g}",
                 best_by(hc["ours"], min(5.0, hc["ours"]["budget_min"])) if "ours" in hc
                 else None, TARGET_HC_5MIN)]
    long = hc.get("ours_long")
    out.append(check(f"halfcheetah: ours best eval within {args.long_minutes:g} min >= "
                     f"{TARGET_HC_LONG:g} (--long)",
                     best_by(long, long["budget_min"]) if long else None, TARGET_HC_LONG))
    ours, sb3 = hop.get("ours"), hop.get("sb3")
    out.append(check(f"hopper: ours at {args.ours_minutes:g} min >= SB3 zoo at "
                     f"{args.sb3_minutes:g} min",
                     ours["final"]["return"] if ours else None,
                     sb3["final"]["return"] if sb3 else None))
    return out


def wallclock(args: argparse.Namespace, console: Console) -> tuple[dict, list[dict]]:
    results: dict[str, dict[str, Any]] = {}
    for task in args.tasks:
        runs: dict[str, dict[str, Any]] = {}
        if args.only in (None, "ours"):
            runs["ours"] = ours_wallclock(task, args.ours_minutes, f"ours_{task}",
                                          args.ours_overrides, args, console)
        if args.only in (None, "sb3"):
            runs["sb3"] = sb3_wallclock(task, args.sb3_minutes, args, console)
        if args.long and task == "halfcheetah" and args.only in (None, "ours"):
            runs["ours_long"] = ours_wallclock(task, args.long_minutes, f"ours_{task}_long",
                                               args.ours_overrides + args.long_overrides,
                                               args, console)
        results[task] = runs
        wallclock_table(task, runs, console)
        summary = " | ".join(f"{r['label']}: {r['final']['return']:.1f} at its budget"
                             for r in runs.values())
        console.print(f"{task}: {summary}")
    return results, wallclock_checks(results, args)


# ---------------------------------------------------------------------------- CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mode", choices=("throughput", "wallclock"), default="throughput")
    p.add_argument("--tasks", nargs="+",
                   help="registry names (default: halfcheetah; wallclock: halfcheetah hopper)")
    p.add_argument("--seed", type=int, default=0, help="seed of both contestants")
    p.add_argument("--eval-episodes", type=int, default=10, help="episodes per evaluation")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"),
                   help="run directories and TensorBoard events (default: benchmarks/results/)")
    p.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    p.add_argument("--torch-threads", type=int, default=CORES,
                   help=f"torch.set_num_threads of SB3 (default: cores = {CORES}); ours uses "
                        "its config's torch_threads")
    g = p.add_argument_group("throughput mode")
    g.add_argument("--steps", type=int, default=200_000, help="env steps of each contestant")
    g.add_argument("--num-envs", type=int, default=TrainConfig().num_envs, help="ours' worlds")
    g.add_argument("--algo-overrides", type=json.loads, default={}, metavar="JSON",
                   help='PPOConfig fields for ours (and mapped to SB3), e.g. \'{"num_steps": 64}\'')
    g.add_argument("--sb3-envs", type=int, default=8, help="SB3 sub-envs")
    g.add_argument("--sb3-vec", choices=("dummy", "subproc"), default="dummy",
                   help="SB3 DummyVecEnv or SubprocVecEnv (forkserver)")
    g = p.add_argument_group("wallclock mode")
    g.add_argument("--ours-minutes", type=float, default=5.0, help="ours' training budget")
    g.add_argument("--sb3-minutes", type=float, default=10.0, help="SB3's training budget")
    g.add_argument("--eval-every", type=float, default=30.0,
                   help="seconds of training between evaluations")
    g.add_argument("--ours-overrides", nargs="*", default=[], metavar="KEY=VALUE",
                   help="extra `robotrl train` overrides for ours, e.g. total_steps=20000000")
    g.add_argument("--long", action="store_true",
                   help="also run ours on HalfCheetah for --long-minutes (target: 6500)")
    g.add_argument("--long-minutes", type=float, default=15.0)
    g.add_argument("--long-overrides", nargs="*", default=[], metavar="KEY=VALUE",
                   help="overrides for the long run only, after --ours-overrides")
    g.add_argument("--only", choices=("ours", "sb3"), help="run one contestant (checks may SKIP)")
    args = p.parse_args(argv)
    if args.tasks is None:
        args.tasks = ["halfcheetah"] if args.mode == "throughput" else ["halfcheetah", "hopper"]
    if not isinstance(args.algo_overrides, dict):
        p.error("--algo-overrides must be a JSON object")
    unknown = [t for t in args.tasks if t not in ZOO]
    if args.mode == "wallclock" and args.only != "ours" and unknown:
        p.error(f"no rl-baselines3-zoo hyperparameters for {unknown}; known: {list(ZOO)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=max(Console().width, 100))
    console.print(f"robotrl PPO vs Stable-Baselines3 ({args.mode}) | {cpu_name()}, {CORES} cores | "
                  f"mujoco {mujoco.__version__}, torch {torch.__version__}, "
                  f"SB3 {stable_baselines3.__version__} | seed {args.seed}, "
                  f"SB3 {args.torch_threads} torch threads, ours {TrainConfig().torch_threads}")
    warn_if_loaded(console)
    results, verdicts = (throughput if args.mode == "throughput" else wallclock)(args, console)
    for c in verdicts:
        value = "" if c["value"] is None else (
            f" ({c['value']:.2f}x)" if args.mode == "throughput" else f" ({c['value']:.1f}"
            + ("" if c.get("target") is None else f" vs {c['target']:.1f}") + ")")
        colour = {"PASS": "green", "FAIL": "red", "SKIP": "yellow"}[c["status"]]
        console.print(f"[{colour}]{c['status']}[/] {c['name']}{value}")
    if args.json:
        meta = {"cores": CORES, "cpu": cpu_name(), "mujoco": mujoco.__version__,
                "torch": torch.__version__, "sb3": stable_baselines3.__version__,
                "python": platform.python_version(), "args": vars(args)}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "mode": args.mode, "results": results, "checks": verdicts},
                      f, indent=2, default=str)
        console.print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
