"""A benchmark is a declared grid: algorithms x tasks (or datasets) x seeds x budgets, run by
robotrl and by the peers declared beside it; every cell an ordinary run directory.

    # benchmarks/grids/zoo_onpolicy.yaml
    name: zoo-onpolicy
    out: runs/bench/zoo-onpolicy
    algos: {ppo: [], trpo: []}          # algorithm -> its extra overrides
    tasks: [halfcheetah, hopper]         # or datasets: [...] for offline algorithms
    seeds: [0, 1, 2]
    budgets: [1000000]                   # total_steps of each run
    overrides: [num_envs=16]             # every robotrl cell
    thresholds: {ppo: {halfcheetah: 5819}}
    orderings: [{algo: trpo, over: ppo, by: 100, targets: [hopper]}]   # met or missed, per runner
    peers:
      sb3: {script: benchmarks/peers/sb3.py, algos: {ppo: PPO}}

A stage before the cells (``init``): every cell of an algorithm starts from an offline run at
its seed, behaviour cloning then RL, as ``benchmarks/grids/vla_grpo_push.yaml`` does:

    tasks: [tabletop]
    algos: {grpo: [algo.outcome=success]}
    init:
      grpo: {algo: bc, dataset: runs/bench/vla/demos.hdf5, budget: 4000,
             collect: [task=tabletop, kind=scripted, steps=10240]}   # records it if missing
    metric: test_success
    also: [heldout_success]              # reported beside the metric

An algorithm may appear more than once under labels after ``@``, each a variant with its own
overrides, cells and rows (``algos: {td3bc: [], td3bc@bf16: [algo.precision=bf16]}``; the cells
train ``algo=td3bc``), so that an option is compared with the default in one report.

A variant of another grid names it and states only what differs (its fields replace the
other's, top-level): ``extends: sac_vs_sb3.yaml`` (a file beside it), as
``benchmarks/grids/sac_vs_sb3_gpu.yaml`` runs that grid's cells on a GPU.

A cell's directory is ``out/<runner>/<algo>/<target>/<budget>/s<seed>`` (``runner`` is
``robotrl`` or a peer's name; an ``init`` stage's run is ``s<seed>-init`` beside it). robotrl
cells hold what ``robotrl train`` writes; a peer writes
the same ``result.json`` (``robotrl.experiment.run.RESULT_FILE``) so the report reads every cell
alike. ``python``: the interpreter of a peer's own virtual environment (d3rlpy pins another
Gymnasium); a peer script gets one argument, the cell as a JSON file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from pathlib import Path
from typing import Any

from robotrl.config import from_dict

ROBOTRL = "robotrl"
"""The runner name of our own cells."""
def learner_name(algo: str) -> str:
    """The algorithm a grid's ``algos`` key trains: ``td3bc@bf16`` -> ``td3bc``."""
    return algo.split("@", 1)[0]


ORDERING_AT = ("final", "wall_clock")
"""Where an ``Ordering`` compares its two algorithms."""
FAMILIES = {
    "on-policy": "On-policy at rl-zoo's budget",
    "off-policy": "Off-policy against SB3",
    "offline": "Offline against d3rlpy and CORL's ordering",
    "vla": "Vision-language policies",
    "robots": "Robots",
    "archive": "Archive: superseded and exploratory grids",
}
"""``Grid.family`` -> its heading on the site's results overview (``robotrl.bench.overview``)."""


@dataclasses.dataclass
class PeerConfig:
    """A reference implementation run beside ours on the same cells."""

    script: str
    """The peer's runner: a Python file taking the cell's JSON path (``benchmarks/peers/``)."""
    algos: dict[str, str] = dataclasses.field(default_factory=dict)
    """Our algorithm name -> the peer's (only these algorithms get a peer cell)."""
    python: str = ""
    """Interpreter of the peer's virtual environment ('' : this one); ``$VAR`` is expanded."""
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Handed to the script with every cell (hyperparameters, evaluation episodes, ...)."""
    targets: list[str] = dataclasses.field(default_factory=list)
    """The grid's tasks or datasets it runs on ([]: every one): a peer beside a few of a large
    grid's cells."""


@dataclasses.dataclass
class InitStage:
    """What every cell of an algorithm starts from (``Grid.init``): an offline run of ``algo``
    on ``dataset`` for ``budget`` gradient updates at the cell's seed, whose final checkpoint
    the cell trains from (``init=``): behaviour cloning, then RL."""

    algo: str
    """Offline algorithm (``bc``)."""
    dataset: str
    """Its dataset (``dataset=``)."""
    budget: int
    """Its gradient updates (``total_steps``)."""
    overrides: list[str] = dataclasses.field(default_factory=list)
    """Its overrides beyond the grid's ``overrides`` that are not the cell algorithm's
    (``algo.*`` options of the stage's algorithm, ``eval_interval``...)."""
    collect: list[str] = dataclasses.field(default_factory=list)
    """``robotrl dataset collect`` arguments that record ``dataset`` (``out=`` added) before
    any cell runs, when it does not exist ([]: it must exist)."""


@dataclasses.dataclass
class Ordering:
    """An ordering the literature expects between two of the grid's algorithms (``Grid.orderings``):
    ``algo``'s IQM over seeds at least ``over``'s plus ``by`` on each of ``targets``, checked
    for robotrl's cells and for each peer that runs both."""

    algo: str
    """The algorithm expected ahead (``td3bc``)."""
    over: str
    """The one it is expected to beat (``bc``)."""
    by: float = 0.0
    """The margin, in the grid's metric (CORL's offline ordering: 10 normalized points)."""
    targets: list[str] = dataclasses.field(default_factory=list)
    """The tasks or datasets it is expected on ([]: every one; not ``on``, which YAML reads as
    true)."""
    at: str = "final"
    """final: the final evaluations; wall_clock: each side's last evaluations by the minute the
    faster side's runs end (the last evaluation of its slowest seed): a faster algorithm's
    claim, the best return for the time spent, whatever the steps."""

    @property
    def label(self) -> str:
        return (f"{self.algo} ≥ {self.over}" + (f" + {self.by:g}" if self.by else "")
                + (" at equal wall clock" if self.at == "wall_clock" else ""))


@dataclasses.dataclass
class Grid:
    """What a benchmark runs (see the module docstring); loaded from YAML by ``load_grid``."""

    name: str
    """Short name (titles, the results file)."""
    out: str
    """Root folder of the cells' run directories."""
    algos: dict[str, list[str]]
    """Algorithm -> overrides of its cells (``[]``: defaults and ``configs/tuned/``)."""
    tasks: list[str] = dataclasses.field(default_factory=list)
    """Tasks (``env=``) of online algorithms."""
    datasets: list[str] = dataclasses.field(default_factory=list)
    """Datasets (``dataset=``) of offline algorithms; give tasks or datasets, not both."""
    seeds: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 2])
    """Run seeds."""
    budgets: list[int] = dataclasses.field(default_factory=lambda: [1_000_000])
    """``total_steps`` of each run (env steps online, gradient updates offline)."""
    algo_budgets: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    """Algorithm -> its own budgets, replacing ``budgets`` for its cells: learners whose steps
    cost different wall clock side by side (PPO at 20M steps, an off-policy learner at 1M).
    Each budget is its own section of the report, with the algorithms that run it."""
    overrides: list[str] = dataclasses.field(default_factory=list)
    """Overrides of every robotrl cell (``logger.progress=false`` and ``torch_threads=1`` are
    added unless given)."""
    metric: str = "return_mean"
    """Evaluation key the report compares: ``return_mean``, ``normalized_score``, ``success``
    (group runs: ``test_success``, ``heldout_success``...)."""
    also: list[str] = dataclasses.field(default_factory=list)
    """Further evaluation keys recorded per cell and reported beside ``metric`` (``init``
    grids' before/after table)."""
    init: dict[str, InitStage] = dataclasses.field(default_factory=dict)
    """Algorithm -> the stage its cells start from; the report then gives every seed's score
    before (the cell's evaluation at step 0: the stage's policy) and after, the paired gain
    with its 95% CI, and the wall clock of both stages."""
    thresholds: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    """Algorithm -> target -> the score its final evaluation must reach (IQM over seeds)."""
    threshold_sources: dict[str, str] = dataclasses.field(default_factory=dict)
    """Target (or ``algo/target``) -> where its threshold comes from (printed under the table)."""
    orderings: list[Ordering] = dataclasses.field(default_factory=list)
    """Orderings between algorithms the report checks (met or missed, per target and runner)."""
    peers: dict[str, PeerConfig] = dataclasses.field(default_factory=dict)
    """Peer name -> how to run it."""
    ope_updates: int = 0
    """Offline cells: fitted Q evaluation updates of the final policy (0: none)."""
    batch_seeds: bool = False
    """Train a robotrl cell's seeds in one process (``num_seeds``: one job per algorithm,
    target and budget; the seeds must be consecutive) for algorithms with a seed-batched
    learner; each seed still lands in its own cell directory. Cells of other algorithms, and
    seeds already started, run one per job as usual."""
    family: str = "archive"
    """Where the site's results overview lists it (a key of ``FAMILIES``); ``archive``:
    superseded or exploratory."""
    notes: str = ""
    """Printed under the report's tables (how and where the cells ran, known caveats)."""
    results: str = ""
    """A JSON file collecting every finished cell's compact record, and how far each started one
    got (commit it: the report is recomputed from it alone); '' : ``out/results.json``."""
    report: str = ""
    """Markdown file the report is written to ('' : ``out/report.md``)."""

    def __post_init__(self) -> None:
        if bool(self.tasks) == bool(self.datasets):
            raise ValueError(f"grid {self.name!r}: give tasks or datasets (one of them)")
        if not self.algos or not self.seeds or not self.budgets:
            raise ValueError(f"grid {self.name!r}: algos, seeds and budgets must be non-empty")
        if self.batch_seeds and self.seeds != list(range(self.seeds[0],
                                                         self.seeds[0] + len(self.seeds))):
            raise ValueError(f"grid {self.name!r}: batch_seeds needs consecutive seeds "
                             f"(num_seeds trains seed .. seed + n - 1), got {self.seeds}")
        if any(b < 1 for b in self.budgets):
            raise ValueError(f"grid {self.name!r}: budgets must be >= 1, got {self.budgets}")
        for algo, budgets in self.algo_budgets.items():
            if algo not in self.algos:
                raise ValueError(f"grid {self.name!r}: algo_budgets names algorithm {algo!r} "
                                 f"the grid does not run ({sorted(self.algos)})")
            if not budgets or any(b < 1 for b in budgets):
                raise ValueError(f"grid {self.name!r}: algo_budgets.{algo} must be a non-empty "
                                 f"list of budgets >= 1, got {budgets}")
        from robotrl.registry import ALGORITHMS

        kind = "offline" if self.datasets else "online"
        fits = [n for n, e in ALGORITHMS.items() if e.offline == bool(self.datasets)]
        for algo in self.algos:
            if learner_name(algo) not in fits:
                raise ValueError(f"grid {self.name!r}: unknown {kind} algorithm {algo!r}; "
                                 f"available: {fits}")
        for algo, stage in self.init.items():
            offline = [n for n, e in ALGORITHMS.items() if e.offline]
            if algo not in self.algos:
                raise ValueError(f"grid {self.name!r}: init names algorithm {algo!r} the grid "
                                 f"does not run ({sorted(self.algos)})")
            if stage.algo not in offline:
                raise ValueError(f"grid {self.name!r}: init.{algo}.algo must be an offline "
                                 f"algorithm, got {stage.algo!r}; available: {offline}")
            if stage.budget < 1:
                raise ValueError(f"grid {self.name!r}: init.{algo}.budget must be >= 1, got "
                                 f"{stage.budget}")
            if any(algo in p.algos for p in self.peers.values()):
                raise ValueError(f"grid {self.name!r}: a peer cannot start from init.{algo}")
        if self.family not in FAMILIES:
            raise ValueError(f"grid {self.name!r}: unknown family {self.family!r}; allowed: "
                             f"{list(FAMILIES)}")
        for i, order in enumerate(self.orderings):
            for key in ("algo", "over"):
                if getattr(order, key) not in self.algos:
                    raise ValueError(f"grid {self.name!r}: orderings[{i}].{key} "
                                     f"{getattr(order, key)!r} is not one of the grid's "
                                     f"algorithms {sorted(self.algos)}")
            unknown = sorted(set(order.targets) - set(self.targets))
            if unknown:
                raise ValueError(f"grid {self.name!r}: orderings[{i}].targets names {unknown}, not "
                                 f"among the grid's targets {self.targets}")
            if order.at not in ORDERING_AT:
                raise ValueError(f"grid {self.name!r}: orderings[{i}].at must be one of "
                                 f"{list(ORDERING_AT)}, got {order.at!r}")
        for peer, p in self.peers.items():
            unknown = sorted(set(p.algos) - set(self.algos))
            if unknown:
                raise ValueError(f"grid {self.name!r}: peer {peer!r} names algorithms "
                                 f"{unknown} the grid does not run ({sorted(self.algos)})")
            unknown = sorted(set(p.targets) - set(self.targets))
            if unknown:
                raise ValueError(f"grid {self.name!r}: peer {peer!r} names targets {unknown}, "
                                 f"not among the grid's targets {self.targets}")

    @property
    def targets(self) -> list[str]:
        return self.tasks or self.datasets

    @property
    def offline(self) -> bool:
        return bool(self.datasets)

    def budgets_of(self, algo: str) -> list[int]:
        """The budgets of ``algo``'s cells (``algo_budgets``, else ``budgets``)."""
        return self.algo_budgets.get(algo, self.budgets)

    @property
    def all_budgets(self) -> list[int]:
        """Every budget some algorithm runs, in order of first mention (the report's sections)."""
        return list(dict.fromkeys(b for algo in self.algos for b in self.budgets_of(algo)))

    def cells(self) -> list[Cell]:
        """Every cell, seed slowest (a grid stopped early has whole seeds), then budget, target,
        algorithm, runner."""
        out = []
        for seed, budget, target, algo in itertools.product(self.seeds, self.all_budgets,
                                                            self.targets, self.algos):
            if budget not in self.budgets_of(algo):
                continue
            out.append(Cell(ROBOTRL, algo, target, seed, budget))
            out += [Cell(p, algo, target, seed, budget) for p, cfg in self.peers.items()
                    if algo in cfg.algos and (not cfg.targets or target in cfg.targets)]
        return out

    def run_dir(self, cell: Cell) -> Path:
        return (Path(self.out) / cell.runner / cell.algo / slug(cell.target) / str(cell.budget)
                / f"s{cell.seed}")

    def init_dir(self, cell: Cell) -> Path:
        """The run directory of the ``init`` stage ``cell`` starts from."""
        return self.run_dir(cell).with_name(f"s{cell.seed}-init")

    @property
    def results_path(self) -> Path:
        return Path(self.results or Path(self.out) / "results.json")

    @property
    def report_path(self) -> Path:
        return Path(self.report or Path(self.out) / "report.md")


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run of a grid."""

    runner: str
    algo: str
    target: str
    seed: int
    budget: int

    @property
    def label(self) -> str:
        return f"{self.runner} {self.algo} {self.target} {self.budget:,} s{self.seed}"


def slug(target: str) -> str:
    """A directory name for a task or dataset: a Minari id with ``/`` -> ``_``; a file or
    directory path its name plus a hash of the full path (two ``data.hdf5`` never collide)."""
    p = Path(target)
    if p.exists() or p.suffix == ".hdf5" or target.startswith(("/", ".")):
        digest = hashlib.sha1(str(p.resolve()).encode()).hexdigest()[:8]
        return f"{p.stem or 'data'}-{digest}"
    return target.replace("/", "_")


def load_grid(path: str | Path, overrides: dict[str, Any] | None = None) -> Grid:
    """The grid in YAML file ``path`` with top-level fields replaced by ``overrides`` (the
    command line's ``seeds=[0] budgets=[1000]``); unknown keys and wrong types fail naming
    them. A file with ``extends: OTHER.yaml`` (a path beside it) is that grid with the file's
    own top-level fields replacing the other's: a variant states only what differs."""
    data = _grid_data(Path(path), ())
    data.update(overrides or {})
    if isinstance(data.get("algos"), list):  # [ppo, trpo]: no extra overrides
        data["algos"] = {a: [] for a in data["algos"]}
    try:
        return from_dict(Grid, data, "grid")
    except TypeError as err:
        raise ValueError(str(err)) from None


def _grid_data(file: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    """The top-level fields of grid file ``file``, its ``extends`` resolved (``chain``: the
    files that extend it, to name a cycle)."""
    import yaml

    if not file.is_file():
        raise ValueError(f"grid file {file} not found"
                         + (f" (extended by {chain[-1]})" if chain else ""))
    if file.resolve() in chain:
        raise ValueError(f"grid file {file} extends itself through {[str(c) for c in chain]}")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"grid file {file} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"grid file {file} must hold a mapping, got {type(data).__name__}")
    base = data.pop("extends", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ValueError(f"grid file {file}: extends must be a file name, got {base!r}")
    return {**_grid_data(file.parent / base, (*chain, file.resolve())), **data}
