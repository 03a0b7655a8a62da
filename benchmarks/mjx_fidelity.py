"""How closely the mjx backend steps like the native one: one-step agreement, and the bisection
that found where MJX computed unlike MuJoCo C (issue 20).

    python benchmarks/mjx_fidelity.py                 # float32 one-step agreement, as users run it
    python benchmarks/mjx_fidelity.py --mjx-rk4       # the same with MJX's own (textbook) RK4
    python benchmarks/mjx_fidelity.py --bisect        # float64, by integrator and by scheme

One-step agreement (``robotrl.sim2real.gap.one_step_agreement``): before every control step the
native worlds' state is set into the mjx worlds, both take the same uniformly random action, and
the relative error of the observation (max |mjx - native| / max(1, max |native|)) is kept, over a
rollout of ``--steps`` steps of ``--worlds`` worlds. The state columns are the observed positions
and velocities (Ant also observes clipped contact forces). The "floor" is the native backend
against itself from the float32-rounded state: what rounding the state alone costs.

The bisection runs float64 JAX from the states of a native rollout, one control step at a time:
MJX against C with the Euler integrator (collision, constraint solve and integration stage), with
MJX's textbook RK4 and with C's RK4 scheme (``envs/mjx_fixes.py``), and, per substep, a numpy RK4
written over C's own ``mj_forward`` (textbook and C's scheme) against C's ``mj_step``.
"""

from __future__ import annotations

import argparse
import copy
import sys

import numpy as np
import torch
from common import banner, check, machine_meta, print_checks, write_json
from rich.console import Console
from rich.table import Table

TASKS = ("halfcheetah", "hopper", "walker2d", "ant", "humanoid")
TARGET = 1e-3
"""Issue 20's target: one-step agreement <= 1e-3 relative (float32) on the state."""


def quantiles(errors: torch.Tensor) -> dict[str, float]:
    flat = errors.flatten()
    return {"max": float(flat.max()), "p99": float(flat.quantile(0.99)),
            "median": float(flat.median())}


def agreement(task: str, steps: int, worlds: int, seed: int) -> dict[str, object]:
    """Float32 mjx against native, and the native float32-rounded-state floor."""
    import robotrl.envs as E
    from robotrl.sim2real.gap import one_step_agreement, relative_error

    native = E.make(task, worlds, seed=seed, num_threads=1)
    ours, theirs = one_step_agreement(E.make(task, worlds, backend="mjx", seed=seed), native,
                                      steps, seed=seed)

    class Rounded:  # the native backend, given the float32-rounded state
        def __init__(self) -> None:
            self.env = E.make(task, worlds, seed=seed, num_threads=1)
            self.num_envs, self.spec, self.device = worlds, self.env.spec, self.env.device

        def set_state(self, state: torch.Tensor) -> None:
            self.env.set_state(state.float().double())

        def step(self, action: torch.Tensor):  # noqa: ANN201
            return self.env.step(action)

    floor, _ = one_step_agreement(Rounded(), E.make(task, worlds, seed=seed, num_threads=1),  # type: ignore[arg-type]
                                  steps, seed=seed)
    cols = slice(0, native.task.state_obs_dim)  # type: ignore[attr-defined]
    return {"state": quantiles(relative_error(ours[..., cols], theirs[..., cols])),
            "observation": quantiles(relative_error(ours, theirs)),
            "floor": quantiles(relative_error(floor, theirs))}


# ------------------------------------------------------------------------------- bisection
def bisect(task: str, steps: int, seed: int) -> dict[str, float]:
    """Float64 max |qvel difference| / (1 + max |qvel|) per control step (MJX) or substep (numpy)
    against C, over the states of a ``steps``-step native rollout with random actions."""
    import mujoco
    from mujoco.mjx._src import forward

    from robotrl.envs import mjx_fixes, registry
    from robotrl.envs.jax_bridge import jax, jnp, mjx

    task_obj = registry.make_task(task)
    skip = task_obj.frame_skip
    rng = np.random.default_rng(seed)
    out: dict[str, float] = {}
    euler_model = copy.copy(task_obj.model)
    euler_model.opt.integrator = mujoco.mjtIntegrator.mjINT_EULER
    rk4_model = task_obj.model
    schemes = {"mjx_euler_vs_c": (euler_model, forward.euler)}
    if rk4_model.opt.integrator == mujoco.mjtIntegrator.mjINT_RK4:
        schemes["mjx_textbook_rk4_vs_c"] = (rk4_model, mjx_fixes.MJX_RUNGEKUTTA4 or forward.rungekutta4)
        schemes["mjx_c_rk4_vs_c"] = (rk4_model, mjx_fixes._rungekutta4_rkmk)
    for name, (model, integrate) in schemes.items():
        mx = mjx.put_model(model)

        def control_step(d, ctrl, mx=mx, integrate=integrate):  # noqa: ANN001, ANN202
            d = d.replace(ctrl=ctrl)
            return jax.lax.fori_loop(0, skip, lambda _, d: integrate(mx, forward.forward(mx, d)), d)

        step = jax.jit(control_step)
        blank = mjx.make_data(mx)
        d = mujoco.MjData(model)
        d.qpos[:] = model.qpos0 + rng.uniform(-0.1, 0.1, model.nq)
        mujoco.mj_forward(model, d)
        worst = 0.0
        for _ in range(steps):
            ctrl = rng.uniform(model.actuator_ctrlrange[:, 0], model.actuator_ctrlrange[:, 1])
            start = blank.replace(qpos=jnp.asarray(d.qpos), qvel=jnp.asarray(d.qvel),
                                  qacc_warmstart=jnp.asarray(d.qacc_warmstart))
            d.ctrl[:] = ctrl
            for _ in range(skip):
                mujoco.mj_step(model, d)
            qvel = np.asarray(step(start, jnp.asarray(ctrl)).qvel)
            worst = max(worst, float(np.abs(qvel - d.qvel).max() / (1 + np.abs(d.qvel).max())))
        out[name] = worst
    if rk4_model.opt.integrator == mujoco.mjtIntegrator.mjINT_RK4:
        d = mujoco.MjData(rk4_model)
        d.qpos[:] = rk4_model.qpos0 + rng.uniform(-0.1, 0.1, rk4_model.nq)
        worst = {"numpy_textbook_rk4_vs_c": 0.0, "numpy_c_rk4_vs_c": 0.0}
        for _ in range(steps * skip):
            d.ctrl[:] = rng.uniform(rk4_model.actuator_ctrlrange[:, 0],
                                    rk4_model.actuator_ctrlrange[:, 1])
            mujoco.mj_forward(rk4_model, d)
            guesses = {k: mjx_fixes.rk4_step_numpy(rk4_model, d, c_scheme=k.startswith("numpy_c"))
                       for k in worst}
            mujoco.mj_step(rk4_model, d)
            for k, (_, qvel) in guesses.items():
                worst[k] = max(worst[k], float(np.abs(qvel - d.qvel).max() / (1 + np.abs(d.qvel).max())))
        out.update(worst)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--steps", type=int, default=200, help="control steps per task")
    parser.add_argument("--worlds", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mjx-rk4", action="store_true",
                        help="MJX's own textbook RK4 instead of C's scheme (before the fix)")
    parser.add_argument("--bisect", action="store_true", help="the float64 bisection instead")
    parser.add_argument("--out", default="benchmarks/figures/mjx_fidelity.json",
                        help="the JSON written (default: %(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    console = Console()
    import jax

    if args.bisect:
        jax.config.update("jax_enable_x64", True)
    from mujoco.mjx._src import forward

    from robotrl.envs import jax_bridge, mjx_fixes

    if args.mjx_rk4 and mjx_fixes.MJX_RUNGEKUTTA4 is not None:
        forward.rungekutta4 = mjx_fixes.MJX_RUNGEKUTTA4
    rk4 = "MJX's textbook RK4" if args.mjx_rk4 else f"C's RK4 ({jax_bridge.RK4_SCHEME})"
    mode = "float64 bisection" if args.bisect else f"float32, {rk4}"
    console.print(banner("mjx fidelity", mode, f"jax {jax.__version__}",
                         f"{args.steps} steps x {args.worlds} worlds"))
    rows: dict[str, dict[str, object]] = {}
    checks = []
    for task in args.tasks:
        console.print(f"[bold]{task}[/] ...")
        if args.bisect:
            rows[task] = bisect(task, args.steps, args.seed)
            continue
        rows[task] = row = agreement(task, args.steps, args.worlds, args.seed)
        worst = row["state"]["max"]  # type: ignore[index]
        checks.append(check(f"{task}: one-step agreement of the state <= {TARGET:g}", worst,
                            worst <= TARGET))
    table = Table(title=f"mjx vs native ({mode})")
    table.add_column("task")
    if args.bisect:
        names = sorted({k for r in rows.values() for k in r})
        for name in names:
            table.add_column(name.replace("_vs_c", " vs C").replace("_", " "), justify="right")
        for task, r in rows.items():
            table.add_row(task, *(f"{r[n]:.1e}" if n in r else "-" for n in names))  # type: ignore[str-format]
    else:
        for col in ("state max", "state p99", "state median", "obs max", "floor max"):
            table.add_column(col, justify="right")
        for task, r in rows.items():
            s, o, f = r["state"], r["observation"], r["floor"]  # type: ignore[index]
            table.add_row(task, f"{s['max']:.1e}", f"{s['p99']:.1e}", f"{s['median']:.1e}",
                          f"{o['max']:.1e}", f"{f['max']:.1e}")
    console.print(table)
    print_checks(console, checks, lambda c: f": {c['value']:.1e}")
    write_json(args.out, {"meta": {**machine_meta(), "jax": jax.__version__, "mode": mode,
                                   "steps": args.steps, "worlds": args.worlds,
                                   "seed": args.seed, "argv": sys.argv[1:]},
                          "rows": rows, "checks": checks}, console)


if __name__ == "__main__":
    main()
