"""Sim-to-sim gap: a policy's return on a grid of fixed physics perturbations.

    grid = GapGrid(masses=(0.7, 1.0, 1.3), frictions=(1.0,), delays=(0,))
    rows = evaluate_gap(policy, make_env, grid)     # one row per (mass, friction, delay)
    console.print(gap_table(rows, title="hopper"))

Each perturbation is a degenerate range of ``RandomizationConfig`` (``low == high``, one factor
shared by every body or geom), so the physics is exactly what domain randomization would
produce at that corner: all masses (and inertias) times ``mass``, every geom's sliding friction
times ``friction``, and actions applied ``delay`` control steps late. A robust policy keeps most
of its nominal return across the grid (Peng et al. 2018 report the same kind of table).

``one_step_agreement(env, reference, steps)`` compares two simulators of one task (e.g. the mjx
and mujoco backends) one step at a time from the same states, and ``relative_error`` sizes the
difference (``benchmarks/mjx_fidelity.py``).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import torch

from robotrl.config import RandomizationConfig, Range
from robotrl.runners.evaluation import PolicyFn, evaluate
from robotrl.types import BatchedEnv


@dataclasses.dataclass
class GapGrid:
    """The perturbations to evaluate: every combination of the three lists."""

    masses: tuple[float, ...] = (0.7, 1.0, 1.3)
    """Factors on every body mass (and inertia)."""
    frictions: tuple[float, ...] = (0.5, 1.0, 1.5)
    """Factors on every geom's sliding friction."""
    delays: tuple[int, ...] = (0, 1, 2)
    """Action delays in control steps."""
    episodes: int = 10
    """Episodes per grid point (one per world)."""
    seed: int = 0
    """Seed of the evaluation resets (the same for every grid point)."""

    def check(self) -> None:
        """Raise naming the list and the allowed values on a bad grid."""
        for name in ("masses", "frictions", "delays"):
            values = getattr(self, name)
            if not values:
                raise ValueError(f"gap grid: {name} must list at least one value")
        if min(self.masses) <= 0:
            raise ValueError(f"gap grid: masses must be > 0, got {list(self.masses)}")
        if min(self.frictions) < 0:
            raise ValueError(f"gap grid: frictions must be >= 0, got {list(self.frictions)}")
        if min(self.delays) < 0:
            raise ValueError(f"gap grid: delays must be integers >= 0, got {list(self.delays)}")
        if self.episodes < 1:
            raise ValueError(f"gap grid: episodes must be >= 1, got {self.episodes}")


def perturbation(mass: float = 1.0, friction: float = 1.0, delay: int = 0) -> RandomizationConfig:
    """The fixed physics of one grid point as a (degenerate) randomization config."""
    def fixed(x: float) -> Range | None:
        return None if x == 1.0 else Range(low=x, high=x, shared=True)

    return RandomizationConfig(body_mass=fixed(mass), friction=fixed(friction),
                               action_delay_min=delay, action_delay_max=delay)


def evaluate_gap(policy: PolicyFn, make_env: Callable[[RandomizationConfig, int], BatchedEnv],
                 grid: GapGrid,
                 track: Callable[[RandomizationConfig], dict[str, Any]] | None = None
                 ) -> list[dict[str, Any]]:
    """Evaluate ``policy`` at every grid point.

    ``make_env(perturbation, num_envs)`` builds the evaluation env for one point. Returns one
    dict per point: ``mass``, ``friction``, ``delay``, ``return_mean``, ``return_std``,
    ``length_mean``, ``episodes`` and ``relative`` (return over the nominal point's return, when
    the grid holds the nominal point mass 1, friction 1, delay 0; else None). ``track``
    (velocity tasks: ``robotrl.runners.tracking``) adds its report's ``lin_vel_rmse``,
    ``yaw_rate_rmse`` and ``falls_per_minute`` at each point.
    """
    grid.check()
    rows = []
    for mass, friction, delay in itertools.product(grid.masses, grid.frictions, grid.delays):
        env = make_env(perturbation(mass, friction, delay), grid.episodes)
        try:
            result = evaluate(policy, env, seed=grid.seed)
        finally:
            env.close()
        row = {"mass": mass, "friction": friction, "delay": delay, **result}
        if track is not None:
            report = track(perturbation(mass, friction, delay))
            row.update({k: report[k] for k in ("lin_vel_rmse", "yaw_rate_rmse",
                                               "falls_per_minute")})
        rows.append(row)
    nominal = [r for r in rows if (r["mass"], r["friction"], r["delay"]) == (1.0, 1.0, 0)]
    base = nominal[0]["return_mean"] if nominal else None
    for r in rows:
        r["relative"] = r["return_mean"] / base if base else None
    return rows


def gap_table(rows: list[dict[str, Any]], title: str = "sim-to-sim gap",
              baseline: list[dict[str, Any]] | None = None) -> Any:
    """A rich table of ``rows``; ``baseline`` (rows of another policy on the same grid) is shown
    in extra columns next to it."""
    from rich.table import Table

    table = Table(title=title)
    for name in ("mass", "friction", "delay"):
        table.add_column(name, justify="right")
    table.add_column("return", justify="right")
    table.add_column("% nominal", justify="right")
    table.add_column("length", justify="right")
    tracked = bool(rows) and "lin_vel_rmse" in rows[0]
    if tracked:
        for name in ("lin RMSE", "yaw RMSE", "falls/min"):
            table.add_column(name, justify="right")
    if baseline is not None:
        table.add_column("baseline return", justify="right")
        table.add_column("baseline % nominal", justify="right")

    def pct(r: dict[str, Any]) -> str:
        return "-" if r["relative"] is None else f"{100 * r['relative']:.0f}%"

    for i, r in enumerate(rows):
        cells = [f"x{r['mass']:g}", f"x{r['friction']:g}", str(r["delay"]),
                 f"{r['return_mean']:.1f} ± {r['return_std']:.1f}", pct(r),
                 f"{r['length_mean']:.0f}"]
        if tracked:
            cells += [f"{r['lin_vel_rmse']:.3f}", f"{r['yaw_rate_rmse']:.3f}",
                      f"{r['falls_per_minute']:.2f}"]
        if baseline is not None:
            b = baseline[i]
            cells += [f"{b['return_mean']:.1f} ± {b['return_std']:.1f}", pct(b)]
        table.add_row(*cells)
    return table


# ------------------------------------------------------------------ one-step agreement
def one_step_agreement(env: BatchedEnv, reference: BatchedEnv, steps: int,
                       seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """How closely ``env`` steps like ``reference`` (two backends of one task, same number of
    worlds), free of chaos: before every step ``reference``'s state is set into both (so both
    start from a cleared solver warm start, as after a reset), both take the same uniformly
    random action, and their final observations are kept. The reference runs its own rollout.
    Returns ``(ours, theirs)``, [steps, num_envs, obs_dim] float64 observations; compare them
    with ``relative_error``."""
    if (env.num_envs, env.spec.obs_dim) != (reference.num_envs, reference.spec.obs_dim):
        raise ValueError(f"env has {env.num_envs} worlds x {env.spec.obs_dim} observations, the "
                         f"reference {reference.num_envs} x {reference.spec.obs_dim}")
    reference.reset(seed=seed)
    gen = torch.Generator().manual_seed(seed)
    low, high = reference.spec.action_low.cpu(), reference.spec.action_high.cpu()
    ours, theirs = [], []
    for _ in range(steps):
        state = reference.get_state()
        reference.set_state(state)
        env.set_state(state.to(env.device))
        u = torch.rand(reference.num_envs, reference.spec.action_dim, generator=gen)
        action = low + u * (high - low)
        ours.append(env.step(action.to(env.device)).info["final_obs"]["policy"].cpu().double())
        theirs.append(reference.step(action).info["final_obs"]["policy"].cpu().double())
    return torch.stack(ours), torch.stack(theirs)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """max |a - b| / max(1, max |b|) over the last dimension (an observation)."""
    return (a - b).abs().amax(dim=-1) / b.abs().amax(dim=-1).clamp(min=1.0)
