"""``robotrl checkpoint upgrade PATH [PATH ...]``: convert checkpoints of robotrl's earlier
pickle format to the data-only format (``robotrl.checkpoint``), in place.

Reading the old format unpickles the file, and unpickling runs whatever code the file carries:
this command is the one place robotrl does it, and only for the paths named on its command line
(a run directory means every ``*.pt`` under its ``checkpoints/``). Run it on your own runs, or on
files whose source you trust as you would trust a program from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

USAGE = "usage: robotrl checkpoint upgrade PATH [PATH ...]   (a .pt file or a run directory)"


def _targets(arg: str) -> list[Path]:
    path = Path(arg)
    if path.is_dir():
        folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        return sorted(folder.glob("*.pt"))
    return [path]


def checkpoint_main(argv: list[str]) -> None:
    from robotrl.checkpoint import CheckpointError, upgrade_checkpoint

    if len(argv) < 2 or argv[0] != "upgrade":
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    paths = [p for arg in argv[1:] for p in _targets(arg)]
    if not paths:
        print(f"error: no checkpoints (*.pt) under {argv[1:]}", file=sys.stderr)
        raise SystemExit(2)
    for path in paths:
        print(f"trusting {path} and unpickling it (this runs any code it carries) ...")
        try:
            upgrade_checkpoint(path)
        except CheckpointError as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        print(f"  {path}: now data only (safetensors + JSON)")
