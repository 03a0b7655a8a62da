"""A filmstrip of a trained velocity-task policy: world 0 held at one command, a frame every
``--every`` seconds from the task's view camera, each captioned with the time and the bodies
other than feet on the ground at that instant (``task.bodies_on_ground``).

    python benchmarks/robot_filmstrip.py --checkpoint runs/go1 --command 0.8,0,0.4 \\
        [--frames 6] [--every 1.0] [--size 320] --out docs/assets/go1_walk.png

The README's and the quadruped guide's Go1 figure is this script's output. Nominal physics,
the policy's deterministic action, the run's own evaluation seed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from robotrl.experiment.build import load_trained
from robotrl.runners.evaluation import run_episodes
from robotrl.types import obs_to


def filmstrip(checkpoint: str, command: tuple[float, float, float], frames: int, every: float,
              size: int) -> tuple[list[np.ndarray], list[str], str]:
    """``frames`` images of world 0 ``every`` seconds apart from t=0, their captions, the
    task's name."""
    run = load_trained(checkpoint, 1, options={"command_grid": [list(command)]})
    env, alg = run.env, run.alg
    base = getattr(env, "unwrapped", env)
    stride = max(1, round(every / env.spec.control_dt))

    def caption(t: float) -> str:
        down = int(base.task.bodies_on_ground(base.sim)[0].sum()) if hasattr(
            base.task, "bodies_on_ground") else 0
        return f"t = {t:g} s" + (
            f", {down} bod{'y' if down == 1 else 'ies'} on the ground" if down else ", on its feet")

    try:
        images = [env.render(0, size, size)]
    except Exception as err:  # noqa: BLE001 - GL backends fail in many ways
        raise SystemExit(f"offscreen rendering failed ({type(err).__name__}: {err}); set "
                         "MUJOCO_GL=egl (or osmesa) before starting") from None
    captions = [caption(0.0)]
    state = {"step": 0, "done": False}

    def on_step(env_: object, out: object) -> None:
        state["step"] += 1
        if state["done"] or len(images) >= frames or state["step"] % stride:
            return
        if bool(out.terminated[0] | out.truncated[0]):  # type: ignore[attr-defined]
            state["done"] = True
        images.append(env.render(0, size, size, final=state["done"]))
        captions.append(caption(state["step"] * env.spec.control_dt))

    device = torch.device(run.cfg.device)
    run_episodes(env, run.reset(), lambda o: alg.act_deterministic(obs_to(o, device)).cpu(),
                 max_steps=stride * frames, on_step=on_step)
    return images[:frames], captions[:frames], run.cfg.env.task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="a run directory or checkpoint file")
    p.add_argument("--command", default="0.8,0,0.4", help="vx,vy,yaw rate")
    p.add_argument("--frames", type=int, default=6)
    p.add_argument("--every", type=float, default=1.0, help="seconds between frames")
    p.add_argument("--size", type=int, default=320, help="pixels a side per frame")
    p.add_argument("--out", required=True, help="a .png file")
    args = p.parse_args()
    try:
        command = tuple(float(v) for v in args.command.split(","))
    except ValueError:
        raise SystemExit(f"--command takes vx,vy,yaw, e.g. 0.8,0,0.4; got {args.command!r}") from None
    if len(command) != 3:
        raise SystemExit(f"--command takes three numbers vx,vy,yaw; got {args.command!r}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    images, captions, task = filmstrip(args.checkpoint, command, args.frames, args.every,
                                       args.size)
    fig, axes = plt.subplots(1, len(images), figsize=(2.2 * len(images), 2.5))
    for ax, image, text in zip(np.atleast_1d(axes), images, captions, strict=True):
        ax.imshow(image)
        ax.set_title(text, fontsize=8)
        ax.axis("off")
    fig.suptitle(f"{task}: {command[0]:g} m/s forward, {command[1]:g} m/s sideways, "
                 f"{command[2]:g} rad/s", fontsize=9)
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    tmp.replace(out)
    print(f"wrote {out} ({len(images)} frames: {'; '.join(captions)})")


if __name__ == "__main__":
    main()
