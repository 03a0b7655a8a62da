"""``robotrl offline-bench``: every (algorithm, dataset, seed) trained, scored and evaluated
off-policy, then compared with bootstrap statistics.

    robotrl offline-bench algos=[bc,td3bc,iql] datasets=[robotrl/hopper/medium-v0] seeds=5
    robotrl offline-bench suite=locomotion seeds=3 updates=3000 launcher=joblib jobs=2
    robotrl offline-bench suite=locomotion launcher=submitit_slurm \\
        hydra.launcher.partition=gpu hydra.launcher.gpus_per_node=1 device=cuda
    robotrl offline-bench suite=locomotion seeds=3 updates=3000 run=false   # report only

Each run is a Hydra job of the ``offline_bench`` app (one sweep over algorithm x dataset x
seed), sent out by the launcher plugin ``launcher=`` names: ``basic`` (one after another, in
this process), ``joblib`` (``jobs`` local processes), ``submitit_local`` / ``submitit_slurm``
(``robotrl[launchers]``). A job trains with exactly what ``robotrl train`` runs, into an
ordinary run directory ``out/runs/<dataset>/<algo>/s<seed>`` (inspect, resume, eval or export
it), then estimates the final policy's value by fitted Q evaluation and measures the same
discounted value in the simulator. Its results go to ``result.json`` and ``ope.json`` in the
run directory, written last and atomically: a job finds them and returns, or finds
``checkpoints/last.pt`` and resumes, so a benchmark interrupted anywhere continues where it
stopped. A job that fails writes ``failed.json`` (the error) and the sweep goes on.

The report (``out/report.md``, ``out/results.json`` with every run's raw scores, figures under
``out/figures/``) is made from the result files by ``robotrl.bench.report``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from robotrl.checkpoint import write_json

SUITES: dict[str, tuple[str, ...]] = {
    "locomotion": tuple(f"robotrl/{task}/{kind}-v0" for task in ("hopper", "halfcheetah", "walker2d")
                        for kind in ("medium", "medium-replay", "expert", "medium-expert")),
}
"""Named dataset lists (Minari ids under ``MINARI_DATASETS_PATH``, made with
``robotrl dataset collect``)."""

ALGOS = ("bc", "td3bc", "rebrac", "iql", "cql", "awac", "td3bc_mcep")
"""The default algorithm list."""

LAUNCHERS = {"basic": "", "joblib": "hydra_plugins.hydra_joblib_launcher",
             "submitit_local": "hydra_plugins.hydra_submitit_launcher",
             "submitit_slurm": "hydra_plugins.hydra_submitit_launcher"}
"""Hydra launcher plugin -> the module it comes in (``pip install 'robotrl[launchers]'``)."""


@dataclasses.dataclass
class BenchConfig:
    """One job of the sweep (the ``offline_bench`` Hydra app's config, ``configs/offline_bench.yaml``)."""

    algorithm: str = "td3bc"
    """(Not ``algo``: that is a config group of ``robotrl train`` in the same config folder.)"""
    dataset: str = ""
    seed: int = 0
    updates: int = 1_000_000
    """Gradient updates per run (CORL: 1M)."""
    eval_every: int = 5_000
    """Updates between evaluations (dividing ``updates``)."""
    episodes: int = 10
    """Simulator episodes per evaluation."""
    ope_updates: int = 10_000
    """Fitted Q evaluation updates per run (0: no off-policy evaluation)."""
    gamma: float = 0.99
    """Discount of the off-policy estimate and of the simulator value it is compared with."""
    threads: int = 1
    """torch intra-op threads per job (1 lets ``jobs`` processes share the cores)."""
    device: str = "cpu"
    out: str = "runs/offline-bench"


def dataset_slug(dataset: str) -> str:
    """A directory name for a dataset: its Minari id with ``/`` -> ``_``; a file or directory
    path becomes its name plus a hash of the full path (two ``data.hdf5`` never collide)."""
    p = Path(dataset)
    if p.exists() or p.suffix == ".hdf5" or dataset.startswith(("/", ".")):
        digest = hashlib.sha1(str(p.resolve()).encode()).hexdigest()[:8]
        return f"{p.stem or 'data'}-{digest}"
    return dataset.replace("/", "_")


def run_dir(out: str | Path, algo: str, dataset: str, seed: int) -> Path:
    return Path(out) / "runs" / dataset_slug(dataset) / algo / f"s{seed}"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:  # cannot happen with atomic writes; a hand-edited file
        return None


# ------------------------------------------------------------------------------ one job
def train_stage(job: BenchConfig, run: Path) -> dict[str, Any]:
    """Train (or resume, or reuse) the run; ``result.json``: scores at every evaluation."""
    from robotrl.checkpoint import load_checkpoint

    done = _read_json(run / "result.json")
    if done is not None and done.get("updates") == job.updates:
        return done
    from hydra import compose
    from omegaconf import OmegaConf

    from robotrl.experiment import resolve_config, run_training
    from robotrl.experiment.compose import hydra_overrides
    from robotrl.registry import algo_config_class

    last = run / "checkpoints" / "last.pt"
    ckpt = load_checkpoint(last) if last.exists() else None
    finished = (ckpt is not None and ckpt["global_step"] >= job.updates
                and ckpt.get("evaluations") and ckpt["evaluations"][-1]["step"] == ckpt["global_step"])
    if not finished:
        if job.updates % job.eval_every:
            raise ValueError(f"eval_every={job.eval_every} must divide updates={job.updates}")
        # an iteration is num_steps updates (1,000 by default, fewer when evaluations are closer)
        per_iter = math.gcd(algo_config_class(job.algorithm)().num_steps, job.eval_every)
        overrides = [f"algo={job.algorithm}", f"algo.num_steps={per_iter}",
                     f"dataset={job.dataset}", f"seed={job.seed}",
                     f"total_steps={job.updates}", f"eval_interval={job.eval_every // per_iter}",
                     f"checkpoint_interval={job.eval_every // per_iter}",
                     f"eval_episodes={job.episodes}", f"torch_threads={job.threads}",
                     f"device={job.device}", "logger.progress=false", f"run_dir={run}"]
        if ckpt is not None:
            overrides.append(f"resume={last}")
        composed = OmegaConf.to_container(compose("train", overrides=hydra_overrides(overrides)),
                                          resolve=True)
        run_training(resolve_config(composed, overrides))
        ckpt = load_checkpoint(last)
    evals = ckpt["evaluations"]
    if not evals or "normalized_score" not in evals[-1]:
        raise ValueError(f"{run}: the run has no normalized evaluation scores (its dataset card "
                         f"lacks ref_min_score/ref_max_score?)")
    scores = [e["normalized_score"] for e in evals]
    result = {"algo": job.algorithm, "dataset": job.dataset, "seed": job.seed,
              "updates": int(ckpt["global_step"]), "final": scores[-1], "best": max(scores),
              "final_return": evals[-1]["return_mean"],
              "curve": {"steps": [e["step"] for e in evals], "score": scores},
              "train_seconds": ckpt.get("train_seconds", float("nan")),
              "run_dir": str(run)}
    write_json(run / "result.json", result, indent=1)
    return result


def ope_stage(job: BenchConfig, run: Path) -> dict[str, Any]:
    """FQE estimate of the final policy's value from the dataset, beside the simulator's."""
    done = _read_json(run / "ope.json")
    if done is not None and done.get("updates") == job.ope_updates and done.get("gamma") == job.gamma:
        return done
    from robotrl.cli.ope import off_policy_value

    result = off_policy_value(str(run / "checkpoints" / "last.pt"), job.dataset, job.ope_updates,
                              job.gamma, episodes=job.episodes, device=job.device, seed=job.seed)
    write_json(run / "ope.json", result, indent=1)
    return result


def bench_job(job: BenchConfig) -> dict[str, Any] | None:
    """One (algorithm, dataset, seed): train, then off-policy evaluation; errors are recorded
    in ``failed.json`` and returned as None so the sweep goes on."""
    import torch

    from robotrl.logging import console

    run = run_dir(job.out, job.algorithm, job.dataset, job.seed)
    run.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(job.threads or os.cpu_count() or 1)
    name = f"{job.algorithm} {job.dataset} s{job.seed}"
    try:
        result = train_stage(job, run)
        if job.ope_updates:
            result = {**result, "ope": ope_stage(job, run)}
    except KeyboardInterrupt:
        raise
    except Exception as err:  # noqa: BLE001 - any failure of one run is recorded, not fatal
        write_json(run / "failed.json", {"error": f"{type(err).__name__}: {err}",
                                         "traceback": traceback.format_exc()}, indent=1)
        console.print(f"[red]{name} failed: {type(err).__name__}: {err} "
                      f"(details: {run / 'failed.json'})[/red]")
        return None
    (run / "failed.json").unlink(missing_ok=True)
    ope = result.get("ope")
    console.print(f"{name}: final {result['final']:.1f}, best {result['best']:.1f}"
                  + (f"; FQE {ope['estimate']:.1f} vs simulated {ope['simulated']:.1f}" if ope
                     else "") + f" ({result['train_seconds'] / 60:.1f} min)")
    return result


# ------------------------------------------------------------------------------ the command
def _list(value: str) -> list[str]:
    """``[a,b]``, ``a,b`` or ``a`` -> list."""
    value = value.strip()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    return [v.strip() for v in value.split(",") if v.strip()]


def _quote(value: str) -> str:
    """A value safe inside a Hydra sweep (paths may hold characters the grammar reserves)."""
    return value if all(c.isalnum() or c in "/_-." for c in value) else "'" + value.replace(
        "'", "\\'") + "'"


def parse_args(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """(settings, Hydra's own overrides ``hydra...``); bad keys and values exit naming them."""
    from robotrl.cli.args import parse_kv

    hydra_args = [a for a in argv if a.startswith(("hydra.", "hydra/", "+hydra", "-"))]
    fields = {f.name: f.type for f in dataclasses.fields(BenchConfig)}
    kinds = {k: {"int": int, "float": float, "str": str}[v] for k, v in fields.items()
             if k not in ("algorithm", "dataset", "seed")}
    kinds.update({"algos": str, "datasets": str, "suite": str, "seeds": int, "launcher": str,
                  "jobs": int, "run": bool, "reps": int})
    args = parse_kv([a for a in argv if a not in hydra_args], kinds)
    algos = _list(str(args.pop("algos", ",".join(ALGOS))))
    from robotrl.registry import ALGORITHMS

    offline = [a for a, entry in ALGORITHMS.items() if entry.runner == "offline"]
    for a in algos:
        if a not in offline:
            raise SystemExit(f"unknown offline algorithm {a!r}; available: {offline}")
    suite = str(args.pop("suite", ""))
    if suite and suite not in SUITES:
        raise SystemExit(f"unknown suite {suite!r}; available: {sorted(SUITES)}")
    datasets = _list(str(args.pop("datasets", ""))) or list(SUITES.get(suite, ()))
    if not datasets:
        raise SystemExit("give datasets=[id,...] (Minari ids, directories or .hdf5 files) or "
                         f"suite=NAME ({sorted(SUITES)})")
    launcher = str(args.pop("launcher", "basic"))
    if launcher not in LAUNCHERS:
        raise SystemExit(f"unknown launcher {launcher!r}; available: {sorted(LAUNCHERS)}")
    seeds = int(args.pop("seeds", 5))
    if seeds < 1:
        raise SystemExit(f"seeds must be >= 1, got {seeds}")
    settings = {"algos": algos, "datasets": datasets, "seeds": seeds, "launcher": launcher,
                "jobs": int(args.pop("jobs", os.cpu_count() or 1)), "run": args.pop("run", True),
                "reps": int(args.pop("reps", 50_000)), "job": BenchConfig(**args)}
    if settings["job"].updates < 1 or settings["job"].ope_updates < 0:
        raise SystemExit("updates must be >= 1 and ope_updates >= 0")
    return settings, hydra_args


def launch(settings: dict[str, Any], hydra_args: list[str]) -> None:
    """The sweep through Hydra's launcher plugin (jobs run ``bench_job``)."""
    import importlib.util

    import hydra
    from omegaconf import DictConfig, OmegaConf

    launcher, job = settings["launcher"], settings["job"]
    module = LAUNCHERS[launcher]
    if module and importlib.util.find_spec(module) is None:
        raise SystemExit(f"launcher={launcher} needs its Hydra plugin: pip install "
                         f"'robotrl[launchers]'")
    # the sweep varies the last key fastest: every seed-0 run comes first, then seed 1, ... so
    # a benchmark stopped early has whole seeds to report
    overrides = [f"seed=range({settings['seeds']})",
                 f"algorithm={','.join(settings['algos'])}",
                 f"dataset={','.join(_quote(d) for d in settings['datasets'])}",
                 *(f"{k}={_quote(str(v))}" for k, v in dataclasses.asdict(job).items()
                   if k not in ("algorithm", "dataset", "seed")),
                 f"hydra/launcher={launcher}"]
    if launcher == "joblib":
        overrides.append(f"hydra.launcher.n_jobs={settings['jobs']}")

    @hydra.main(config_path="pkg://robotrl.configs", config_name="offline_bench",
                version_base="1.3")
    def _job(dcfg: DictConfig) -> None:
        bench_job(BenchConfig(**OmegaConf.to_container(dcfg, resolve=True)))

    saved = sys.argv
    sys.argv = ["robotrl offline-bench", "--multirun", *overrides, *hydra_args]
    try:
        _job()
    finally:
        sys.argv = saved


def collect_results(settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Every expected run's result (with its OPE), or a record of why it is missing."""
    job = settings["job"]
    results = []
    for dataset in settings["datasets"]:
        for algo in settings["algos"]:
            for seed in range(settings["seeds"]):
                run = run_dir(job.out, algo, dataset, seed)
                r = _read_json(run / "result.json")
                if r is None or r.get("updates") != job.updates:
                    failed = _read_json(run / "failed.json")
                    results.append({"algo": algo, "dataset": dataset, "seed": seed,
                                    "missing": failed["error"] if failed else "not run"})
                    continue
                ope = _read_json(run / "ope.json")
                if ope is not None:
                    r["ope"] = ope
                results.append(r)
    return results


def offline_bench_main(argv: list[str]) -> None:
    from robotrl.bench.report import write_report
    from robotrl.logging import console

    settings, hydra_args = parse_args(argv)
    job = settings["job"]
    n = len(settings["algos"]) * len(settings["datasets"]) * settings["seeds"]
    if settings["run"]:
        from robotrl.data import DatasetError, load_card

        for d in settings["datasets"]:  # fail before launching anything
            try:
                card = load_card(d)
            except DatasetError as err:
                raise SystemExit(f"dataset error: {err}") from None
            if card.ref_min_score is None or card.ref_max_score is None:
                raise SystemExit(f"dataset error: {d} has no reference returns (ref_min_score, "
                                 "ref_max_score) for normalized scores; record it with "
                                 "robotrl dataset collect ... expert=EXPERT.pt")
        console.print(f"[bold]robotrl offline-bench[/bold]: {n} runs ({len(settings['algos'])} "
                      f"algorithms x {len(settings['datasets'])} datasets x {settings['seeds']} "
                      f"seeds), {job.updates:,} updates each, launcher {settings['launcher']} "
                      f"-> {job.out}")
        t0 = time.perf_counter()
        launch(settings, hydra_args)
        settings["sweep_seconds"] = time.perf_counter() - t0
        console.print(f"sweep finished in {settings['sweep_seconds'] / 60:.1f} min")
    results = collect_results(settings)
    write_report(results, settings, Path(job.out))
