"""Stable-Baselines3's PPO on robotrl's simulator (``as_sb3_vecenv``) against SB3's own vector
envs of Gymnasium's MuJoCo envs: end-to-end env-steps/s and returns at equal steps.

    python benchmarks/sb3_interop.py                                  # hopper halfcheetah, 50k steps
    python benchmarks/sb3_interop.py --tasks hopper --steps 4096 --n-envs 16   # quick look

Per task and vector env, one ``PPO("MlpPolicy", VecNormalize(venv)).learn(--steps)`` with the
rl-baselines3-zoo hyperparameters (``peers/sb3.py``'s ``ZOO``, ``n_steps`` per sub-env as SB3 defines
it; ``--n-envs`` sub-envs, the zoo's is 1), observation and reward normalization by
``VecNormalize`` as the zoo's ``normalize: true``, the same seed, one torch thread. Vector envs: ``robotrl``
(``as_sb3_vecenv(make(task, n_envs))``, the native MuJoCo backend), ``dummy`` (``DummyVecEnv``)
and ``subproc`` (``SubprocVecEnv``, only with ``--n-envs`` > 1). Reported: wall clock of the
whole ``learn`` call, env-steps/s and the ratio to each SB3 vector env, the deterministic
evaluation return after training (Gymnasium's env, ``--eval-episodes``), and the mean return of
the last training episodes. Contestants run one after the other, never side by side.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from common import banner, machine_meta, mean, sb3_eval, sb3_policy, write_json
from peers.sb3 import ZOO
from rich.console import Console
from rich.table import Table

from robotrl.envs import as_sb3_vecenv, make
from robotrl.envs.registry import task_class

console = Console()
VEC_ENVS = ("robotrl", "dummy", "subproc")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=["hopper", "halfcheetah"], choices=sorted(ZOO))
    p.add_argument("--steps", type=int, default=50_000)
    p.add_argument("--n-envs", type=int, default=1, help="sub-envs (the zoo's: 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-episodes", type=int, default=5)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--out", default="benchmarks/figures/sb3_interop.json",
                   help="the JSON written (default: %(default)s)")
    return p.parse_args()


def venv_of(kind: str, task: str, args: argparse.Namespace) -> Any:
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import SubprocVecEnv

    if kind == "robotrl":
        return as_sb3_vecenv(make(task, args.n_envs, seed=args.seed))
    vec = {"vec_env_cls": SubprocVecEnv} if kind == "subproc" else {}
    return make_vec_env(task_class(task).gym_id, n_envs=args.n_envs, seed=args.seed, **vec)


def run(kind: str, task: str, args: argparse.Namespace) -> dict[str, Any]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecNormalize

    hp = dict(ZOO[task])
    hp.pop("n_envs")
    torch.set_num_threads(args.torch_threads)
    norm = VecNormalize(venv_of(kind, task, args), gamma=hp["gamma"])
    model = PPO("MlpPolicy", norm, seed=args.seed, device="cpu", verbose=0, **hp)
    t0 = time.perf_counter()
    model.learn(total_timesteps=args.steps)
    seconds = time.perf_counter() - t0
    final = sb3_eval(task, args.eval_episodes, args.seed)(sb3_policy(model, norm))
    returns = [float(ep["r"]) for ep in model.ep_info_buffer or []]
    norm.close()
    console.print(f"  {task} {kind}: {model.num_timesteps / seconds:,.0f} env-steps/s, eval "
                  f"{final['return_mean']:.1f}")
    return {"vec_env": kind, "steps": model.num_timesteps, "seconds": seconds,
            "sps": model.num_timesteps / seconds, "final": final,
            "train_return": mean(returns), "train_episodes": len(returns)}


def main() -> None:
    args = parse()
    kinds = [k for k in VEC_ENVS if k != "subproc" or args.n_envs > 1]
    console.print(banner("SB3 PPO on robotrl vs SB3's vector envs",
                         f"{args.steps:,} steps, {args.n_envs} sub-envs, zoo hyperparameters"))
    results: dict[str, dict[str, Any]] = {}
    for task in args.tasks:
        results[task] = {k: run(k, task, args) for k in kinds}
        table = Table("vector env", "env-steps/s", "robotrl / this", "wall clock (s)",
                      f"eval return ({args.eval_episodes} ep.)", "train return (last ep.)",
                      title=f"{task}: SB3 PPO, {args.steps:,} steps")
        ours = results[task]["robotrl"]["sps"]
        for k, r in results[task].items():
            train = "-" if r["train_return"] is None else f"{r['train_return']:.1f}"
            table.add_row(k, f"{r['sps']:,.0f}", f"{ours / r['sps']:.2f}x", f"{r['seconds']:.1f}",
                          f"{r['final']['return_mean']:.1f} ± {r['final']['return_std']:.1f}",
                          train)
        console.print(table)
    write_json(args.out, {"meta": machine_meta(sb3=True), "args": vars(args),
                          "results": results}, console)


if __name__ == "__main__":
    main()
