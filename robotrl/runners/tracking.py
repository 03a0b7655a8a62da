"""Velocity-tracking evaluation of a legged policy on a fixed grid of commands.

Each world holds one command of the grid for the whole evaluation (the task's
``command_grid`` option: world ``i`` tracks ``grid[i % len(grid)]``); after a settling time the
body's planar velocity and yaw rate are compared with the command at every control step. A
world that falls is reset and keeps tracking; its fall is counted. The report is what the
legged-locomotion literature states for a velocity policy: linear and yaw-rate tracking RMSE
over the grid, falls per minute of simulated time, mean absolute joint torque, and each
command's own errors; and how often a body other than a foot is on the ground (a quadruped
that walks on its shins tracks as well as one on its feet).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from robotrl.runners.evaluation import PolicyFn
from robotrl.types import BatchedEnv, Obs

COMMAND_GRID: tuple[tuple[float, float, float], ...] = (
    (0.0, 0.0, 0.0), (0.5, 0.0, 0.0), (1.0, 0.0, 0.0), (-0.5, 0.0, 0.0),
    (0.0, 0.3, 0.0), (0.0, -0.3, 0.0), (0.0, 0.0, 0.8), (0.0, 0.0, -0.8),
    (0.5, 0.0, 0.5), (0.5, 0.0, -0.5), (0.5, 0.3, 0.0), (-0.5, -0.3, 0.0),
)
"""(vx m/s, vy m/s, yaw rate rad/s) commands of the standard report: standing, forward and
backward, sideways, turning in place, and three combinations; all inside the training ranges."""


def tracking_task(env: BatchedEnv) -> Any:
    """The velocity task behind ``env`` (a native-backend env, wrappers unwrapped), or a
    ValueError naming what is needed."""
    base = getattr(env, "unwrapped", env)
    task = getattr(base, "task", None)
    if task is None or not hasattr(task, "commands"):
        raise ValueError(f"velocity tracking needs a velocity task (go1_velocity, g1_velocity) "
                         f"on the mujoco backend, got {getattr(env.spec, 'task', '?')!r}")
    if not len(task.grid):
        raise ValueError("velocity tracking needs the task option command_grid set "
                         "(robotrl.runners.tracking.COMMAND_GRID)")
    return task


def velocity_tracking(env: BatchedEnv, obs: Obs, policy: PolicyFn, seconds: float = 10.0,
                      settle: float = 1.0) -> dict[str, Any]:
    """Run ``policy`` for ``seconds`` of simulated time from ``obs`` on every world of ``env``
    (a velocity task with ``command_grid`` set) and report the tracking.

    Errors are measured after each world's first ``settle`` seconds (at most half of
    ``seconds``) and after each fall's reset. Returns ``lin_vel_rmse`` (m/s, of the planar
    velocity error's norm), ``yaw_rate_rmse`` (rad/s), ``falls``, ``falls_per_minute``,
    ``mean_abs_torque`` (N m over joints and steps), ``sim_seconds`` (summed over worlds),
    ``measured_seconds`` (the part the errors average over), ``off_feet_fraction`` (of the
    measured steps, those with a body other than a foot on the ground) and ``commands``: one
    row per grid command. The errors and torque are NaN where nothing was measured (every world fell before
    settling), never a perfect 0.
    """
    task = tracking_task(env)
    base = getattr(env, "unwrapped", env)
    sim, n, dt = base.sim, env.num_envs, float(env.spec.control_dt)
    # a short report (a test's) settles for at most half its length
    steps, settle_steps = int(round(seconds / dt)), int(round(min(settle, seconds / 2) / dt))
    cmd = task.commands(sim).clone()
    lin_sq = torch.zeros(n, dtype=torch.float64)
    yaw_sq = torch.zeros(n, dtype=torch.float64)
    count = torch.zeros(n, dtype=torch.float64)
    torque = torch.zeros(n, dtype=torch.float64)
    off_feet = torch.zeros(n, dtype=torch.float64)
    falls = torch.zeros(n, dtype=torch.long)
    since = torch.zeros(n, dtype=torch.long)  # steps since the world's last reset
    with torch.inference_mode():
        for _ in range(steps):
            out = env.step(policy(obs))
            obs = out.obs
            done = (out.terminated | out.truncated).cpu()
            falls += out.terminated.cpu().long()
            since += 1
            live = ~done & (since > settle_steps)
            v, w = task.lin_vel(sim), task.ang_vel(sim)
            lin_sq += torch.where(live, (v[:, :2] - cmd[:, :2]).square().sum(1), 0.0)
            yaw_sq += torch.where(live, (w[:, 2] - cmd[:, 2]).square(), 0.0)
            torque += torch.where(live, sim.actuator_force.abs().mean(1), 0.0)
            off = task.bodies_on_ground(sim).sum(1) > 0
            off_feet += torch.where(live, off.double(), 0.0)
            count += live.double()
            since = since.masked_fill(done, 0)
    nan = float("nan")

    def rmse(sq: torch.Tensor, k: torch.Tensor) -> float:
        # no step measured (every world fell before settling): undefined, not a perfect 0
        return math.sqrt(float(sq.sum() / k.sum())) if float(k.sum()) > 0 else nan

    def share(k: torch.Tensor, of: torch.Tensor) -> float:
        return float(k.sum() / of.sum()) if float(of.sum()) > 0 else nan

    sim_seconds = steps * dt * n
    rows = []
    for i in range(min(n, len(task.grid))):
        same = torch.arange(n) % len(task.grid) == i
        rows.append({"command": [float(x) for x in task.grid[i].tolist()],
                     "lin_vel_rmse": rmse(lin_sq[same], count[same]),
                     "yaw_rate_rmse": rmse(yaw_sq[same], count[same]),
                     "off_feet_fraction": share(off_feet[same], count[same]),
                     "falls": int(falls[same].sum())})
    return {
        "lin_vel_rmse": rmse(lin_sq, count),
        "yaw_rate_rmse": rmse(yaw_sq, count),
        "falls": int(falls.sum()),
        "falls_per_minute": float(falls.sum()) / (sim_seconds / 60.0),
        "mean_abs_torque": float(torque.sum() / count.sum()) if float(count.sum()) else nan,
        "measured_seconds": float(count.sum()) * dt,
        "off_feet_fraction": share(off_feet, count),
        "sim_seconds": sim_seconds,
        "seconds_per_world": seconds,
        "commands": rows,
    }


def format_tracking(report: dict[str, Any]) -> str:
    """One line: the report's headline numbers."""
    return (f"tracking over {len(report['commands'])} commands x {report['seconds_per_world']:g} s:"
            f" linear RMSE {report['lin_vel_rmse']:.3f} m/s, yaw-rate RMSE "
            f"{report['yaw_rate_rmse']:.3f} rad/s, {report['falls']} falls "
            f"({report['falls_per_minute']:.2f}/min), mean |torque| "
            f"{report['mean_abs_torque']:.2f} N m, a body other than a foot on the ground "
            f"{report.get('off_feet_fraction', math.nan):.0%} of the time")
