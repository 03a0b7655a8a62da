"""``robotrl bench``: run a declared grid and report it from its run directories.

    robotrl bench run benchmarks/grids/offline.yaml [jobs=2] [launcher=joblib] [only=0,5|missing]
                      [seeds=[0]] [budgets=[2000]] [out=runs/x]    (any top-level grid field)
    robotrl bench report benchmarks/grids/offline.yaml [--check]
    robotrl bench list benchmarks/grids/offline.yaml

``run`` runs every cell not finished here (``robotrl.bench.harness``), or with ``only=missing``
every cell neither finished here nor in the results file, then reports. ``list`` numbers the
cells, says which are done here, committed from another machine, started, stale or to do, and
estimates the run-hours left from the finished runs' wall clock. ``report`` gathers
every cell's compact record into the grid's results file (records of cells that are not on this
machine are kept from it), writes the markdown report and prints it; ``--check`` writes nothing
and exits 1 when the committed report differs from what the committed results give.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ACTIONS = ("run", "report", "list")
OPTIONS = {"launcher": str, "jobs": int, "only": str, "figures": bool}


def _parse(argv: list[str]) -> tuple[str, str, dict[str, Any], dict[str, Any], list[str], bool]:
    """(action, grid path, grid field overrides, options, Hydra arguments, --check)."""
    import yaml

    from robotrl.cli.args import parse_kv

    if len(argv) < 2 or argv[0] not in ACTIONS:
        raise SystemExit(f"usage: robotrl bench {{{'|'.join(ACTIONS)}}} GRID.yaml [key=value ...]")
    action, path, rest = argv[0], argv[1], argv[2:]
    check = "--check" in rest
    hydra_args = [a for a in rest if a.startswith(("hydra.", "hydra/", "+hydra"))]
    fields, options = {}, []
    for arg in rest:
        if arg in hydra_args or arg == "--check":
            continue
        key = arg.split("=", 1)[0]
        if key in OPTIONS:
            options.append(arg)
        elif "=" in arg:
            fields[key] = yaml.safe_load(arg.split("=", 1)[1])
        else:
            raise SystemExit(f"expected key=value, got {arg!r}")
    return action, path, fields, parse_kv(options, OPTIONS), hydra_args, check


def _merged(grid: Any, check: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(this grid's records: this machine's, with the results file's for cells not run here;
    the results file's records of cells outside this invocation's grid, e.g. ``seeds=[0]``).

    ``check`` (``--check``: does the committed report say what the committed results say?)
    reads the results file alone (``robotrl.bench.harness.committed_records``); writing the
    report (no ``--check``) marks a cell whose record is of a config the grid no longer
    composes missing (stale)."""
    from robotrl.bench.harness import (
        STALE,
        collect,
        committed_records,
        current,
        other_recording,
        record_key,
        saved_records,
        stale,
        started_elsewhere,
        under_way,
    )
    from robotrl.logging import console

    if check:
        def warn(text: str) -> None:
            console.print(f"[yellow]warning: {text}[/yellow]")

        return committed_records(grid, warn), []
    saved = saved_records(grid)
    done = {record_key(r): r for r in saved if "final" in r}
    started = {record_key(r): r for r in saved if under_way(r)}
    stale_here = {record_key(r): r for r in saved if stale(r)}
    cells = {record_key(vars(c)): c for c in grid.cells()}

    def reuse(r: dict[str, Any]) -> dict[str, Any]:
        """A cell not finished here: the results file's record of it, unless that record is of
        a config the cell no longer composes or of another recording of its dataset than the
        one on disk (then the cell stays missing, marked stale); for a cell not started here,
        how far the results file says it got elsewhere."""
        old = done.get(record_key(r))
        if old is None:
            if r["missing"] != "not run":
                return r
            if record_key(r) in started:
                return started_elsewhere(started[record_key(r)])
            return stale_here.get(record_key(r), r)  # the results file's word that it is stale
        cell = cells[record_key(r)]
        if not current(grid, cell, old):
            why = "a config the grid no longer composes (a tuned file or a default changed)"
        elif other_recording(grid, cell.target, old.get("data")):
            why = "another recording of the dataset than the one on disk"
        else:
            return old
        if stale(r):
            return r
        return {**r, "missing": f"{STALE}: the results file's record is of {why}"}

    records = [reuse(r) if "missing" in r else r for r in collect(grid)]
    mine = {record_key(r) for r in records}
    return records, [r for r in saved if record_key(r) not in mine]


def write_results(grid: Any, records: list[dict[str, Any]], kept: list[dict[str, Any]]) -> None:
    """The grid's results file: every finished record, the ``kept`` ones first, how far each
    started one got and why each stale one is (their missing reasons: the committed report
    says them too, and ``--check`` reads them back)."""
    from robotrl.bench.harness import stale, under_way
    from robotrl.checkpoint import write_json

    saved = kept + [r for r in records if "final" in r or under_way(r) or stale(r)]
    write_json(grid.results_path, {"grid": grid.name, "records": saved}, indent=1)


def _check_cards(datasets: list[str]) -> None:
    """Every dataset readable and with reference returns, before anything is launched."""
    from robotrl.data import DatasetError, load_card

    for d in datasets:
        try:
            card = load_card(d)
        except DatasetError as err:
            raise SystemExit(f"dataset error: {err}") from None
        if card.ref_min_score is None or card.ref_max_score is None:
            raise SystemExit(f"dataset error: {d} has no reference returns (ref_min_score, "
                             "ref_max_score) for normalized scores; record it with robotrl "
                             "dataset collect ... expert=EXPERT.pt, or set metric: return_mean")


def _indices(value: object, count: int) -> list[int]:
    """``only=3,5,7`` or ``only=[3,5,7]`` (Hydra's list syntax) -> cell indices, checked."""
    text = str(value).strip().removeprefix("[").removesuffix("]")
    try:
        only = [int(i) for i in text.split(",") if i.strip()]
    except ValueError:
        raise SystemExit(f"only= takes cell indices (`robotrl bench list GRID` numbers them) "
                         f"or missing, e.g. only=3,5, only=[3,5] or only=missing; got {value!r}"
                         ) from None
    if not only or any(not 0 <= i < count for i in only):
        raise SystemExit(f"only= indices must be in 0..{count - 1}, got {value!r}")
    return only


def _missing(grid: Any) -> list[int]:
    """``only=missing``: the cells neither finished here nor committed from another machine."""
    from robotrl.bench.harness import TO_RUN, plan

    return [i for i, e in enumerate(plan(grid)) if e["state"] in TO_RUN]


def _list(grid: Any) -> None:
    """Every cell, its state (``robotrl.bench.harness.plan``) and run directory, and what is
    left to run with the minutes it should take, from the wall clock of the finished runs."""
    from collections import Counter

    from robotrl.bench.harness import PLAN_STATES, TO_RUN, estimate, finished_elsewhere, plan
    from robotrl.logging import console

    entries = plan(grid)
    minutes = estimate(entries, finished_elsewhere(grid))
    for i, e in enumerate(entries):
        cell, state = e["cell"], e["state"]
        notes = []
        if "seconds" in e:
            notes.append(f"{e['seconds'] / 60:.0f} min")
        if e.get("machine"):
            notes.append(f"on {e['machine']}")
        if state == "started":
            notes.append(f"{e['left']:.0%} left")
        if "recording" in e:
            notes.append("committed on another recording of its dataset: digest {} in the "
                         "results, {} on disk".format(*e["recording"]))
        if i in minutes:
            where = minutes[i][1]
            notes.append(f"about {minutes[i][0]:.0f} min to run"
                         + (f" as in {where}" if where else ""))
        console.print(f"{i:4d} {state:9s} {cell.label} -> {grid.run_dir(cell)}"
                      + (f" ({', '.join(notes)})" if notes else ""), highlight=False, soft_wrap=True)
    counts = Counter(e["state"] for e in entries)
    left = [i for i, e in enumerate(entries) if e["state"] in TO_RUN]
    hours = sum(minutes[i][0] for i in left if i in minutes) / 60
    unknown = sum(i not in minutes for i in left)
    said = ", ".join(f"{counts[s]} {s}" for s in PLAN_STATES if counts[s])
    if unknown == len(left):
        guess = "; no estimate: none has a finished run of its algorithm to go by"
    else:
        guess = (f", about {hours:.1f} run-hours from the mean wall clock of the finished runs "
                 "of the same algorithm and task (this grid's, else a committed grid's of the "
                 "same config, else this grid's on other tasks)"
                 + (f"; {unknown} with no finished run of their algorithm to go by"
                    if unknown else ""))
    console.print(f"{len(entries)} cells: {said}." + (
        f" Left to run (only=missing): {len(left)} cells{guess}." if left else ""),
        highlight=False, soft_wrap=True)
    if others := sum("recording" in e for e in entries):
        console.print(f"{others} {'cells are' if others > 1 else 'cell is'} committed on "
                      f"another recording of {'their' if others > 1 else 'its'} dataset than the "
                      "one on disk: a recording depends on the CPU it was made on "
                      "(benchmarks/README.md, Offline against d3rlpy, says which CPUs record "
                      "the committed digests). Running them here starts "
                      "their rows over on this recording; the report flags rows that mix two.",
                      highlight=False, soft_wrap=True)


def bench_main(argv: list[str]) -> None:
    from robotrl.bench.grid import load_grid
    from robotrl.bench.harness import finished, launch
    from robotrl.bench.report import report
    from robotrl.checkpoint import atomic_open, waiting_lock
    from robotrl.logging import console

    action, path, fields, options, hydra_args, check = _parse(argv)
    try:
        grid = load_grid(path, fields)
    except ValueError as err:
        raise SystemExit(f"grid error: {err}") from None
    cells = grid.cells()
    if action == "list":
        _list(grid)
        return
    if action == "run":
        only = (None if "only" not in options else _missing(grid) if options["only"] == "missing"
                else _indices(options["only"], len(cells)))
        todo = [c for i, c in enumerate(cells) if (only is None or i in only)
                and finished(grid, c) is None]
        if grid.offline and grid.metric == "normalized_score":
            # the datasets this call runs: only= needs no other dataset of the grid on disk
            _check_cards(sorted({c.target for c in todo}))
        console.print(f"[bold]robotrl bench[/bold] {grid.name}: {len(cells)} cells, "
                      f"{len(todo)} to run -> {grid.out}")
        try:
            seconds = launch(path, grid, str(options.get("launcher", "basic")),
                             int(options.get("jobs", 1)), hydra_args, only)
        except ValueError as err:
            raise SystemExit(f"bench error: {err}") from None
        console.print(f"ran in {seconds / 60:.1f} min")
    if check:
        records, _ = _merged(grid, check)
        text, _ = report(grid, records, with_figures=False)
        committed = grid.report_path.read_text() if grid.report_path.is_file() else ""
        if committed != text:
            print(f"{grid.report_path} differs from what {grid.results_path} gives; run "
                  f"robotrl bench report {path}", file=sys.stderr)
            raise SystemExit(1)
        print(f"{grid.report_path} matches {grid.results_path}")
        return
    # two `bench run only=N` of one grid may finish at once: each reads the results file, merges
    # its runs in and replaces the file, so the read-merge-write is one at a time
    with waiting_lock(Path(grid.out) / ".results.lock"):
        records, kept = _merged(grid, check)
        text, _ = report(grid, records, with_figures=options.get("figures", True))
        write_results(grid, records, kept)
        grid.report_path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(grid.report_path, "w") as f:
            f.write(text)
    print(text)
    print(f"wrote {grid.report_path} and {grid.results_path}")
