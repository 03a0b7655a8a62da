"""Check the import layers of ``[tool.importlinter]`` in pyproject.toml.

The source tree maps ``envs/``, ``algos/``, ``sim2real/`` and ``configs/`` to ``robotrl.envs``
... with setuptools' ``package-dir``, which import-linter's static reader cannot follow. This
lays the package out as a wheel installs it (a temporary copy of the ``.py`` files, read from
``package-dir``) and runs ``lint-imports`` on it; the exit status is lint-imports'.

    python .ci/lint_imports.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI (the dev extra)
    import tomli as tomllib


ROOT = Path(__file__).resolve().parents[1]


def stage(into: Path) -> None:
    """The ``.py`` files of every package in pyproject's ``package-dir``, at their import path."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, folder in setup["package-dir"].items():
        src, dst = ROOT / folder, into.joinpath(*package.split("."))
        nested = [f for p, f in setup["package-dir"].items() if p != package and p.startswith(package)]
        for file in src.rglob("*.py"):
            rel = file.relative_to(src)
            if any((src / rel).is_relative_to(ROOT / n) for n in nested):
                continue
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, dst / rel)


def main() -> int:
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    with tempfile.TemporaryDirectory() as tmp:
        stage(Path(tmp))
        env = {**os.environ, "PYTHONPATH": tmp}
        return subprocess.call([lint, str(ROOT / "pyproject.toml"),
                                "--no-cache"], cwd=tmp, env=env)


if __name__ == "__main__":
    raise SystemExit(main())
