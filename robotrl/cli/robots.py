"""``robotrl robots [list]`` and ``robotrl robots offline out=DIR [wheel=FILE.whl]``.

``list`` names each robot description (``configs/robot``), its Menagerie model and where that
model is read from now: ``MENAGERIE_ROOT``, mujoco-menagerie's cache, or a download on first use.
``offline`` lays out the Go1 and G1 that mjlab's wheel ships (``pip download --no-deps
mjlab==1.6.0``, or the ``wheel`` given) as a Menagerie-shaped folder for ``MENAGERIE_ROOT``, on
machines that reach PyPI but not GitHub.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from robotrl.cli.args import parse_kv


def robots_main(argv: list[str]) -> None:
    from robotrl.logging import console

    what = argv[0] if argv and "=" not in argv[0] else "list"
    args = parse_kv(argv[1:] if argv and "=" not in argv[0] else argv,
                    {"out": str, "wheel": str})
    if what == "list":
        _list(console)
    elif what == "offline":
        if "out" not in args:
            raise SystemExit("robotrl robots offline needs out=DIR (the folder MENAGERIE_ROOT "
                             "will name)")
        root = offline_root(Path(str(args["out"])), args.get("wheel"))
        console.print(f"Go1 and G1 laid out under {root}; use them with\n"
                      f"  export MENAGERIE_ROOT={root.resolve()}")
    else:
        raise SystemExit(f"unknown robots command {what!r}; known: list, offline")


def _list(console: object) -> None:
    from robotrl.envs.robots import list_robots, robot_description

    root = os.environ.get("MENAGERIE_ROOT")
    for name in list_robots():
        desc = robot_description(name)
        if root:
            where = f"MENAGERIE_ROOT={root}" + ("" if (Path(root) / desc.menagerie).is_dir()
                                                 else " (missing: set it or unset it)")
        else:
            try:
                import mujoco_menagerie
                from mujoco_menagerie import Cache

                robot = mujoco_menagerie.get(desc.menagerie)
                where = ("cached" if Cache().is_cached(robot) else "downloaded from GitHub on "
                         f"first use ({(robot.download_size or 0) / 1e6:.1f} MB)")
            except ImportError:
                where = "needs mujoco-menagerie: pip install 'robotrl[robots]'"
        console.print(f"{name:6s} {desc.menagerie}/{desc.entry}: {len(desc.joints)} joints, "
                      f"{len(desc.feet)} feet; {where}")  # type: ignore[attr-defined]


def offline_root(out: Path, wheel: object | None = None) -> Path:
    """``out`` laid out from mjlab's wheel (downloaded with pip unless ``wheel`` names one)."""
    from robotrl.envs.robots import download_mjlab_wheel, menagerie_root_from_wheel

    out.mkdir(parents=True, exist_ok=True)
    if wheel is not None:
        return menagerie_root_from_wheel(Path(str(wheel)), out)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            return menagerie_root_from_wheel(download_mjlab_wheel(tmp), out)
        except RuntimeError as err:
            raise SystemExit(str(err)) from None
