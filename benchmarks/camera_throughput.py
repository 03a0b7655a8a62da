"""Images/s of the ray-cast policy camera (``robotrl.envs.camera.RayCamera``) next to MuJoCo's
OpenGL ``mujoco.Renderer``, on the same scene and camera, measured in the same run.

    python benchmarks/camera_throughput.py                            # 64, 256 worlds; 32, 64 px
    python benchmarks/camera_throughput.py --worlds 1024 --size 32 --repeats 7

* ``RayCamera.render``: RGB images [n, 3, S, S] uint8 of all n worlds of a ``mujoco.batch.Batch``
  in one call (one ray per pixel through ``Batch.ray`` on the batch's threads, then Lambert
  shading in torch on one thread).
* ``Batch.ray`` alone: the same rays with normals, no shading: the engine's share.
* ``mujoco.Renderer``: ``update_scene`` + ``render`` of one RGB frame per world, from each world's
  MjData (materialized and forwarded beforehand, untimed: the Renderer's cost alone, which
  flatters it, since a batch must also hand it each world). It draws one frame at a time, so its
  rate does not grow with the world count. Its OpenGL device (EGL; on a machine without a GPU,
  Mesa's llvmpipe on the CPU) is printed beside it. Timed as it comes (shadows and reflections
  on) and with both off, nearer to the ray camera's flat shading.

Each contestant is timed ``--repeats`` times (each repeat at least ``--seconds`` of calls), the
contestants interleaved so that a burst of load from other processes hits them alike; the table
shows the best repeat (least time) and the median, and the ratio of best rates.

Scene: ``robotrl.envs.tasks.tabletop.Tabletop`` (its fixed camera ``top``), every joint placed
uniformly in [-0.15, 0.15]; without that module, the scene of ``tests/envs/test_camera.py``.
"""

from __future__ import annotations

import os

# MuJoCo picks its OpenGL backend when first imported (headless: EGL)
os.environ.setdefault("MUJOCO_GL", "egl")

import argparse  # noqa: E402
import functools  # noqa: E402
import importlib.util  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import mujoco  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import banner, best_median, machine_meta, warn_if_loaded, write_json  # noqa: E402
from mujoco.batch import Batch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from robotrl.envs.camera import RayCamera  # noqa: E402

RENDERERS = ("mujoco.Renderer", "mujoco.Renderer, no shadows")
"""The Renderer as it comes (shadows and reflections on), and without either (closer to what the
ray camera draws; shadow maps dominate a software GL's time)."""
FLAT = RENDERERS[1]
SPREAD = 0.15
"""Joint positions are drawn uniformly in [-SPREAD, SPREAD] (objects spread over the table)."""


def load_scene() -> tuple[mujoco.MjModel, str, str]:
    """(model, camera name, scene label): the tabletop task's, else the camera test's scene."""
    try:
        from robotrl.envs.tasks.tabletop import Tabletop
    except ImportError:
        path = Path(__file__).resolve().parents[1] / "tests" / "test_camera.py"
        spec = importlib.util.spec_from_file_location("test_camera", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.scene(), "top", "tests/envs/test_camera.py scene"
    return Tabletop.load_model(), Tabletop.camera, "tabletop"


def make_batch(model: mujoco.MjModel, n: int, threads: int, seed: int = 0) -> Batch:
    """A forwarded batch of ``n`` worlds in random positions."""
    batch = Batch(model, n, nthread=threads)
    rng = np.random.default_rng(seed)
    batch.qpos[:] = rng.uniform(-SPREAD, SPREAD, (n, model.nq))
    batch.forward()
    return batch


def timed(fn: Callable[[], int], seconds: float) -> float:
    """Images/s of ``fn`` (which returns the images it made) over at least ``seconds``."""
    images, t0 = 0, time.perf_counter()
    while True:
        images += fn()
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return images / dt


def gl_device(renderer: mujoco.Renderer) -> str:
    """The OpenGL renderer string of ``renderer``'s context (e.g. a GPU, or Mesa llvmpipe)."""
    try:
        from OpenGL import GL

        renderer._gl_context.make_current()  # the Renderer exposes no getter
        return GL.glGetString(GL.GL_RENDERER).decode()
    except Exception as err:  # only a label: never fail the benchmark over it
        return f"unknown ({type(err).__name__})"


def contestants(model: mujoco.MjModel, camera: str, n: int, size: int, threads: int,
                console: Console) -> tuple[dict[str, Callable[[], int]], str | None]:
    """Label -> a call that makes images and returns how many; the Renderer's GL device."""
    batch = make_batch(model, n, threads)
    cam = RayCamera(model, camera, size, size)
    # the camera's rays, already tiled to every world as the camera hands them to Batch.ray
    pnt, vec = (np.ascontiguousarray(np.broadcast_to(x, (n, *x.shape)))
                for x in (cam.pnt, cam.vec))
    calls: dict[str, Callable[[], int]] = {
        "RayCamera.render": lambda: len(cam.render(batch)),
        "Batch.ray only": lambda: len(batch.ray(pnt, vec, geomgroup=cam.geomgroup,
                                                normal=True)[0]),
    }
    try:
        renderers = [mujoco.Renderer(model, size, size) for _ in RENDERERS]
    except Exception as err:  # no OpenGL here: the ray camera is still timed
        console.print(f"[yellow]skip mujoco.Renderer: {type(err).__name__}: {err}[/]")
        return calls, None
    flat = renderers[RENDERERS.index(FLAT)].scene.flags
    flat[mujoco.mjtRndFlag.mjRND_SHADOW] = flat[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
    datas = []
    for i in range(n):
        data = batch.get_data(i)
        mujoco.mj_forward(model, data)
        datas.append(data)

    def render_all(renderer: mujoco.Renderer) -> int:
        for data in datas:
            renderer.update_scene(data, camera=camera)
            renderer.render()
        return len(datas)

    for label, renderer in zip(RENDERERS, renderers, strict=True):
        calls[label] = functools.partial(render_all, renderer)
    return calls, gl_device(renderers[0])


def fmt_rate(x: float) -> str:
    return f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def measure(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """{size: {"rates": {label: {n: [images/s per repeat]}}, "gl": device}}."""
    model, camera, _ = load_scene()
    results: dict[str, Any] = {}
    for size in args.size:
        res: dict[str, Any] = {"rates": {}, "gl": None}
        for n in args.worlds:
            calls, gl = contestants(model, camera, n, size, args.threads, console)
            res["gl"] = res["gl"] or gl
            for fn in calls.values():  # warm-up: first-call allocations, GL shader compilation
                fn()
            for r in range(args.repeats):
                console.print(f"[dim]{size}x{size}, {n} worlds: repeat {r + 1}/{args.repeats}[/]")
                for label, fn in calls.items():
                    res["rates"].setdefault(label, {}).setdefault(n, []).append(
                        timed(fn, args.seconds))
        results[size] = res
    return results


def print_table(size: int, res: dict[str, Any], worlds: list[int], repeats: int,
                console: Console) -> None:
    table = Table(title=f"{size}x{size} RGB", caption=f"images/s: best / median of {repeats} "
                  "repeats (best = least time)")
    table.add_column("contestant")
    for n in worlds:
        table.add_column(f"{n} worlds", justify="right")
    for label, by_n in res["rates"].items():
        cells = [best_median(by_n[n]) for n in worlds]
        mark = f" ({res['gl']})" if label == RENDERERS[0] else ""
        table.add_row(label + mark, *(f"{fmt_rate(c['best'])} / {fmt_rate(c['median'])}"
                                      for c in cells))
    ours = res["rates"]["RayCamera.render"]
    if RENDERERS[0] in res["rates"]:
        table.add_section()
    for label in RENDERERS:
        if label in res["rates"]:
            ratio = [max(ours[n]) / max(res["rates"][label][n]) for n in worlds]
            table.add_row(f"RayCamera / {label.removeprefix('mujoco.')}",
                          *(f"{r:.1f}x" for r in ratio))
    console.print(table)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--worlds", nargs="+", type=int, default=[64, 256], help="world counts")
    p.add_argument("--size", nargs="+", type=int, default=[32, 64],
                   help="image sides in pixels (square images)")
    p.add_argument("--repeats", type=int, default=5, help="measurements per contestant")
    p.add_argument("--seconds", type=float, default=0.3, help="least wall time per measurement")
    p.add_argument("--threads", type=int, default=0, help="Batch threads (0: all cores)")
    p.add_argument("--out", default="benchmarks/figures/camera_throughput.json",
                   help="the JSON of every figure (default: %(default)s)")
    args = p.parse_args(argv)
    if args.repeats < 1 or min(args.worlds) < 1 or min(args.size) < 1:
        p.error("--repeats, --worlds and --size must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # the shading is small; the batch's threads do the ray casting
    console = Console(width=max(Console().width, 100))
    _, _, scene = load_scene()
    console.print(banner("robotrl camera throughput", f"scene: {scene}",
                         f"{args.seconds} s x {args.repeats} repeats"))
    warn_if_loaded(console)
    results = measure(args, console)
    for size, res in results.items():
        print_table(size, res, args.worlds, args.repeats, console)
    figures = {"meta": {**machine_meta(), "scene": scene, **vars(args)},
               "results": {str(size): {"gl": res["gl"], "rates": {
                   label: {str(n): {**best_median(r), "all": r,
                                    "spread": statistics.pstdev(r)} for n, r in by_n.items()}
                   for label, by_n in res["rates"].items()}} for size, res in results.items()}}
    write_json(args.out, figures, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
