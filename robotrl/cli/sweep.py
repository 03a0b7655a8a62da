"""Sweeps of ``robotrl train -m``: every job's result gathered into one table.

Each job of a multirun writes ``<sweep dir>/results/<job>.json`` (its overrides, run
directory, final and best evaluation); at the end of the sweep ``SweepTable`` (a Hydra
callback, on in ``configs/train.yaml``) prints them as one table, best first, and writes
``<sweep dir>/results.md`` and ``results.json``. Jobs run through whatever launcher
``hydra/launcher=`` names (``configs/hydra/launcher/``: ``local`` parallel processes, ``slurm``,
``ray``) and the sweeper ``hydra/sweeper=`` names (``optuna_ppo`` / ``optuna_sac`` /
``optuna_trpo``: Optuna's TPE maximizing ``objective``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


def objective(result: dict[str, float] | None) -> float:
    """What a sweep maximizes: the final evaluation's normalized score where the run has one
    (offline runs on a dataset with reference returns), else its mean return; NaN without an
    evaluation."""
    if not result:
        return math.nan
    return float(result.get("normalized_score", result["return_mean"]))


def record_job(run_dir: str, result: dict[str, float] | None) -> None:
    """Inside a multirun job: write this job's row (``result`` is ``run_training``'s, with the
    run's ``best`` evaluation) to ``<sweep dir>/results/<job>.json`` atomically; outside one,
    nothing."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from robotrl.checkpoint import write_json

    if not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return
    best = (result or {}).get("best")
    row = {"job": int(hc.job.num), "overrides": list(hc.overrides.task), "run_dir": run_dir,
           "final": objective(result), "best": math.nan if best is None else float(best)}
    if result and "success" in result:
        row["success"] = float(result["success"])
    write_json(Path(hc.sweep.dir) / "results" / f"{hc.job.num}.json", row)


def sweep_name() -> str:
    """Inside a multirun job: the name of the sweep directory (``hydra.sweep.dir``), which its
    jobs share as their W&B group; outside one, ''."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return ""
    return Path(HydraConfig.get().sweep.dir).name


def gather(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """Every job's row of the sweep in ``sweep_dir``, best evaluation first."""
    rows = [json.loads(p.read_text()) for p in Path(sweep_dir).glob("results/*.json")]

    def key(row: dict[str, Any]) -> float:
        best = row.get("best", math.nan)
        return -math.inf if best is None or math.isnan(best) else best

    return sorted(rows, key=key, reverse=True)


def swept(rows: list[dict[str, Any]]) -> list[str]:
    """Each row's overrides that not every job shares (what the sweep varied), as one string;
    a leading ``++`` (how robotrl passes keys to Hydra) dropped."""
    common = set.intersection(*(set(r["overrides"]) for r in rows)) if rows else set()
    return [" ".join(o.removeprefix("++") for o in r["overrides"] if o not in common) or "-"
            for r in rows]


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| job | swept | final eval | best eval | run dir |", "|---|---|---|---|---|"]
    lines += [f"| {r['job']} | {s} | {r['final']:.1f} | {r['best']:.1f} | {r['run_dir']} |"
              for r, s in zip(rows, swept(rows), strict=True)]
    return "\n".join(lines) + "\n"


class SweepTable(Callback):
    """At the end of a multirun: the jobs' final and best evaluations in one table."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from rich.table import Table

        from robotrl.checkpoint import atomic_open, write_json
        from robotrl.logging import console

        sweep_dir = Path(str(config.hydra.sweep.dir))
        rows = gather(sweep_dir)
        if not rows:
            return
        table = Table(title=f"sweep {sweep_dir} ({len(rows)} jobs, best evaluation first)")
        for column in ("job", "swept", "final eval", "best eval", "run dir"):
            table.add_column(column)
        for r, varied in zip(rows, swept(rows), strict=True):
            table.add_row(str(r["job"]), varied, f"{r['final']:.1f}", f"{r['best']:.1f}",
                          r["run_dir"])
        console.print(table, soft_wrap=False)
        with atomic_open(sweep_dir / "results.md", "w") as f:
            f.write(markdown(rows))
        write_json(sweep_dir / "results.json", rows)
        console.print(f"wrote {sweep_dir / 'results.md'} and results.json")
