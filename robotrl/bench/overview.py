"""The site's results overview: one short table per family of grids (``Grid.family``), from the
summaries the grids' own pages are computed from (``report.report``), so a mark here and the
interval on the grid's page cannot disagree.

Each row is a grid's target; each column one of robotrl's algorithms; each cell the IQM over
seeds of the final evaluation at the grid's largest budget and its verdict: ✓ where it reaches
the grid's threshold or lies within or above the peer's 95% interval, ✗ where it does not, no
mark where the grid has neither. A grid whose cells start from an ``init`` stage shows the
mean before -> after and ✓ where the paired gain's 95% interval lies above 0. A grid's line
counts its cells' verdicts and the literature orderings it checks (met / checked, robotrl's
runs). Details, intervals and notes stay on each grid's page, linked from the table.
"""

from __future__ import annotations

from typing import Any

from robotrl.bench.grid import FAMILIES, ROBOTRL, Grid
from robotrl.bench.report import plural

PASS, MISS = "✓", "✗"


def _number(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}" if abs(x) < 1 else f"{x:.1f}"


def verdict(cell: dict[str, Any], peers: dict[str, str]) -> str:
    """✓/✗ for one of our cells: its threshold, else where it lies against its peers'
    intervals (``report.against_peer``'s values for this cell); '' with neither."""
    if "pass" in cell:
        return PASS if cell["pass"] else MISS
    if peers:
        return MISS if "below" in peers.values() else PASS
    return ""


def headline_section(grid: Grid, summary: dict[str, Any]) -> dict[str, Any] | None:
    """The summary's section of the grid's largest budget with finished cells (None: none)."""
    return next((summary["budgets"][str(b)] for b in sorted(grid.all_budgets, reverse=True)
                 if summary["budgets"][str(b)]["cells"]), None)


def grid_rows(grid: Grid, section: dict[str, Any]) -> tuple[list[list[str]], int, int]:
    """(one row per target: [target, cell per algorithm of ``grid.algos``], cells with a
    verdict, cells passing) of a summary's ``section`` (``headline_section``)."""
    rows, judged, passed = [], 0, 0
    for target in grid.targets:
        row = [target]
        for algo in grid.algos:
            cell = section["cells"].get(f"{target}|{algo}")
            if cell is None:
                row.append("")
                continue
            peers = {k.rsplit("|", 1)[1]: v for k, v in section["against_peer"].items()
                     if k.startswith(f"{target}|{algo}|")}
            mark, text = verdict(cell, peers), _number(cell["iqm"][0])
            gain = section["init"].get(f"{target}|{algo}", {}).get("paired", {}).get(grid.metric)
            if gain is not None:
                mark = PASS if gain["gain"][1] > 0 else MISS
                text = f"{_number(gain['before'][0])} → {_number(gain['after'][0])}"
            judged += bool(mark)
            passed += mark == PASS
            row.append(f"{text} {mark}".strip())
        if any(row[1:]):
            rows.append(row)
    return rows, judged, passed


def overview(grids: list[tuple[Grid, dict[str, Any], str, list[str]]]) -> str:
    """The overview page in Markdown: ``grids`` (each with its summary, ``report.report``'s, its
    page's address and its figures' addresses) under their families' headings, in ``FAMILIES``
    order; a family's table shows the first figure of its first grid that has one."""
    lines = ["# Results", "",
             "Each table is computed from the benchmark grids' committed results files when the "
             "site is built. A cell is the IQM over seeds of the final evaluation at the grid's "
             f"budget: {PASS} reaches the grid's threshold (rl-zoo's published return, a "
             f"literature ordering) or lies within or above the reference implementation's 95% "
             f"interval, {MISS} does not. Intervals, seeds, wall clock, machines and the reason "
             "for each miss are on each grid's page.", ""]
    for family, heading in FAMILIES.items():
        # the largest grid first: a family's headline table and figure
        members = sorted((m for m in grids if m[0].family == family),
                         key=lambda m: (-len(m[0].targets) * len(m[0].algos), m[0].name))
        if not members:
            continue
        lines += [f"## {heading}", ""]
        shown_figure = False
        for grid, summary, page, figures in members:
            section = headline_section(grid, summary)
            rows, judged, passed = grid_rows(grid, section) if section else ([], 0, 0)
            budget = max(grid.all_budgets)
            unit = "updates" if grid.offline else "steps"
            seeds = plural(len(grid.seeds), "seed")
            score = f"; {passed} of {judged} ✓" if judged else ""
            found = [o for o in (section or {}).get("orderings", []) if o["runner"] == ROBOTRL]
            if found:
                met = sum(o["met"] for o in found)
                score += f"; orderings met {met} of {len(found)}"
            lines += [f"**[{grid.name}]({page})**: {budget:,} {unit}, {seeds}, "
                      f"metric `{grid.metric}`{score}", ""]
            if family == "archive" or not rows:
                continue
            lines += ["| target | " + " | ".join(grid.algos) + " |",
                      "|---|" + "---|" * len(grid.algos)]
            lines += ["| " + " | ".join(row) + " |" for row in rows]
            lines.append("")
            if not shown_figure and figures:
                lines += [f"![{grid.name}]({figures[0]})", ""]
                shown_figure = True
    return "\n".join(lines) + "\n"
