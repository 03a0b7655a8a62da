"""Pages generated at build time (mkdocs-gen-files runs this file), so they cannot drift.

- ``reference/``: one API page per public module (every module of ``robotrl``, ``robotrl.envs``,
  ``robotrl.algos`` and ``robotrl.sim2real`` but the CLI and ``_private`` ones), rendered by
  mkdocstrings from the docstrings, and the navigation over them (``SUMMARY.md``, read by
  mkdocs-literate-nav).
- ``results/``: every benchmark grid's report, computed by the harness's report code from the
  grid's committed results file (the compact records of its run directories) exactly as
  ``robotrl bench report GRID --check`` computes it, with its figures.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("robotrl", "robotrl.envs", "robotrl.algos", "robotrl.sim2real")
SKIPPED = ("robotrl.cli",)  # commands, documented in the guides; not an API


def public_modules() -> list[str]:
    """Every importable public module name, sorted."""
    names = set(PACKAGES)
    for package in PACKAGES:
        path = importlib.import_module(package).__path__
        for info in pkgutil.walk_packages(path, package + "."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                names.add(info.name)
    return sorted(n for n in names if not n.startswith(SKIPPED))


def reference_pages() -> None:
    nav = mkdocs_gen_files.Nav()
    for name in public_modules():
        parts = tuple(name.split("."))
        page = Path("reference", *parts[1:] or ("robotrl",), "index.md")
        nav[parts] = page.relative_to("reference").as_posix()
        with mkdocs_gen_files.open(page, "w") as f:
            f.write(f"# `{name}`\n\n::: {name}\n")
    with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as f:
        f.writelines(nav.build_literate_nav())


def result_pages() -> None:
    from robotrl.bench.grid import load_grid
    from robotrl.bench.harness import committed_records
    from robotrl.bench.overview import overview
    from robotrl.bench.report import figure_paths, report

    entries = []
    for path in sorted((ROOT / "benchmarks" / "grids").glob("*.yaml")):
        grid = load_grid(path)
        if not grid.results_path.is_file():
            continue
        records = committed_records(grid)
        text, summary = report(grid, records, with_figures=False)
        name = path.stem
        with mkdocs_gen_files.open(f"results/{name}.md", "w") as f:
            f.write(text)
            f.write(f"\n\nGrid: `benchmarks/grids/{path.name}`; results: "
                    f"`{grid.results_path}`.\n")
        shown = []
        for _, _, figure in figure_paths(grid, records, grid.report_path.parent / "figures"):
            if figure.is_file():
                with mkdocs_gen_files.open(f"results/figures/{figure.name}", "wb") as f:
                    f.write(figure.read_bytes())
                shown.append(f"figures/{figure.name}")
        entries.append((grid, summary, f"{name}.md", shown))
    with mkdocs_gen_files.open("results/index.md", "w") as f:
        f.write(overview(entries))
        f.write("\nEvery grid is declared in `benchmarks/grids/`; how to run one: "
                "[Benchmark a learner](../guides/benchmarks.md).\n")


reference_pages()
result_pages()
