"""``robotrl gap checkpoint=PATH [masses=0.7,1.0,1.3] [frictions=0.5,1.0,1.5] [delays=0,1,2]
[episodes=10] [baseline=PATH] [out=FILE.json] [seed=N] [device=cpu] [tracking_seconds=10]``.

Evaluates a checkpoint's deterministic policy on a grid of fixed physics perturbations
(``robotrl.sim2real.gap``), prints the table and writes it as JSON. ``baseline`` evaluates a
second checkpoint on the same grid and prints it alongside (e.g. the policy trained without
randomization). Velocity tasks also report tracking at each point (``robotrl.runners.tracking``
on its command grid, ``tracking_seconds`` a command).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from robotrl.cli.args import parse_kv

USAGE = ("robotrl gap checkpoint=PATH [masses=0.7,1.0,1.3] [frictions=0.5,1.0,1.5] "
         "[delays=0,1,2] [episodes=10] [baseline=PATH] [out=FILE.json] [seed=N] [device=cpu] "
         "[tracking_seconds=10]")


def _floats(key: str, text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"{key}={text!r}: expected comma-separated numbers, e.g. "
                         f"{key}=0.7,1.0,1.3") from None


def _ints(key: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"{key}={text!r}: expected comma-separated integers, e.g. "
                         f"{key}=0,1,2") from None


def run_gap(checkpoint: str, grid: Any, device: str = "cpu", tracking_seconds: float = 10.0
            ) -> tuple[str, list[dict[str, Any]]]:
    """(task, rows) of ``robotrl.sim2real.gap.evaluate_gap`` for the policy of ``checkpoint``."""
    from robotrl.experiment.build import (
        build_algo,
        build_env,
        load_run,
        tracking_report,
        tracks_velocity,
    )
    from robotrl.sim2real.gap import evaluate_gap
    from robotrl.types import Obs, obs_to

    cfg, ckpt = load_run(checkpoint, device)
    if cfg.backend.name != "mujoco":
        raise SystemExit(f"robotrl gap perturbs the native MuJoCo physics; {checkpoint} was "
                         f"trained on backend={cfg.backend.name}")
    spec = build_env(cfg, 1, cfg.seed, train=False).spec
    alg = build_algo(cfg, spec, ckpt["algo"])
    dev = torch.device(device)

    def policy(obs: Obs) -> torch.Tensor:
        return alg.act_deterministic(obs_to(obs, dev)).cpu()

    def make_env(perturbation: Any, num_envs: int) -> Any:
        return build_env(cfg, num_envs, grid.seed, train=False, randomization=perturbation)

    track = None
    if tracks_velocity(cfg):  # a velocity task: tracking too

        def track(perturbation: Any) -> dict[str, Any]:
            return tracking_report(cfg, policy, grid.seed, grid.seed, perturbation,
                                   tracking_seconds)

    return cfg.env.task, evaluate_gap(policy, make_env, grid, track)


def gap_main(argv: list[str]) -> None:
    """Entry point of ``robotrl gap``."""
    from robotrl.checkpoint import write_json
    from robotrl.logging import console
    from robotrl.sim2real.gap import GapGrid, gap_table

    args = parse_kv(argv, {"checkpoint": str, "masses": str, "frictions": str, "delays": str,
                           "episodes": int, "baseline": str, "out": str, "seed": int,
                           "device": str, "tracking_seconds": float})
    if "checkpoint" not in args:
        raise SystemExit(f"robotrl gap needs checkpoint=PATH\nusage: {USAGE}")
    grid = GapGrid(episodes=int(args.get("episodes", 10)), seed=int(args.get("seed", 0)))
    if "masses" in args:
        grid.masses = _floats("masses", str(args["masses"]))
    if "frictions" in args:
        grid.frictions = _floats("frictions", str(args["frictions"]))
    if "delays" in args:
        grid.delays = _ints("delays", str(args["delays"]))
    try:
        grid.check()
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    device = str(args.get("device", "cpu"))
    seconds = float(args.get("tracking_seconds", 10.0))
    if seconds <= 0:
        raise SystemExit(f"tracking_seconds must be > 0, got {seconds}")
    task, rows = run_gap(str(args["checkpoint"]), grid, device, seconds)
    baseline = None
    if "baseline" in args:
        _, baseline = run_gap(str(args["baseline"]), grid, device, seconds)
    console.print(gap_table(rows, title=f"{task}: {args['checkpoint']}", baseline=baseline))
    if "out" in args:
        data = {"checkpoint": str(args["checkpoint"]), "task": task,
                "grid": {"masses": list(grid.masses), "frictions": list(grid.frictions),
                         "delays": list(grid.delays), "episodes": grid.episodes,
                         "seed": grid.seed},
                "results": rows}
        if baseline is not None:
            data["baseline"] = {"checkpoint": str(args["baseline"]), "results": baseline}
        write_json(Path(str(args["out"])), data)
        console.print(f"wrote {args['out']}")
