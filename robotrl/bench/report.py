"""A grid's report: tables, statistics and figures computed from its cells' compact records
(``robotrl.bench.harness.collect``) alone, so anyone can recompute them from the committed
results file.

- Per target (task or dataset) and budget: every contestant's IQM over seeds of the final
  evaluation with a stratified-bootstrap 95% CI (``robotrl.stats``), seeds, steps and mean wall
  clock; PASS/FAIL against the grid's threshold where it has one. A contestant is an algorithm
  run by robotrl (``sac``) or by a peer (``sac@sb3``).
- Where a peer runs the same algorithm: whether our cell's IQM lies below, within or above the
  peer's 95% interval (peer cells with 2+ seeds), and the probability that a robotrl run beats a
  peer run (stratified over targets), bootstrap 95% CI.
- The grid's orderings (``td3bc >= bc + 10`` on named datasets; or at equal wall clock): met or
  missed per target, for robotrl and for each peer that runs both algorithms.
- Over targets, for normalized metrics (``normalized_score``: 100 = expert; ``success``): IQM,
  mean, median and optimality gap with stratified-bootstrap CIs, for contestants with every
  cell finished; probability of improvement for every pair.
- Offline grids with fitted Q evaluation: FQE against the simulator, rank correlation and error.
- Grids whose cells start from an ``init`` stage (behaviour cloning, then RL): every seed's
  score before (the cell's evaluation at step 0) and after, for the metric and ``also``, the
  paired gain's mean with a Student-t 95% CI, and the wall clock of both stages.
- The machines the cells ran on, each with the range of its cells' mean load average where
  recorded (``robotrl.bench.harness.LoadSampler``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from robotrl import stats
from robotrl.bench.grid import ROBOTRL, Grid

TAUS = np.linspace(0.0, 1.2, 61)
"""Normalized-score thresholds (/100) of the performance profiles."""
SCALE = {"normalized_score": 100.0, "success": 1.0}
"""Metrics comparable across targets, and the score of an expert (aggregates divide by it)."""


def contestant(record: dict[str, Any]) -> str:
    """``algo`` for robotrl's runs, ``algo@peer`` for a peer's."""
    return record["algo"] if record["runner"] == ROBOTRL else f"{record['algo']}@{record['runner']}"


def contestants(grid: Grid) -> list[str]:
    out = []
    for a in grid.algos:
        out.append(a)
        out += [f"{a}@{p}" for p, cfg in grid.peers.items() if a in cfg.algos]
    return out


def _matrix(done: list[dict[str, Any]], who: str, targets: list[str], seeds: list[int],
            key: str, scale: float = 1.0) -> np.ndarray | None:
    """``[seeds, targets]`` scores / ``scale`` of contestant ``who``, or None if one is missing."""
    table = {(r["target"], r["seed"]): r[key] for r in done if contestant(r) == who}
    if any((t, s) not in table for t in targets for s in seeds):
        return None
    return np.array([[table[(t, s)] / scale for t in targets] for s in seeds])


def summarize(grid: Grid, records: list[dict[str, Any]], reps: int = 50_000) -> dict[str, Any]:
    """Every number of the report (see the module docstring), per budget; bootstrap seeds are
    fixed, so the same records always give the same summary."""
    out: dict[str, Any] = {"budgets": {}, "missing": [
        f"{contestant(r)} {r['target']} {r['budget']:,} s{r['seed']}: {r['missing']}"
        for r in records if "missing" in r]}
    names = contestants(grid)
    if any("data" in r for r in records):  # offline cells record their dataset's digest
        out["data"] = {t: dict(Counter(r.get("data", "") for r in records
                                       if "final" in r and r["target"] == t))
                       for t in grid.targets}
    for budget in grid.all_budgets:
        done = [r for r in records if "final" in r and r["budget"] == budget]
        section: dict[str, Any] = {"cells": {}, "vs_peer": {}, "aggregates": {},
                                   "improvement": {}, "profiles": {}, "complete": []}
        for target in grid.targets:
            for who in names:
                rs = [r for r in done if r["target"] == target and contestant(r) == who]
                if not rs:
                    continue
                scores = np.array([[r["final"]] for r in rs])
                point = stats.interval_estimates({who: scores}, stats.iqm, reps=reps)[who]
                cell = {"iqm": point, "seeds": len(rs), "scores": [r["final"] for r in rs],
                        "steps": min(r["steps"] for r in rs),
                        "minutes": float(np.mean([r["train_seconds"] for r in rs])) / 60}
                if grid.also and not grid.init:  # e.g. tracking errors beside the return
                    cell["also"] = {k: _also_estimate([r.get("also", {}).get(k) for r in rs],
                                                      reps)
                                    for k in grid.also}
                threshold = grid.thresholds.get(who.split("@")[0], {}).get(target)
                if threshold is not None and "@" not in who:
                    cell["threshold"] = threshold
                    cell["pass"] = bool(point[0] >= threshold)
                section["cells"][f"{target}|{who}"] = cell
        section["against_peer"] = against_peer(grid, section["cells"])
        section["orderings"] = orderings(grid, section["cells"], done)
        for who in names:
            if "@" not in who:
                continue
            ours = who.split("@")[0]
            mats = {n: m for n in (ours, who)
                    if (m := _matrix(done, n, grid.targets, grid.seeds, "final")) is not None}
            if len(mats) == 2:
                (p, lo, hi), = stats.improvement_estimates(mats, [(ours, who)]).values()
                section["vs_peer"][f"{ours}>{who}"] = (p, lo, hi)
        scale = SCALE.get(grid.metric)
        if scale is not None:
            mats = {n: m for n in names if (m := _matrix(done, n, grid.targets, grid.seeds,
                                                         "final", scale)) is not None}
            section["complete"] = list(mats)
            if mats:
                section["aggregates"] = {name: stats.interval_estimates(mats, f, reps=reps)
                                         for name, f in stats.AGGREGATES.items()}
                pairs = [(x, y) for i, x in enumerate(mats) for y in list(mats)[i + 1:]]
                section["improvement"] = {f"{x}>{y}": v for (x, y), v in
                                          stats.improvement_estimates(mats, pairs).items()}
                section["profiles"] = {a: [c.tolist() for c in v] for a, v in
                                       stats.performance_profiles(mats, TAUS).items()}
        section["ope"] = ope_summary(done)
        section["init"] = init_summary(grid, done)
        out["budgets"][str(budget)] = section
    return out


def _also_estimate(values: list[float | None], reps: int) -> list[float] | None:
    """IQM over seeds [95% CI] of one ``also`` key (as the metric's), or None where a seed's
    run did not record it."""
    if not values or any(v is None for v in values):
        return None
    scores = np.array([[v] for v in values], dtype=float)
    return list(stats.interval_estimates({"x": scores}, stats.iqm, reps=reps)["x"])


def against_peer(grid: Grid, cells: dict[str, Any]) -> dict[str, str]:
    """``target|algo|peer`` -> where our cell's IQM lies against the peer's 95% interval on the
    same target (``below``, ``within``, ``above``), where the peer's cell has 2+ seeds."""
    out = {}
    for target in grid.targets:
        for peer, cfg in grid.peers.items():
            for algo in cfg.algos:
                ours, theirs = cells.get(f"{target}|{algo}"), cells.get(f"{target}|{algo}@{peer}")
                if ours is None or theirs is None or theirs["seeds"] < 2:
                    continue
                point, (_, lo, hi) = ours["iqm"][0], theirs["iqm"]
                out[f"{target}|{algo}|{peer}"] = ("below" if point < lo else
                                                  "above" if point > hi else "within")
    return out


def orderings(grid: Grid, cells: dict[str, Any], done: list[dict[str, Any]]
              ) -> list[dict[str, Any]]:
    """Each of the grid's orderings (``Grid.orderings``) on each of its targets, for robotrl and
    for every peer that runs both algorithms, where both cells finished: the two IQMs, their
    seeds, and whether the first is at least the second plus the margin. An ordering ``at``
    equal wall clock compares each side's evaluations at the faster side's end (``at_minutes``;
    ``minutes`` in the entry), where both sides' curves carry their minutes."""
    out = []
    for i, order in enumerate(grid.orderings):
        runners = [""] + [f"@{p}" for p, cfg in grid.peers.items()
                          if order.algo in cfg.algos and order.over in cfg.algos]
        for target in order.targets or grid.targets:
            for runner in runners:
                pair = [f"{target}|{order.algo}{runner}", f"{target}|{order.over}{runner}"]
                if any(k not in cells for k in pair):
                    continue
                entry = {"ordering": i, "target": target, "runner": runner[1:] or ROBOTRL,
                         "scores": tuple(cells[k]["iqm"][0] for k in pair),
                         "seeds": tuple(cells[k]["seeds"] for k in pair)}
                if order.at == "wall_clock":
                    found = at_minutes([[r for r in done if r["target"] == target
                                         and contestant(r) == k.split("|")[1]] for k in pair])
                    if found is None:
                        continue
                    entry.update(found)
                a, b = entry["scores"]
                entry["met"] = bool(a >= b + order.by)
                out.append(entry)
    return out


def at_minutes(sides: list[list[dict[str, Any]]]) -> dict[str, Any] | None:
    """Each side's IQM over seeds of its last evaluation at or before ``minutes``, the minute
    the faster side's slowest seed evaluated for the last time (so that side is read at its
    final evaluations), the seeds that had one and the machines their runs ran on (more than
    one: the minutes compare CPUs too); None where a record's curve has no minutes or a side
    has no evaluation that early."""
    if any("minutes" not in r.get("curve", {}) or not r["curve"]["minutes"]
           for rs in sides for r in rs):
        return None
    minutes = min(max(r["curve"]["minutes"][-1] for r in rs) for rs in sides)
    scores = []
    for rs in sides:
        by_then = [[s for s, m in zip(r["curve"]["score"], r["curve"]["minutes"], strict=True)
                    if m <= minutes] for r in rs]
        last = [[seen[-1]] for seen in by_then if seen]  # [seeds, 1 target]
        if not last:
            return None
        scores.append(last)
    # minutes depend on the CPU as much as on the algorithm: say when the sides' runs differ
    ran_on = sorted({str(r.get("machine") or "unknown") for rs in sides for r in rs})
    return {"scores": tuple(float(stats.iqm(np.array(s))) for s in scores),
            "seeds": tuple(len(s) for s in scores), "minutes": minutes, "machines": ran_on}


def init_summary(grid: Grid, done: list[dict[str, Any]]) -> dict[str, Any]:
    """Per ``target|algo`` of an ``init`` grid: the seeds' rows (before and after per key, both
    stages' seconds) and per key the before, after and paired-gain means with Student-t 95%
    CIs over the seeds that have both."""
    out: dict[str, Any] = {}
    keys = [grid.metric, *grid.also]
    for target in grid.targets:
        for algo in grid.init:
            rs = sorted((r for r in done if r["target"] == target and r["algo"] == algo
                         and r["runner"] == ROBOTRL and "init" in r), key=lambda r: r["seed"])
            if not rs:
                continue
            rows = [{"seed": r["seed"], "init_seconds": r["init"]["train_seconds"],
                     "train_seconds": r["train_seconds"],
                     **{k: (r["init"]["before"].get(k),
                            r["final"] if k == grid.metric else r["also"].get(k)) for k in keys}}
                    for r in rs]
            paired = {}
            for k in keys:
                pairs = [row[k] for row in rows if None not in row[k]]
                if pairs:
                    before, after = zip(*pairs, strict=True)
                    paired[k] = {"seeds": len(pairs), "before": stats.mean_interval(before),
                                 "after": stats.mean_interval(after),
                                 "gain": stats.mean_interval([a - b for b, a in pairs])}
            out[f"{target}|{algo}"] = {"rows": rows, "paired": paired}
    return out


def ope_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """FQE against the simulator over the runs that have both."""
    with_ope = [r for r in runs if "ope" in r]
    if len(with_ope) < 2:
        return {"runs": len(with_ope)}
    from scipy.stats import spearmanr

    est, sim, final = (np.array([r["ope"]["estimate"] for r in with_ope]),
                       np.array([r["ope"]["simulated"] for r in with_ope]),
                       np.array([r["final"] for r in with_ope]))
    err = np.abs(est - sim)
    # choosing among policies trained on the same data is what OPE is for: rank within a dataset
    within = []
    for d in sorted({r["target"] for r in with_ope}):
        idx = [i for i, r in enumerate(with_ope) if r["target"] == d]
        if len(idx) >= 3 and np.ptp(est[idx]) > 0 and np.ptp(sim[idx]) > 0:
            within.append(float(spearmanr(est[idx], sim[idx]).statistic))
    return {"runs": len(with_ope),
            "spearman": float(spearmanr(est, sim).statistic),
            "spearman_within_dataset": float(np.mean(within)) if within else float("nan"),
            "datasets_ranked": len(within),
            "spearman_vs_final_score": float(spearmanr(est, final).statistic),
            "median_abs_error": float(np.median(err)),
            "median_rel_error": float(np.median(err / np.maximum(np.abs(sim), 1e-8)))}



# ------------------------------------------------------------------------------ markdown
def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.2f} h"


def _ci(v: tuple[float, float, float] | list[float], scale: float = 1.0, digits: int = 1
        ) -> str:
    m, lo, hi = (x * scale for x in v)
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def plural(n: int, word: str) -> str:
    """``1 seed``, ``3 seeds``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def markdown(grid: Grid, summary: dict[str, Any], machines: list[str], figures: list[str]
             ) -> str:
    names = contestants(grid)
    kind = "datasets" if grid.offline else "tasks"
    digits = 3 if grid.metric.endswith("success") else 1  # a rate, or a return / a score
    lines = [f"# {grid.name}: {plural(len(grid.algos), 'algorithm')} x "
             f"{plural(len(grid.targets), kind[:-1])} x {plural(len(grid.seeds), 'seed')}", "",
             f"Metric: final evaluation's `{grid.metric}` (deterministic policy). Cells: IQM "
             "over seeds [stratified-bootstrap 95% CI] (n seeds; n=1 is a single run, no "
             "interval), mean wall clock per run. Machine: " + ("; ".join(machines) or "unknown")
             + ".", ""]
    for budget, section in summary["budgets"].items():
        unit = "gradient updates" if grid.offline else "env steps"
        lines += [f"## {int(budget):,} {unit}", "", "| " + kind[:-1] + " | " + " | ".join(names)
                  + " |", "|---|" + "---:|" * len(names)]
        for target in grid.targets:
            row = []
            for who in names:
                c = section["cells"].get(f"{target}|{who}")
                if c is None:
                    row.append("—")
                    continue
                verdict = (f" **{'PASS' if c['pass'] else 'FAIL'}** (≥ {c['threshold']:g})"
                           if "pass" in c else "")
                score = (_ci(c["iqm"], digits=digits) if c["seeds"] > 1  # one run: no interval
                         else f"{c['iqm'][0]:.{digits}f}")
                versus = [f"{where} {peer}'s CI" for peer in grid.peers
                          if (where := section["against_peer"].get(f"{target}|{who}|{peer}"))]
                row.append(f"{score} (n={c['seeds']}, "
                           f"{c['minutes']:.1f} min){verdict}"
                           + (f" *{', '.join(versus)}*" if versus else ""))
            lines.append(f"| {target} | " + " | ".join(row) + " |")
        lines.append("")
        lines += _also_markdown(grid, section["cells"], names)
        lines += _against_peer_markdown(grid, section)
        lines += _orderings_markdown(grid, section["orderings"], digits)
        if section["vs_peer"]:
            lines += ["P(a robotrl run beats a peer run), stratified over "
                      f"{kind}, bootstrap 95% CI:", ""]
            lines += [f"- {k.replace('>', ' > ')}: {v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]"
                      for k, v in section["vs_peer"].items()]
            lines.append("")
        if section["aggregates"]:
            aggs, scale = section["aggregates"], SCALE[grid.metric]
            lines += [f"Over {kind} (scores / {scale:g}; optimality gap: lower is better); "
                      f"contestants with every cell finished: {', '.join(section['complete'])}.",
                      "", "| contestant | " + " | ".join(aggs) + " |", "|---|" + "---:|" * len(aggs)]
            lines += [f"| {a} | " + " | ".join(_ci(aggs[n][a], scale) for n in aggs) + " |"
                      for a in section["complete"]]
            lines.append("")
            if section["improvement"]:
                lines += ["| X > Y | P(X > Y) [95% CI] |", "|---|---:|"]
                lines += [f"| {k.replace('>', ' > ')} | {v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}] |"
                          for k, v in section["improvement"].items()]
                lines.append("")
        lines += _init_markdown(grid, section["init"])
        ope = section["ope"]
        if ope.get("runs", 0) >= 2:
            lines += [f"Off-policy evaluation (FQE, {grid.ope_updates:,} updates) against the "
                      f"simulator's discounted return of the same final policy, {ope['runs']} "
                      f"runs: Spearman {ope['spearman']:.2f} across all runs, "
                      f"{ope['spearman_within_dataset']:.2f} within a dataset "
                      f"({ope['datasets_ranked']} datasets); median absolute error "
                      f"{ope['median_abs_error']:.1f} ({100 * ope['median_rel_error']:.0f}%).", ""]
    lines += _data_markdown(summary.get("data", {}))
    if grid.notes:
        lines += [grid.notes.strip(), ""]
    if grid.threshold_sources:
        lines += ["Thresholds: " + "; ".join(f"{k}: {v}" for k, v in
                                             grid.threshold_sources.items()) + ".", ""]
    if summary["missing"]:
        lines += ["Missing cells:", "", *[f"- {m}" for m in summary["missing"]], ""]
    lines += [f"![{Path(f).stem}]({Path(f).parent.name}/{Path(f).name})" for f in figures]
    return "\n".join(lines).rstrip() + "\n"


def _also_markdown(grid: Grid, cells: dict[str, Any], names: list[str]) -> list[str]:
    """The ``also`` keys of every finished cell (IQM [95% CI]; one run: its value)."""
    rows = [(target, who, cells[f"{target}|{who}"]) for target in grid.targets for who in names
            if "also" in cells.get(f"{target}|{who}", {})]
    if not rows:
        return []
    lines = ["| task | contestant | seeds | " + " | ".join(grid.also) + " |",
             "|---|---|---:|" + "---:|" * len(grid.also)]
    for target, who, cell in rows:
        values = [("—" if (v := cell["also"][k]) is None else
                   _ci(v, digits=3) if cell["seeds"] > 1 else f"{v[0]:.3f}") for k in grid.also]
        lines.append(f"| {target} | {who} | {cell['seeds']} | " + " | ".join(values) + " |")
    return [*lines, ""]


def _against_peer_markdown(grid: Grid, section: dict[str, Any]) -> list[str]:
    """The count of our cells below, within and above the peer's interval, naming those below."""
    verdicts = section["against_peer"]
    if not verdicts:
        return []
    below = [key.split("|") for key, where in verdicts.items() if where == "below"]
    peers = ", ".join(grid.peers)
    lines = [f"Against the peer ({peers}): our IQM within or above the peer's 95% interval in "
             f"{len(verdicts) - len(below)} of the {len(verdicts)} cells where the peer has 2 or "
             "more seeds (*below*, *within*, *above* in the cells)"
             + (": below in " + "; ".join(f"{a} on {t} ({p})" for t, a, p in below) if below
                else "") + ".", ""]
    return lines


def _orderings_markdown(grid: Grid, found: list[dict[str, Any]], digits: int) -> list[str]:
    """A table of the grid's orderings: per target, each runner's two IQMs, met or missed."""
    if not found:
        return []
    runners = [r for r in [ROBOTRL, *grid.peers] if any(f["runner"] == r for f in found)]
    full = len(grid.seeds)
    lines = ["Orderings the literature expects (IQM over seeds; met when the first is at least "
             f"the second plus the margin; n where a cell has fewer than {full} seeds):", "",
             "| ordering | " + ("dataset" if grid.offline else "task") + " | "
             + " | ".join(runners) + " |", "|---|---|" + "---|" * len(runners)]
    by_key = {(f["ordering"], f["target"], f["runner"]): f for f in found}
    keys = sorted({(i, target) for i, target, _ in by_key},
                  key=lambda k: (k[0], grid.targets.index(k[1])))
    for i, target in keys:
        row = []
        for runner in runners:
            f = by_key.get((i, target, runner))
            if f is None:
                row.append("—")
                continue
            a, b = f["scores"]
            seeds = "" if min(f["seeds"]) >= full else f" (n={f['seeds'][0]}, {f['seeds'][1]})"
            when = f" at {f['minutes']:.1f} min" if "minutes" in f else ""
            when += " †" if len(f.get("machines", ())) > 1 else ""
            row.append(f"{a:.{digits}f} vs {b:.{digits}f}{when}{seeds}: "
                       + ("**met**" if f["met"] else "**missed**"))
        lines.append(f"| {grid.orderings[i].label} | {target} | " + " | ".join(row) + " |")
    met = sum(f["met"] for f in found if f["runner"] == ROBOTRL)
    ours = sum(f["runner"] == ROBOTRL for f in found)
    mixed = [f for f in found if len(f.get("machines", ())) > 1]
    note = ([f"† the runs compared at equal wall clock ran on different machines "
             f"({'; '.join(sorted({m for f in mixed for m in f['machines']}))}): their minutes "
             "compare the CPUs as well as the algorithms.", ""] if mixed else [])
    return lines + ["", f"robotrl meets {met} of the {ours} orderings with both cells finished.",
                    "", *note]


def _data_markdown(data: dict[str, dict[str, int]]) -> list[str]:
    """Which recording of each dataset the finished cells trained on (``Dataset.digest``)."""
    if not data:
        return []
    lines = ["Data each finished cell trained on (`Dataset.digest`: its rows and reference "
             "returns; cells from before digests were recorded: not recorded):", ""]
    for target, counts in data.items():
        parts = [f"{d} ({n} cells)" if d else f"not recorded ({n} cells)"
                 for d, n in sorted(counts.items(), key=lambda kv: (kv[0] == "", kv[0]))]
        recorded = sum(1 for d in counts if d)
        flag = (" — **more than one recording: these cells are not comparable**" if recorded > 1
                else " — **the cells not recorded may be of another recording**"
                if recorded and "" in counts else "")
        lines.append(f"- {target}: " + ", ".join(parts) + flag)
    return lines + [""]


def _init_markdown(grid: Grid, init: dict[str, Any]) -> list[str]:
    """Before/after tables of an ``init`` grid (``init_summary``)."""
    lines: list[str] = []
    keys = [grid.metric, *grid.also]

    def pair(v: Any) -> str:
        return "—" if v is None or None in v else f"{v[0]:.3f} → {v[1]:.3f}"

    for name, entry in init.items():
        target, algo = name.split("|")
        stage = grid.init[algo]
        lines += [f"{algo} on {target} from {stage.algo} ({stage.budget:,} updates on "
                  f"`{stage.dataset}`): before (the {stage.algo} policy, the run's evaluation at "
                  "step 0) → after, every seed; minutes of each stage.", "",
                  "| seed | " + " | ".join(keys) + f" | {stage.algo} min | {algo} min |",
                  "|---:|" + "---:|" * (len(keys) + 2)]
        for row in entry["rows"]:
            lines.append(f"| {row['seed']} | " + " | ".join(pair(row[k]) for k in keys)
                         + f" | {row['init_seconds'] / 60:.1f} | {row['train_seconds'] / 60:.1f} |")
        for k, p in entry["paired"].items():
            verdict = ("one seed, no interval" if p["seeds"] < 2 else
                       "its CI is above zero" if p["gain"][1] > 0 else "its CI is not above zero")
            lines.append(f"\n{k}: before {_ci(p['before'], digits=3)}, after "
                         f"{_ci(p['after'], digits=3)}, paired gain {_ci(p['gain'], digits=3)} "
                         f"(mean [95% t-CI] over {p['seeds']} seeds): {verdict}.")
        lines.append("")
    return lines


# ------------------------------------------------------------------------------ figures
def figure_paths(grid: Grid, records: list[dict[str, Any]], folder: Path
                 ) -> list[tuple[int, str, Path]]:
    """(budget, x axis, PNG) of each figure of the report: curves against steps per budget, and
    against wall-clock minutes too where the grid has an ordering at equal wall clock and some
    record's curve has its minutes. A budget no record has a curve at yet has none (an empty
    figure says nothing)."""
    timed = (any(o.at == "wall_clock" for o in grid.orderings)
             and any("minutes" in r.get("curve", {}) for r in records))
    axes = ["steps"] + (["minutes"] if timed else [])
    drawn = {r["budget"] for r in records if r.get("curve", {}).get("steps")}
    return [(b, x, folder / f"{grid.name}-{b}-{'curves' if x == 'steps' else x}.png")
            for b in grid.all_budgets if b in drawn for x in axes]


def figures(grid: Grid, records: list[dict[str, Any]], folder: Path) -> list[str]:
    """Learning curves per target (every contestant's mean with a 95% interval over seeds,
    ``robotrl.bench.plot.draw_panels``, as ``robotrl plot`` draws run directories; each
    algorithm's threshold on the target a dashed line in its colour) as one PNG per budget and
    x axis (``figure_paths``; against minutes, each evaluation at the seeds' mean minute); none
    (with a note) when matplotlib (the ``plot`` extra) is missing."""
    from robotrl.bench.plot import Line, draw_panels

    levels = {target.split("/", 1)[-1]: [(algo, float(by_target[target]))
                                         for algo, by_target in grid.thresholds.items()
                                         if target in by_target and algo in grid.algos]
              for target in grid.targets}
    written = []
    for budget, x, path in figure_paths(grid, records, folder):
        panels: dict[str, list[Line]] = {}
        for target in grid.targets:
            lines = panels.setdefault(target.split("/", 1)[-1], [])
            for who in contestants(grid):
                curves = [r["curve"] for r in records if "curve" in r and r["target"] == target
                          and contestant(r) == who and r["budget"] == budget and r["curve"]["steps"]
                          and x in r["curve"]]
                if curves:
                    n = min(len(c["score"]) for c in curves)
                    xs = ([float(s) for s in curves[0]["steps"][:n]] if x == "steps" else
                          [float(np.mean([c[x][i] for c in curves])) for i in range(n)])
                    lines.append(Line(who, xs, [stats.mean_interval([c["score"][i] for c in curves])
                                                for i in range(n)]))
        xlabel = ("wall-clock minutes" if x == "minutes" else
                  "gradient updates" if grid.offline else "env steps")
        try:
            draw_panels(panels, xlabel, path, levels=levels,
                        ylabel=f"{grid.metric} (mean, 95% interval over seeds)")
        except ValueError as err:  # matplotlib missing
            print(f"no figures: {err}")
            return written
        written.append(str(path))
    return written


def machines(records: list[dict[str, Any]]) -> list[str]:
    """Each machine the records ran on, with the range of its cells' mean load average where
    they have one (``load.json``; records from before it have none)."""
    out = []
    for name in sorted({r["machine"] for r in records if r.get("machine")}):
        runs = [r for r in records if r.get("machine") == name]
        loads = [r["load"] for r in runs if "load" in r]
        if loads:
            low, high = min(loads), max(loads)
            span = f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f}"
            some = ("" if len(loads) == len(runs) else
                    f", recorded for {len(loads)} of its {len(runs)} runs")
            name += f" (load average {span}{some})"
        out.append(name)
    return out


def report(grid: Grid, records: list[dict[str, Any]], with_figures: bool = True,
           reps: int = 50_000) -> tuple[str, dict[str, Any]]:
    """(markdown, summary) of ``records``; figures next to the report file."""
    summary = summarize(grid, records, reps)
    folder = grid.report_path.parent / "figures"
    if with_figures:
        figures(grid, records, folder)
    names = [str(path) for _, _, path in figure_paths(grid, records, folder)]
    return markdown(grid, summary, machines(records), names), summary
