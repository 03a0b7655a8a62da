"""``robotrl plot``: learning curves from run directories, seeds of one config averaged with a
95% Student-t interval, one panel per metric, bad input refused with exit 2."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from robotrl.bench.plot import load_curves
from robotrl.cli.main import main
from robotrl.experiment import Experiment, RunDir
from robotrl.stats import mean_interval


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs/ppo/s0, s1 (num_seeds=2) and runs/single (seed 5): PPO, 4 evaluations each."""
    from tests.conftest import small_config

    root = tmp_path_factory.mktemp("runs")
    over = {"total_steps": 4 * 64, "eval_interval": 1, "algo": {"rollout_steps": 16}}
    Experiment(small_config(root / "ppo", "ppo", num_seeds=2, **over)).run()
    Experiment(small_config(root / "single", "ppo", seed=5, **over)).run()
    return root


def test_seeds_are_averaged_per_evaluation(runs: Path) -> None:
    curves = {c.label: c for c in load_curves([str(runs)], ["return_mean", "length_mean"])}
    assert set(curves) == {"ppo", "single"}
    ppo = curves["ppo"]
    assert [r.name for r in ppo.runs] == ["s0", "s1"]
    evals = [RunDir(r).evaluations() for r in ppo.runs]
    assert ppo.x == [float(e["step"]) for e in evals[0]] == [64.0, 128.0, 192.0, 256.0]
    for i, (mean, low, high) in enumerate(ppo.y["return_mean"]):
        assert (mean, low, high) == mean_interval([e[i]["return_mean"] for e in evals])
        assert low <= mean <= high
    single = curves["single"].y["length_mean"]
    assert all(low == mean == high for mean, low, high in single)  # one run: no interval
    minutes = load_curves([str(runs / "ppo")], ["return_mean"], x="minutes")[0].x
    assert minutes == sorted(minutes) and all(math.isfinite(m) and m >= 0 for m in minutes)


@pytest.mark.parametrize("out", ["curves.png", "curves.svg"])
def test_cli_writes_the_figure(runs: Path, tmp_path: Path, out: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    main(["plot", str(runs / "ppo"), str(runs / "single"), "metric=return_mean,length_mean",
          "x=minutes", f"out={tmp_path / out}"])
    said = capsys.readouterr().out
    assert "ppo (n=2), last evaluation: return_mean" in said and "single (n=1)" in said
    data = (tmp_path / out).read_bytes()
    assert data.startswith(b"\x89PNG") if out.endswith("png") else b"<svg" in data
    assert [p.name for p in tmp_path.iterdir()] == [out]  # no temporary file left


@pytest.mark.parametrize(("args", "message"), [
    (["metric=score"], "no run evaluated ['score']; available metrics: ['length_mean',"),
    (["x=hours"], "x='hours'; allowed: steps, minutes"),
    (["out=curves.jpg"], "must be one of .png, .svg, .pdf"),
    (["colour=red"], "unknown key 'colour'; allowed keys: ['metric', 'out', 'x']"),
])
def test_bad_input_is_refused_with_exit_2(runs: Path, tmp_path: Path, args: list[str],
                                          message: str, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["plot", str(runs), *args])
    assert stop.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["plot", str(tmp_path / "missing")])
    assert stop.value.code == 2 and "no such run directory" in capsys.readouterr().err
