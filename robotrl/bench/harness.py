"""Running a grid: every cell an ordinary run directory, reused when finished, resumed when
interrupted, a failure recorded and the grid going on.

    robotrl bench run benchmarks/grids/offline.yaml jobs=2            # local processes
    robotrl bench run GRID launcher=submitit_slurm hydra.launcher.partition=gpu
    robotrl bench report benchmarks/grids/offline.yaml                 # tables from the runs

Cells are Hydra jobs of the ``bench`` app (``configs/bench.yaml``: one sweep over the cell
index), sent out by the launcher plugin ``launcher=`` names: ``basic`` (one after another, in
this process), ``joblib`` (``jobs`` local processes), ``submitit_local`` / ``submitit_slurm``
(``robotrl[launchers]``). A robotrl cell is ``robotrl.experiment.Experiment`` on the grid's
overrides; a peer cell runs the peer's script in the peer's interpreter. Either way the cell
ends with ``result.json`` in its run directory (written last, atomically); ``failed.json``
holds the error of a cell that failed, ``load.json`` the machine's load average while the cell
trained (``LoadSampler``: the tables say on which machine and under what load they ran).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from robotrl.bench.grid import ROBOTRL, Cell, Grid, PeerConfig, learner_name
from robotrl.checkpoint import CheckpointError, write_json
from robotrl.experiment import RESULT_FILE, Experiment, RunDir, compose, config_digest
from robotrl.experiment.run import config_fields

LAUNCHERS = {"basic": "", "joblib": "hydra_plugins.hydra_joblib_launcher",
             "submitit_local": "hydra_plugins.hydra_submitit_launcher",
             "submitit_slurm": "hydra_plugins.hydra_submitit_launcher"}
"""Hydra launcher plugin -> the module it comes in (``pip install 'robotrl[launchers]'``)."""

DEFAULTS = ("logger.progress=false", "torch_threads=1")
"""Added to a robotrl cell's overrides unless the grid sets the key."""


LOAD_FILE = "load.json"
"""A cell's load record in its run directory (``LoadSampler``)."""
DATA_FILE = "data.json"
"""An offline cell's dataset digest (``Dataset.digest``), written when the cell starts."""
PEER_CELL = "cell.json"
"""What a peer's cell hands its script, in its run directory (``run_peer``): ``peer_spec`` and
the cell's coordinates; what ``changed`` compares a peer's run with."""
PEER_PROGRESS = "peer_progress.json"
"""Where a peer's unfinished run saved its state (``step``, ``evaluations``), written beside the
state itself (``peer_state.pt``, in the peer's own format: its script resumes from it when the
cell runs again; ``benchmarks/common.py``: ``PeerCell.save_state``); gone once the cell
finishes."""
STARTED = "started: "
"""How the missing reason of a cell that started and has not finished begins (``progress``)."""
STALE = "stale"
"""How the missing reason of a cell whose run or results-file record is of another config (or
dataset recording) than the cell's begins."""
RESUMES = " (`robotrl bench run` resumes it)"
"""How ``progress`` ends for a run whose checkpoint is on this machine."""


class LoadSampler:
    """The machine's 1-minute load average (``os.getloadavg``: every process on it, a peer's
    and other users' too), sampled when a cell starts training, every ``every`` seconds while
    it trains and when it stops, then added to ``load.json`` in each of ``runs`` (``mean``,
    ``min``, ``max``, ``samples``; a resumed cell's segments pooled)."""

    def __init__(self, runs: list[Path], every: float = 30.0) -> None:
        self.runs, self.every = runs, every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        try:
            self.samples.append(os.getloadavg()[0])
        except OSError:  # not on this platform
            pass

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def __enter__(self) -> LoadSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        for run in self.runs:
            if run.is_dir() and self.samples:
                write_json(run / LOAD_FILE, pooled_load(read_json(run / LOAD_FILE),
                                                        self.samples), indent=1)


def pooled_load(before: dict[str, Any] | None, samples: list[float]) -> dict[str, Any]:
    """``load.json`` of ``before`` (None: none yet) with ``samples`` added."""
    n = len(samples)
    now = {"mean": sum(samples) / n, "min": min(samples), "max": max(samples), "samples": n}
    if not before:
        return now
    total = before["samples"] + n
    return {"mean": (before["mean"] * before["samples"] + now["mean"] * n) / total,
            "min": min(before["min"], now["min"]), "max": max(before["max"], now["max"]),
            "samples": total}


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def reached(grid: Grid, cell: Cell) -> dict[str, Any] | None:
    """The cell's ``result.json`` if its run reached the budget (whatever config it ran)."""
    return _reached(grid.run_dir(cell), cell.budget)


def _reached(run: Path, budget: int) -> dict[str, Any] | None:
    done = read_json(run / RESULT_FILE)
    if done is None or done.get("total_steps") != budget or done["step"] < budget:
        return None
    return done


@functools.cache
def data_digest(target: str) -> str | None:
    """``Dataset.digest`` of the dataset ``target`` names as it is on disk now; None where it
    cannot be read here (a report built on another machine cannot tell, so does not judge)."""
    from robotrl.data import DatasetError, load_dataset

    try:
        return load_dataset(target).digest()
    except (DatasetError, OSError):
        return None


def other_recording(grid: Grid, target: str, ran: str | None) -> str | None:
    """The digest of the dataset on disk when it is another recording than ``ran`` (the
    digest a run or a record trained on), else None. Runs and records from before digests
    were recorded, and datasets not on disk here, are not judged."""
    if not grid.offline or not ran:
        return None
    now = data_digest(target)
    return now if now not in (None, ran) else None


def data_changed(grid: Grid, cell: Cell) -> list[str]:
    """Why an offline cell's run is not of the dataset on disk now (it was recorded again
    since the run started: other rows, or other reference returns), else []."""
    ran = (read_json(grid.run_dir(cell) / DATA_FILE) or {}).get("digest")
    now = other_recording(grid, cell.target, ran)
    return [f"dataset {cell.target}: digest {ran} -> {now}"] if now else []


def what_changed(diff: list[str]) -> str:
    """"its dataset" when every line of a stale cell's ``diff`` is ``data_changed``'s, else
    "the config"."""
    return "its dataset" if all(d.startswith("dataset ") for d in diff) else "the config"


def mark_data(grid: Grid, cell: Cell) -> None:
    """Write the digest of the dataset the cell is about to train on into its run directory."""
    if grid.offline and (digest := data_digest(cell.target)) is not None:
        write_json(grid.run_dir(cell) / DATA_FILE, {"dataset": cell.target, "digest": digest})


def status(grid: Grid, cell: Cell) -> tuple[dict[str, Any] | None, list[str]]:
    """(``result.json`` if the cell finished with the config the grid composes today, on the
    dataset on disk now, else None; ``changed`` and ``data_changed`` of its run): one
    composition per cell for callers that need both."""
    done, diff = reached(grid, cell), changed(grid, cell) + data_changed(grid, cell)
    if cell.algo in grid.init and not diff:  # it started from a stage the grid no longer makes
        diff = [f"init stage: {d}" for d in _changed(grid.init_dir(cell),
                                                     init_overrides(grid, cell))]
    return (None if diff else done), diff


def finished(grid: Grid, cell: Cell) -> dict[str, Any] | None:
    """The cell's ``result.json`` if it reached its budget with the config the grid composes
    today, else None (a run whose config has ``changed`` since is not this cell's result)."""
    return status(grid, cell)[0]


def composed(grid: Grid, cell: Cell) -> Any:
    """The ``TrainConfig`` a robotrl cell trains with today (tuned files and defaults as they
    are now), or None where it cannot be composed here (an offline cell without its dataset)."""
    return _composed(cell_overrides(grid, cell))


def _composed(overrides: list[str]) -> Any:
    try:
        return compose([o for o in overrides if not o.startswith("resume=")])
    except Exception:  # noqa: BLE001 - unknown, not wrong: the caller keeps what it has
        return None


def changed(grid: Grid, cell: Cell) -> list[str]:
    """``key: old -> new`` for every config field in which the cell's run (its ``config.yaml``)
    differs from what the grid composes today: a tuned file or a default changed since it ran.
    For a peer's cell, the algorithm and options it was handed (its ``cell.json``) against the
    grid's. Empty for a matching run or a cell not yet run."""
    if cell.runner != ROBOTRL:
        ran = read_json(grid.run_dir(cell) / PEER_CELL)
        now = peer_spec(grid.peers[cell.runner], cell.algo)
        return [] if ran is None else _diff(_flat_spec(ran), _flat_spec(now))
    return _changed(grid.run_dir(cell), cell_overrides(grid, cell))


def _diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(old.keys() | new.keys())
            if old.get(k) != new.get(k)]


def peer_spec(peer: PeerConfig, algo: str) -> dict[str, Any]:
    """What a peer's cell of our ``algo`` trains with beyond its coordinates: the peer's name for
    the algorithm and the grid's options for the peer (as its ``cell.json`` hands them to the
    script)."""
    return {"algo": peer.algos[algo], "options": peer.options}


def _flat_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A ``peer_spec`` (or a ``cell.json``) as ``key: value`` lines: ``options.x`` per option."""
    options = spec.get("options") or {}
    return {"algo": spec.get("algo"), **{f"options.{k}": v for k, v in options.items()}}


def peer_digest(spec: dict[str, Any]) -> str:
    """A short fingerprint of a ``peer_spec`` (or of the ``cell.json`` a peer's run was handed):
    a peer's record carries it as its ``config``, so a peer run under other options is not passed
    off as the cell."""
    import hashlib

    text = json.dumps({"algo": spec.get("algo"), "options": spec.get("options") or {}},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _changed(run: Path, overrides: list[str]) -> list[str]:
    if not (run / "config.yaml").is_file():
        return []
    now = _composed(overrides)
    if now is None:
        return []
    return _diff(config_fields(RunDir(run).config), config_fields(now))


def current(grid: Grid, cell: Cell, record: dict[str, Any]) -> bool:
    """Whether a saved record (a results file's) is of the config the cell composes today: its
    ``config`` digest matches (a peer's: ``peer_digest``), or it has none to check (records
    written before digests) or the cell cannot be composed here."""
    digest = record.get("config")
    if digest is None:
        return True
    if cell.runner != ROBOTRL:
        return peer_digest(peer_spec(grid.peers[cell.runner], cell.algo)) == digest
    now = composed(grid, cell)
    return now is None or config_digest(now) == digest


def cell_overrides(grid: Grid, cell: Cell) -> list[str]:
    """``robotrl train`` overrides of a robotrl cell (a resume when its run has a checkpoint)."""
    run = grid.run_dir(cell)
    target = f"dataset={cell.target}" if grid.offline else f"env={cell.target}"
    overrides = [f"algo={learner_name(cell.algo)}", target, *grid.overrides, *grid.algos[cell.algo],
                 f"seed={cell.seed}", f"total_steps={cell.budget}", f"run_dir={run}"]
    if cell.algo in grid.init:
        overrides.append(f"init={grid.init_dir(cell) / 'checkpoints' / 'last.pt'}")
    return _finish(overrides, run)


def init_overrides(grid: Grid, cell: Cell) -> list[str]:
    """``robotrl train`` overrides of the ``init`` stage ``cell`` starts from: the grid's
    overrides, the stage's, at the cell's seed."""
    stage = grid.init[cell.algo]
    return _finish([f"algo={stage.algo}", f"dataset={stage.dataset}", *grid.overrides,
                    *stage.overrides, f"seed={cell.seed}", f"total_steps={stage.budget}",
                    f"run_dir={grid.init_dir(cell)}"], grid.init_dir(cell))


def _finish(overrides: list[str], run: Path) -> list[str]:
    """``overrides`` with the harness's ``DEFAULTS`` and a resume when ``run`` has a
    checkpoint."""
    keys = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    overrides = overrides + [d for d in DEFAULTS if d.split("=", 1)[0] not in keys]
    last = run / "checkpoints" / "last.pt"
    if last.is_file():
        overrides.append(f"resume={last}")
    return overrides


def init_datasets(grid: Grid) -> None:
    """Record every ``init`` stage's dataset that does not exist and has ``collect`` arguments
    (once, before the cells are sent out: parallel jobs must not record it twice)."""
    for stage in grid.init.values():
        if stage.collect and not Path(stage.dataset).exists():
            quiet = [] if any(a.startswith("progress=") for a in stage.collect) else [
                "progress=false"]
            # the command, as a user runs it (the harness does not import the CLI)
            done = subprocess.run([sys.executable, "-m", "robotrl.cli.main", "dataset",
                                   "collect", *stage.collect, f"out={stage.dataset}", *quiet],
                                  capture_output=True, text=True)
            if done.returncode:
                raise ValueError(f"recording init dataset {stage.dataset} failed: "
                                 f"{(done.stderr or done.stdout).strip()[-2000:]}")


def init_stage(grid: Grid, cell: Cell) -> bool:
    """Train (or reuse, or resume) the ``init`` stage ``cell`` starts from; whether it trained
    now (the cell's own run, if any, then started from another policy: stale)."""
    run, budget = grid.init_dir(cell), grid.init[cell.algo].budget
    overrides = init_overrides(grid, cell)
    diff = _changed(run, overrides)
    if not diff and _reached(run, budget) is not None:
        return False
    if diff:
        _set_aside(run, f"{cell.label}: its init stage's config changed", diff)
        overrides = init_overrides(grid, cell)  # no resume from the moved run
    Experiment.from_overrides(overrides).run()
    if _reached(run, budget) is None:
        raise RuntimeError(f"{run} has no result.json for {budget:,} updates")
    return True


def run_peer(grid: Grid, cell: Cell) -> None:
    """The peer's script on the cell, in the peer's interpreter; its output goes to
    ``peer.log`` in the run directory."""
    peer = grid.peers[cell.runner]
    run = grid.run_dir(cell)
    spec = {**peer_spec(peer, cell.algo), "our_algo": cell.algo, "target": cell.target,
            "offline": grid.offline, "seed": cell.seed, "budget": cell.budget,
            "run_dir": str(run.resolve())}
    write_json(run / PEER_CELL, spec, indent=1)
    python = os.path.expandvars(peer.python) if peer.python else sys.executable
    if shutil.which(python) is None:
        raise FileNotFoundError(f"peer {cell.runner!r}: interpreter {python!r} not found "
                                f"(grid key peers.{cell.runner}.python)")
    with open(run / "peer.log", "a") as log:  # a resumed peer adds to its log
        code = subprocess.call([python, peer.script, str(run / PEER_CELL)], stdout=log,
                               stderr=subprocess.STDOUT)
    if code:
        tail = (run / "peer.log").read_text()[-2000:]
        raise RuntimeError(f"peer {cell.runner} exited {code}: {tail}")


def seed_batch(grid: Grid, cell: Cell) -> list[Cell]:
    """The cells ``cell``'s job trains together with ``batch_seeds``: its algorithm, target and
    budget over every seed, when the algorithm has a seed-batched learner and none of those
    seeds has a run directory yet (started runs resume one by one); else ``[cell]``."""
    from robotrl.registry import algorithm

    if (not grid.batch_seeds or cell.runner != ROBOTRL or cell.algo in grid.init
            or algorithm(learner_name(cell.algo)).seed_batch is None):
        return [cell]
    group = [dataclasses.replace(cell, seed=s) for s in grid.seeds]
    if any(grid.run_dir(c).exists() for c in group):
        return [cell]
    return group


def run_seed_batch(grid: Grid, cells: list[Cell]) -> None:
    """Train ``cells`` (one algorithm, target and budget; consecutive seeds) as one
    ``num_seeds`` run whose seeds land in the cells' own directories."""
    from robotrl.logging import console

    first = cells[0]
    parent = grid.run_dir(first).parent  # run_dir(cell) = <parent>/s<seed>: seed_configs' layout
    overrides = [o for o in cell_overrides(grid, first)
                 if not o.startswith(("run_dir=", "resume="))]
    overrides += [f"run_dir={parent}", f"num_seeds={len(cells)}"]
    for cell in cells:
        grid.run_dir(cell).mkdir(parents=True, exist_ok=True)
        mark_data(grid, cell)
    try:
        with LoadSampler([grid.run_dir(c) for c in cells]):
            Experiment.from_overrides(overrides).run()
    except KeyboardInterrupt:
        raise
    except Exception as err:  # noqa: BLE001 - recorded per cell, as run_cell does
        for cell in cells:
            run = grid.run_dir(cell)
            run.mkdir(parents=True, exist_ok=True)
            write_json(run / "failed.json", {"error": f"{type(err).__name__}: {err}",
                                             "traceback": traceback.format_exc()}, indent=1)
        console.print(f"[red]{first.label} (seeds {[c.seed for c in cells]}) failed: "
                      f"{type(err).__name__}: {err}[/red]")
        return
    for cell in cells:
        done = reached(grid, cell)  # trained just now, with the config the grid composes
        if done is not None:
            (grid.run_dir(cell) / "failed.json").unlink(missing_ok=True)
            score = done["final"].get(grid.metric, float("nan"))
            console.print(f"{cell.label}: {grid.metric} {score:.1f} (batched)")


def run_cell(grid: Grid, cell: Cell) -> dict[str, Any] | None:
    """Run (or reuse, or resume) one cell; its ``result.json``, or None when it failed (the
    error is in ``failed.json``)."""
    from robotrl.logging import console

    run = grid.run_dir(cell)
    try:
        retrained = cell.algo in grid.init and init_stage(grid, cell)
    except KeyboardInterrupt:
        raise
    except Exception as err:  # noqa: BLE001 - recorded like the cell's own failure
        return _failed(cell, run, err, "init stage: ")
    done, diff = status(grid, cell)
    if retrained and run.exists():  # the cell's run started from another policy
        done, diff = None, ["init: its stage trained again"]
    if done is None:
        if diff:  # never resumed or reused under another config: set aside, start over
            _set_aside(run, f"{cell.label}: {what_changed(diff)} changed since it ran", diff)
        run.mkdir(parents=True, exist_ok=True)
        mark_data(grid, cell)
        try:
            with LoadSampler([run]):
                if cell.runner == ROBOTRL:
                    Experiment.from_overrides(cell_overrides(grid, cell)).run()
                else:
                    run_peer(grid, cell)
            if grid.ope_updates and cell.runner == ROBOTRL:
                ope_stage(grid, cell)
            done = reached(grid, cell)  # trained just now, with the config the grid composes
            if done is None:
                raise RuntimeError(f"{run} has no result.json for {cell.budget:,} steps")
        except KeyboardInterrupt:
            raise
        except Exception as err:  # noqa: BLE001 - one cell's failure is recorded, not fatal
            return _failed(cell, run, err)
    (run / "failed.json").unlink(missing_ok=True)
    final = done["final"]
    score = final.get(grid.metric, float("nan"))
    console.print(f"{cell.label}: {grid.metric} {score:.1f} "
                  f"({done.get('train_seconds', float('nan')) / 60:.1f} min)")
    return done


def _set_aside(run: Path, why: str, diff: list[str]) -> None:
    """Move ``run`` to ``<run>.stale`` (replacing an older one) so that it is neither resumed
    nor reused, and say ``why`` with the first differences."""
    from robotrl.logging import console

    aside = run.with_name(run.name + ".stale")
    shutil.rmtree(aside, ignore_errors=True)
    run.rename(aside)
    console.print(f"[yellow]{why} ({'; '.join(diff[:4])}{'; ...' if len(diff) > 4 else ''}); "
                  f"its run moved to {aside}, starting over[/yellow]")


def _failed(cell: Cell, run: Path, err: Exception, what: str = "") -> None:
    """Record a cell's failure in its ``failed.json`` and say so."""
    from robotrl.logging import console

    run.mkdir(parents=True, exist_ok=True)
    write_json(run / "failed.json", {"error": f"{what}{type(err).__name__}: {err}",
                                     "traceback": traceback.format_exc()}, indent=1)
    console.print(f"[red]{cell.label} failed: {what}{type(err).__name__}: {err} "
                  f"(details: {run / 'failed.json'})[/red]")


def ope_stage(grid: Grid, cell: Cell) -> dict[str, Any]:
    """Fitted Q evaluation of an offline cell's final policy beside the simulator's value
    (``ope.json``)."""
    from robotrl.experiment.evaluate import off_policy_value

    run = grid.run_dir(cell)
    done = read_json(run / "ope.json")
    if done is not None and done.get("updates") == grid.ope_updates:
        return done
    cfg = RunDir(run).config
    result = off_policy_value(str(run / "checkpoints" / "last.pt"), cell.target,
                              grid.ope_updates, episodes=cfg.eval_episodes, device=cfg.device,
                              seed=cell.seed)
    write_json(run / "ope.json", result, indent=1)
    return result


def launch(grid_path: str, grid: Grid, launcher: str = "basic", jobs: int = 1,
           hydra_args: list[str] | None = None, only: list[int] | None = None) -> float:
    """Every cell (or the indices ``only``) through Hydra's launcher plugin; wall seconds."""
    import importlib.util

    import hydra
    from omegaconf import DictConfig

    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}; available: {sorted(LAUNCHERS)}")
    module = LAUNCHERS[launcher]
    if module and importlib.util.find_spec(module) is None:
        raise ValueError(f"launcher={launcher} needs its Hydra plugin: pip install "
                         "'robotrl[launchers]'")
    cells = grid.cells()
    indices = [i for i in (only if only is not None else range(len(cells)))
               if finished(grid, cells[i]) is None]
    if indices:
        init_datasets(grid)
    # one job per seed batch, under its first cell (dict keys: order kept, duplicates dropped)
    indices = list(dict.fromkeys(cells.index(seed_batch(grid, cells[i])[0]) for i in indices))
    if not indices:
        return 0.0
    overrides = [f"cell={','.join(map(str, indices))}", f"grid={_quote(grid_path)}",
                 f"out={_quote(grid.out)}", f"hydra/launcher={launcher}"]
    if launcher == "joblib":
        overrides.append(f"hydra.launcher.n_jobs={jobs}")

    @hydra.main(config_path="pkg://robotrl.configs", config_name="bench", version_base="1.3")
    def _job(dcfg: DictConfig) -> None:
        cell = grid.cells()[int(dcfg.cell)]
        group = seed_batch(grid, cell)
        if len(group) > 1:
            run_seed_batch(grid, group)
        else:
            run_cell(grid, cell)

    saved = sys.argv
    sys.argv = ["robotrl bench", "--multirun", *overrides, *(hydra_args or [])]
    t0 = time.perf_counter()
    try:
        _job()
    finally:
        sys.argv = saved
    return time.perf_counter() - t0


def _quote(value: str) -> str:
    """A value safe inside a Hydra sweep (paths may hold characters the grammar reserves)."""
    return value if all(c.isalnum() or c in "/_-." for c in value) else "'" + value.replace(
        "'", "\\'") + "'"


def collect(grid: Grid) -> list[dict[str, Any]]:
    """One compact record per cell: the finished ones' scores (``final`` and ``best`` of the
    grid's metric, the curve, the wall clock; ``ope`` where measured), the others with why they
    are missing."""
    records = []
    for cell in grid.cells():
        base = {"runner": cell.runner, "algo": cell.algo, "target": cell.target,
                "seed": cell.seed, "budget": cell.budget}
        run = grid.run_dir(cell)
        done, diff = status(grid, cell)
        if done is None:
            failed = read_json(run / "failed.json")
            why = (f"{STALE}: {what_changed(diff)} changed since it ran ({'; '.join(diff)})" if diff
                   else failed["error"] if failed
                   else progress(run, cell.budget, grid.metric) or "not run")
            records.append({**base, "missing": why})
            continue
        evals = [e for e in done.get("evaluations", []) if grid.metric in e]
        final = done["final"].get(grid.metric, float("nan"))
        record = {**base, "steps": done["step"], "final": final,
                  "best": max([e[grid.metric] for e in evals], default=final),
                  "train_seconds": done.get("train_seconds", float("nan")),
                  "machine": done.get("machine", ""),
                  "curve": {"steps": [e["step"] for e in evals],
                            "score": [e[grid.metric] for e in evals]}}
        if evals and all("seconds" in e for e in evals):  # for orderings at equal wall clock
            record["curve"]["minutes"] = [round(e["seconds"] / 60, 3) for e in evals]
        load = read_json(run / LOAD_FILE)
        if load:
            record["load"] = round(load["mean"], 2)
        if grid.also:
            record["also"] = {k: done["final"].get(k, float("nan")) for k in grid.also}
        if cell.algo in grid.init:
            record["init"] = init_record(grid, cell, done)
        if cell.runner == ROBOTRL:
            record["config"] = done.get("config") or config_digest(RunDir(run).config)
        elif (spec := read_json(run / PEER_CELL)) is not None:
            record["config"] = peer_digest(spec)
        if done.get("resumed"):  # a peer's run interrupted and resumed (``PeerCell``)
            record["resumed"] = [r["step"] for r in done["resumed"]]
        data = read_json(run / DATA_FILE)
        if data is not None:
            record["data"] = data["digest"]
        ope = read_json(run / "ope.json")
        if ope is not None:
            record["ope"] = ope
        records.append(record)
    return records


def _last_eval(evaluations: list[dict[str, Any]], metric: str) -> str:
    evals = [e for e in evaluations if metric in e]
    return (f"; {metric} {evals[-1][metric]:.1f} at its evaluation at {evals[-1]['step']:,}"
            if evals else "")


def _peer_saved(run: Path) -> dict[str, Any] | None:
    """Where a peer's unfinished run saved its state (``PEER_PROGRESS``), None without it."""
    saved = read_json(run / PEER_PROGRESS)
    return saved if isinstance(saved, dict) and {"step", "evaluations"} <= set(saved) else None


def progress(run: Path, budget: int, metric: str) -> str | None:
    """Where an unfinished run got to, as its cell's missing reason: the step of its last
    checkpoint, or a peer's saved state (``bench run`` resumes from there), and its latest
    evaluation; without a checkpoint here (one left on another machine), a robotrl run's latest
    evaluation logged to TensorBoard. None for a run that never started."""
    saved = _peer_saved(run)
    if saved is not None:
        return (f"{STARTED}{int(saved['step']):,} of {budget:,} steps at its saved state"
                f"{_last_eval(saved['evaluations'], metric)}{RESUMES}")
    if not (run / "config.yaml").is_file():
        return None
    found = RunDir(run)
    try:
        ckpt = found.checkpoint()
    except CheckpointError as err:  # the report goes on: this cell says why it cannot resume
        return f"{STARTED}its last checkpoint cannot be read ({err})"
    if ckpt is not None:
        return (f"{STARTED}{int(ckpt['global_step']):,} of {budget:,} steps at its last checkpoint"
                f"{_last_eval(ckpt.get('evaluations', []), metric)}{RESUMES}")
    series = found.scalars().get(f"eval/{metric}", [])
    if series:
        step, value = series[-1]
        return (f"{STARTED}evaluated up to {step:,} of {budget:,} steps ({metric} {value:.1f} "
                "there); no checkpoint here to resume from")
    return f"{STARTED}no checkpoint or evaluation yet"


def started_elsewhere(record: dict[str, Any]) -> dict[str, Any]:
    """A results file's record of a cell started on another machine, as a machine without its
    run reports it: the checkpoint ``progress`` said ``bench run`` resumes from is not here."""
    text = record["missing"]
    if text.endswith(RESUMES):
        text = (text[:-len(RESUMES)] + " on another machine (its checkpoint is not here: "
                "`robotrl bench run` starts it over)")
    return {**record, "missing": text}


def under_way(record: dict[str, Any]) -> bool:
    """Whether a cell's record is of a run that started and has not finished (``progress``)."""
    return record.get("missing", "").startswith(STARTED)


def stale(record: dict[str, Any]) -> bool:
    """Whether a cell's record says its run or results-file record is of another config."""
    return record.get("missing", "").startswith(STALE)


def init_record(grid: Grid, cell: Cell, done: dict[str, Any]) -> dict[str, Any]:
    """The ``init`` stage of a finished cell: its algorithm, updates and wall clock, and the
    cell's scores before any update of its own (its evaluation at step 0: the stage's policy
    in the cell's environment), ``None`` where the cell has no evaluation at step 0."""
    stage = grid.init[cell.algo]
    ran = read_json(grid.init_dir(cell) / RESULT_FILE) or {}
    first = (done.get("evaluations") or [{}])[0]
    at_start = first.get("step") == 0
    return {"algo": stage.algo, "dataset": stage.dataset, "updates": stage.budget,
            "train_seconds": ran.get("train_seconds", float("nan")),
            "before": {k: first.get(k) if at_start else None for k in (grid.metric, *grid.also)}}


def record_key(record: dict[str, Any]) -> tuple[Any, ...]:
    """What names a cell in a results file: (runner, algo, target, seed, budget)."""
    return (record["runner"], record["algo"], record["target"], record["seed"],
            record["budget"])


def saved_records(grid: Grid) -> list[dict[str, Any]]:
    """The records in the grid's results file ([] before it exists)."""
    path = grid.results_path
    return json.loads(path.read_text()).get("records", []) if path.is_file() else []


def committed_records(grid: Grid, warn: Callable[[str], None] | None = None
                      ) -> list[dict[str, Any]]:
    """One record per cell from the grid's results file alone (runs finished on this machine
    since do not count): what ``bench report --check`` and the documentation's result pages
    compute the committed tables from. A cell without a finished record is missing ("not
    run", or the results file's reason); a record of a config the grid no longer composes is
    kept, and ``warn`` is told (a changed default must not turn every committed table red
    before its cells can be rerun)."""
    by_key = {record_key(r): r for r in saved_records(grid)}
    records = []
    for cell in grid.cells():
        key = record_key(vars(cell))
        record = by_key.get(key) or {"runner": cell.runner, "algo": cell.algo,
                                     "target": cell.target, "seed": cell.seed,
                                     "budget": cell.budget, "missing": "not run"}
        if "final" in record and warn is not None and not current(grid, cell, record):
            warn(f"{grid.name} {' '.join(map(str, key))}: the committed record is of a config "
                 "the grid no longer composes; rerun the cell")
        records.append(record)
    return records


PLAN_STATES = ("done", "committed", "started", "stale", "todo")
"""A cell's state in ``plan``."""
TO_RUN = PLAN_STATES[2:]
"""The states of the cells left to run (what ``only=missing`` runs)."""


def plan(grid: Grid) -> list[dict[str, Any]]:
    """Each cell's state, for deciding what to run next (``robotrl bench list``): ``done``
    (finished here), ``committed`` (finished on another machine: a record in the results file of
    the config and dataset the cell has today), ``started`` (a run here that has not finished:
    ``bench run`` resumes it), ``stale`` (a run here of another config or dataset, or a record in
    the results file of another recording of the dataset than the one on disk), ``todo``.
    Each entry: ``cell``, ``state``, ``machine`` (of a finished cell), ``seconds`` (a finished
    cell's wall clock, where recorded and finite), ``left`` (a started cell's fraction of its
    budget still to run) and ``recording`` (the results file's and the disk's dataset digests,
    where they differ)."""
    committed = {record_key(r): r for r in saved_records(grid) if "final" in r}
    entries = []
    for cell in grid.cells():
        entry: dict[str, Any] = {"cell": cell, "state": "todo"}
        done, diff = status(grid, cell)
        record = committed.get(record_key(vars(cell)))
        if record is not None and not current(grid, cell, record):
            record = None
        other = other_recording(grid, cell.target, record.get("data")) if record else None
        run = grid.run_dir(cell)
        found = done
        if done is not None:
            entry["state"] = "done"
        elif diff:
            entry["state"] = "stale"
        elif record is not None and other is None:
            entry["state"], found = "committed", record
        elif (run / "config.yaml").is_file() or _peer_saved(run) is not None:
            entry.update(state="started", left=_left(run, cell.budget))
        elif record is not None:  # its time still says what a run of it costs
            entry.update(state="stale", recording=(record["data"], other))
            found = record
        if found is not None:
            entry["machine"] = found.get("machine", "")
            if (seconds := _wall_clock(found)) is not None:
                entry["seconds"] = seconds
        entries.append(entry)
    return entries


def _wall_clock(record: dict[str, Any]) -> float | None:
    """A record's ``train_seconds`` where it is a finite number (a cut run's is NaN)."""
    seconds = record.get("train_seconds")
    return float(seconds) if isinstance(seconds, (int, float)) and math.isfinite(seconds) else None


def _left(run: Path, budget: int) -> float:
    """The fraction of ``budget`` a started run has still to train (from its last checkpoint or
    a peer's saved state; all of it without one that can be read)."""
    saved = _peer_saved(run)
    try:
        ckpt = saved or RunDir(run).checkpoint()
    except CheckpointError:
        return 1.0
    step = int(ckpt["step" if saved else "global_step"]) if ckpt else 0
    return max(0.0, 1.0 - step / budget)


def estimate(entries: list[dict[str, Any]], elsewhere: dict[tuple[Any, ...], tuple[str, list[float]]]
             | None = None) -> dict[int, tuple[float, str]]:
    """Minutes each unfinished cell of ``plan`` still needs: index -> (minutes, where they come
    from: ``""`` for runs of its own algorithm, task and budget in this grid, else the name of
    another grid that ran that cell (``elsewhere``, from ``finished_elsewhere``), else ``"its
    other tasks"`` for this grid's runs of the same algorithm on other tasks); cells with none
    are left out. The mean wall clock of those finished runs (the machines, loads and evaluation
    settings they ran with: an estimate, not a promise)."""
    def key(cell: Cell, task: bool) -> tuple[Any, ...]:
        return (cell.runner, cell.algo, cell.budget) + ((cell.target,) if task else ())

    seconds: dict[tuple[Any, ...], list[float]] = {}
    for e in entries:
        if "seconds" in e:
            for task in (True, False):
                seconds.setdefault(key(e["cell"], task), []).append(e["seconds"])
    out = {}
    for i, e in enumerate(entries):
        if e["state"] not in TO_RUN:
            continue
        own, other = key(e["cell"], True), key(e["cell"], False)
        source, s = (("", seconds[own]) if own in seconds
                     else (elsewhere or {}).get(own) or ("its other tasks", seconds.get(other)))
        if s:
            out[i] = (sum(s) / len(s) / 60 * e.get("left", 1.0), source)
    return out


def finished_elsewhere(grid: Grid) -> dict[tuple[Any, ...], tuple[str, list[float]]]:
    """The wall clock of finished runs in the results files beside ``grid``'s (the committed
    grids): (runner, algo, budget, target) -> (where they are: "its committed runs" for the
    grid's own results file, whose seeds the grid may not list today, else the first other
    grid's name; their seconds). What ``estimate`` goes by for a cell this grid has not run on
    its task yet. A run counts only where it ran what this grid runs in that cell: a peer's with
    this grid's options for it (``peer_digest``: another recipe of the same peer may cost five
    times as much), ours with the config this grid composes for that seed (150 evaluation
    episodes instead of 10 add half again to a PPO inverted pendulum run). A record written
    before digests counts as in ``current``, except a peer's in another grid's file."""
    wanted = {(c.runner, c.algo, c.budget, c.target): c for c in grid.cells()}
    composed_once: dict[tuple[Any, ...], Any] = {}

    def same_config(r: dict[str, Any], k: tuple[Any, ...], own: bool) -> bool:
        if r.get("config") is None:
            return own or r.get("runner") == ROBOTRL
        if r.get("runner") != ROBOTRL:
            return current(grid, Cell(r["runner"], r["algo"], r["target"], r.get("seed", 0),
                                      r["budget"]), r)
        if k not in composed_once:  # ``current`` per task, not per seed: a plain field
            composed_once[k] = composed(grid, wanted[k])
        now = composed_once[k]
        return now is None or config_digest(dataclasses.replace(now, seed=r.get("seed"))) == \
            r["config"]

    out: dict[tuple[Any, ...], tuple[str, list[float]]] = {}
    mine = grid.results_path.resolve()
    files = sorted(grid.results_path.parent.glob("*.json"), key=lambda p: p.resolve() != mine)
    for path in files:
        try:
            data = json.loads(path.read_text())
            records = data["records"]
            own = path.resolve() == mine
            name = "its committed runs" if own else str(data["grid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a results file
        for r in records if isinstance(records, list) else ():
            seconds = _wall_clock(r) if isinstance(r, dict) and "final" in r else None
            k = (r.get("runner"), r.get("algo"), r.get("budget"), r.get("target"))
            if seconds is None or k not in wanted or not same_config(r, k, own):
                continue
            if out.setdefault(k, (name, []))[0] == name:
                out[k][1].append(seconds)
    return out
