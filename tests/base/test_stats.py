"""robotrl.stats against rliable 1.2.0's own numbers and hand-worked cases.

The reference numbers below were printed by ``tests/fixtures/rliable_reference.py`` run with
rliable 1.2.0, arch 7.2.0, pandas 2.3.3, numpy (its venv's) on 2026-11-23; the inputs are rebuilt
here from the same seed. Point estimates must agree to 1e-5. Bootstrap intervals are Monte Carlo
(rliable draws from numpy's global RNG, we from a Generator): the reference is the mean of
rliable's intervals for two seeds, whose spread was <= 0.002 for the aggregates (50,000
resamples) and <= 0.01 / 0.05 for probability of improvement / profiles (2,000 resamples,
quantized values), so the tolerances are 0.006, 0.03 and 0.08.
"""

import numpy as np
import pytest

from robotrl import stats

POINT = {"IQM/A": 0.549219, "IQM/B": 0.412421, "IQM/C": 0.516667, "Mean/A": 0.57272,
         "Mean/B": 0.448598, "Mean/C": 0.525, "Median/A": 0.572197, "Median/B": 0.439723,
         "Median/C": 0.483333, "Optimality gap/A": 0.428787, "Optimality gap/B": 0.551402,
         "Optimality gap/C": 0.475}
CI = {"IQM/A": [0.440425, 0.667552], "IQM/B": [0.344805, 0.520567], "IQM/C": [0.4, 0.65],
      "Mean/A": [0.483428, 0.662696], "Mean/B": [0.355767, 0.543262],
      "Mean/C": [0.408333, 0.641667], "Median/A": [0.456021, 0.682389],
      "Median/B": [0.339874, 0.544702], "Median/C": [0.383333, 0.65],
      "Optimality gap/A": [0.340025, 0.516796], "Optimality gap/B": [0.456248, 0.644386],
      "Optimality gap/C": [0.358333, 0.591667]}
POI = {("A", "B"): (0.68, 0.5, 0.85), ("B", "A"): (0.32, 0.15, 0.505),
       ("A", "C"): (0.583333, 0.383333, 0.783333)}
TAUS = np.linspace(0.0, 1.2, 7)
PROFILE = {"A": [1.0, 1.0, 0.7, 0.45, 0.15, 0.05, 0.0], "B": [1.0, 0.9, 0.55, 0.2, 0.1, 0.0, 0.0],
           "C": [1.0, 0.916667, 0.833333, 0.25, 0.166667, 0.0, 0.0]}
PROFILE_CI = {"A": [[1.0, 1.0, 0.5, 0.25, 0.0, 0.0, 0.0], [1.0, 1.0, 0.85, 0.65, 0.3, 0.15, 0.0]],
              "B": [[1.0, 0.7744, 0.35, 0.05, 0.0, 0.0, 0.0], [1.0, 1.0, 0.75, 0.35, 0.2, 0.0, 0.0]],
              "C": [[1.0, 0.75, 0.6667, 0.0833, 0.0, 0.0, 0.0],
                    [1.0, 1.0, 1.0, 0.4167, 0.3333, 0.0, 0.0]]}


def inputs() -> dict[str, np.ndarray]:
    """The reference script's inputs (same generator, same draws)."""
    rng = np.random.default_rng(2021)
    return {"A": rng.beta(2.0, 2.0, size=(5, 4)) * 1.2,
            "B": rng.beta(2.0, 3.0, size=(5, 4)) * 1.2,
            "C": np.round(rng.uniform(0.0, 1.0, size=(3, 4)), 1)}


@pytest.mark.parametrize("name", list(stats.AGGREGATES))
def test_aggregates_match_rliable(name):
    scores = inputs()
    est = stats.interval_estimates(scores, stats.AGGREGATES[name], reps=50_000)
    for algo, (point, lo, hi) in est.items():
        assert point == pytest.approx(POINT[f"{name}/{algo}"], abs=1e-5)
        assert lo == pytest.approx(CI[f"{name}/{algo}"][0], abs=0.006)
        assert hi == pytest.approx(CI[f"{name}/{algo}"][1], abs=0.006)
        assert lo <= point <= hi


def test_probability_of_improvement_matches_rliable():
    est = stats.improvement_estimates(inputs(), list(POI), reps=20_000)
    for pair, (point, lo, hi) in POI.items():
        assert est[pair][0] == pytest.approx(point, abs=1e-5)
        assert est[pair][1] == pytest.approx(lo, abs=0.03)
        assert est[pair][2] == pytest.approx(hi, abs=0.03)


def test_performance_profiles_match_rliable():
    prof = stats.performance_profiles(inputs(), TAUS, reps=20_000)
    for algo, (curve, lo, hi) in prof.items():
        np.testing.assert_allclose(curve, PROFILE[algo], atol=1e-5)
        np.testing.assert_allclose(lo, PROFILE_CI[algo][0], atol=0.08)
        np.testing.assert_allclose(hi, PROFILE_CI[algo][1], atol=0.08)


def test_hand_worked():
    s = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]])  # 4 runs x 2 tasks
    assert stats.mean(s) == 3.5
    assert stats.median(np.array([[1.0, 2.0, 9.0]])) == 2.0
    assert stats.iqm(s) == pytest.approx(3.5)  # middle 4 of 0..7: 2, 3, 4, 5
    assert stats.iqm(np.array([[0.0, 0.0, 1.0, 100.0]])) == pytest.approx(0.5)  # outlier cut
    assert stats.optimality_gap(np.array([[0.5, 2.0]])) == pytest.approx(0.25)  # 2.0 counts 1
    x, y = np.array([[2.0], [3.0]]), np.array([[1.0], [2.0]])
    assert stats.probability_of_improvement(x, y) == pytest.approx(0.875)  # 3 wins, 1 tie of 4
    assert stats.probability_of_improvement(y, x) == pytest.approx(0.125)
    np.testing.assert_allclose(stats.score_distribution(s / 7, np.array([0.0, 0.5, 1.0])),
                               [7 / 8, 4 / 8, 0.0])
    m, lo, hi = stats.mean_interval([1.0, 2.0, 3.0])
    assert m == 2.0 and hi - m == pytest.approx(4.302653 / np.sqrt(3))  # t(0.975, 2) * sd / sqrt(n)
    assert stats.mean_interval([5.0]) == (5.0, 5.0, 5.0)


def test_constant_scores_have_zero_width_intervals():
    est = stats.interval_estimates({"k": np.full((3, 2), 0.7)}, stats.iqm, reps=500)
    assert est["k"] == pytest.approx((0.7, 0.7, 0.7))


def test_bad_scores_named():
    with pytest.raises(ValueError, match=r"has NaN.*\[\[1, 0\]\]"):
        stats.interval_estimates({"x": np.array([[1.0], [np.nan]])}, stats.mean, reps=10)
    with pytest.raises(ValueError, match="non-empty \\[runs, tasks\\]"):
        stats.interval_estimates({"x": np.zeros(3)}, stats.mean, reps=10)
