"""MkDocs hooks (``hooks:`` in mkdocs.yml): work that must happen before any plugin starts."""

from __future__ import annotations

import shutil
from pathlib import Path

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parent.parent


@event_priority(100)  # before mkdocstrings' on_config, which creates the Python handler
def on_config(config):
    """Write ``build/api_src/robotrl``, a copy of the package's sources laid out as installed
    (``envs/`` as ``robotrl/envs`` and so on), where mkdocstrings reads them (``paths`` in
    mkdocs.yml): griffe finds modules by folder and follows neither setuptools' ``package-dir``
    mapping nor symlinks out of its search path.

    It must exist before mkdocstrings' handler is created: the handler drops a ``paths`` entry
    that does not exist yet and falls back to the repository root, where ``robotrl.algos`` is
    not a folder (the failure a fresh clone showed when gen-files wrote this tree)."""
    tree = ROOT / "build" / "api_src" / "robotrl"
    shutil.rmtree(tree, ignore_errors=True)
    skip = shutil.ignore_patterns("__pycache__", "*.yaml", "*.xml")
    shutil.copytree(ROOT / "robotrl", tree, ignore=skip)
    for name in ("envs", "algos", "sim2real"):
        shutil.copytree(ROOT / name, tree / name, ignore=skip)
    return config
