"""Prints the rliable 1.2.0 reference numbers pinned in tests/test_stats.py.

rliable does not import next to current pandas, so it runs in a venv of its own:

    python3 -m venv /tmp/rliable && /tmp/rliable/bin/pip install rliable==1.2.0 arch==7.2.0 'pandas<3'
    /tmp/rliable/bin/python tests/data/rliable_reference.py

The inputs are rebuilt in the test from the same seed (numpy's default_rng is stable across
versions). Bootstrap intervals are Monte Carlo: the script prints them for two seeds so the
test's tolerance can be set from their spread.
"""

import json

import numpy as np
from rliable import library as rly
from rliable import metrics


def inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2021)
    return {"A": rng.beta(2.0, 2.0, size=(5, 4)) * 1.2,
            "B": rng.beta(2.0, 3.0, size=(5, 4)) * 1.2,
            "C": np.round(rng.uniform(0.0, 1.0, size=(3, 4)), 1)}  # ties


scores = inputs()
aggs = {"IQM": metrics.aggregate_iqm, "Mean": metrics.aggregate_mean,
        "Median": metrics.aggregate_median, "Optimality gap": metrics.aggregate_optimality_gap}
out = {"point": {}, "ci": {}, "poi": {}, "profile": {}}
for seed in (0, 1):
    np.random.seed(seed)  # rliable's resampling draws from numpy's global RNG
    for name, f in aggs.items():
        point, ci = rly.get_interval_estimates(
            scores, lambda x, f=f: np.array([f(x)]), reps=50000)
        for algo in scores:
            out["point"][f"{name}/{algo}"] = float(point[algo][0])
            out["ci"].setdefault(f"{name}/{algo}", []).append([float(v) for v in ci[algo][:, 0]])
    pairs = {"A,B": (scores["A"], scores["B"]), "B,A": (scores["B"], scores["A"]),
             "A,C": (scores["A"], scores["C"])}
    point, ci = rly.get_interval_estimates(
        pairs, lambda x, y: np.array([metrics.probability_of_improvement(x, y)]), reps=2000)
    for k in pairs:
        out["poi"][k] = float(point[k][0])
        out["ci"].setdefault(f"poi/{k}", []).append([float(v) for v in ci[k][:, 0]])
    taus = np.linspace(0.0, 1.2, 7)
    prof, prof_ci = rly.create_performance_profile(scores, taus, reps=2000)
    for algo in scores:
        out["profile"][algo] = prof[algo].tolist()
        out["ci"].setdefault(f"profile/{algo}", []).append(prof_ci[algo].tolist())
print(json.dumps(out, indent=1))
