"""robotrl offline-bench: runs reused and resumed after an interruption, the report recomputable
from its JSON, bad input named; robotrl ope on a trained run."""

import json
from pathlib import Path

import pytest
import torch

from robotrl.bench.report import summarize
from robotrl.checkpoint import load_checkpoint
from robotrl.cli.offline_bench import offline_bench_main, run_dir
from robotrl.data import DatasetCard, save_hdf5
from robotrl.envs import make
from robotrl.runners.collect import collect
from robotrl.stats import mean_interval


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory) -> Path:
    """2,000 noisy PD-controller transitions of InvertedPendulum, with reference returns."""
    env = make("inverted_pendulum", 8, seed=0)
    gains = torch.tensor([0.5, 5.0, 0.5, 0.5])
    card = DatasetCard(task="InvertedPendulum-v5", kind="expert", policy="PD controller",
                       ref_min_score=5.0, ref_max_score=1000.0)
    data = collect(env, lambda o: (o["policy"] * gains).sum(-1, keepdim=True).clamp(-3, 3),
                   2000, card, seed=0, action_noise=0.3, progress=False)
    return save_hdf5(data, tmp_path_factory.mktemp("data") / "pend.hdf5")


def args(dataset: Path, out: Path, *extra: str) -> list[str]:
    return ["algos=[bc,td3bc]", f"datasets=[{dataset}]", "seeds=2", "updates=200",
            "eval_every=100", "episodes=2", "ope_updates=50", "reps=500", f"out={out}", *extra]


@pytest.mark.slow  # 8 short offline runs through two sweeps (~50 s alone)
def test_interrupted_benchmark_resumes_without_redoing_runs(pendulum, tmp_path, monkeypatch):
    out = tmp_path / "bench"
    from robotrl.runners.offline import OfflineRunner

    original = OfflineRunner._iteration
    calls = {"n": 0}

    def interrupt_td3bc_s1(self):  # noqa: ANN001, ANN202 - Ctrl-C in the middle of the last run
        if self.config["algo"]["name"] == "td3bc" and self.config["seed"] == 1:
            calls["n"] += 1
            if calls["n"] == 2:
                raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(OfflineRunner, "_iteration", interrupt_td3bc_s1)
    with pytest.raises(KeyboardInterrupt):
        offline_bench_main(args(pendulum, out))
    monkeypatch.undo()
    runs = {(a, s): run_dir(out, a, str(pendulum), s) for a in ("bc", "td3bc") for s in (0, 1)}
    for key in [("bc", 0), ("td3bc", 0), ("bc", 1)]:
        assert (runs[key] / "ope.json").exists(), key
    cut = runs[("td3bc", 1)]
    assert not (cut / "result.json").exists()
    assert load_checkpoint(cut / "checkpoints" / "last.pt")["global_step"] == 100
    before = {k: (r / "checkpoints" / "last.pt").stat().st_mtime_ns for k, r in runs.items()}
    # the second invocation runs its jobs in 2 processes through the joblib launcher
    offline_bench_main(args(pendulum, out, "launcher=joblib", "jobs=2"))
    for key, run in runs.items():
        after = (run / "checkpoints" / "last.pt").stat().st_mtime_ns
        assert (after == before[key]) == (key != ("td3bc", 1)), key  # only the cut run trained
    result = json.loads((cut / "result.json").read_text())
    assert result["curve"]["steps"] == [100, 200]  # resumed at 100, not restarted
    assert (cut / "ope.json").exists()
    # finished runs are ordinary run directories: eval, export, resume take them
    assert (cut / "config.yaml").exists() and (cut / "checkpoints" / "best.pt").exists()

    saved = json.loads((out / "results.json").read_text())
    s = saved["settings"]
    again = summarize(saved["runs"], s["algos"], s["datasets"], s["seeds"], s["reps"])
    assert json.loads(json.dumps(again)) == saved["summary"]  # recomputable from the JSON alone
    report = (out / "report.md").read_text()
    for algo in ("bc", "td3bc"):
        finals = [r["final"] for r in saved["runs"] if r["algo"] == algo]
        m, lo, hi = mean_interval(finals)
        assert f"{m:.1f} [{lo:.1f}, {hi:.1f}]" in report
    assert saved["summary"]["ope"]["runs"] == 4
    for name in ("aggregates", "profiles", "curves", "ope"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 0

    # report only: nothing trains, the same report but for the sweep's own wall clock
    offline_bench_main(args(pendulum, out, "run=false"))

    def tables(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith("Summed over runs")]

    assert tables((out / "report.md").read_text()) == tables(report)
    assert "This invocation's sweep took" in report


def test_ope_command(pendulum, tmp_path):
    from robotrl.cli.ope import ope_main
    from robotrl.config import TrainConfig, from_dict
    from robotrl.experiment import run_training

    run = tmp_path / "run"
    run_training(from_dict(TrainConfig, {
        "algo": {"name": "bc", "num_steps": 100}, "dataset": str(pendulum),
        "env": {"task": "inverted_pendulum", "options": {}}, "total_steps": 100,
        "eval_episodes": 2, "run_dir": str(run),
        "logger": {"tensorboard": False, "progress": False}}))
    ope_main([f"checkpoint={run / 'checkpoints' / 'last.pt'}", f"dataset={pendulum}",
              "updates=50", "episodes=2", f"out={tmp_path / 'ope.json'}"])
    result = json.loads((tmp_path / "ope.json").read_text())
    assert {"estimate", "estimate_std", "simulated", "starts", "gamma"} <= set(result)
    with pytest.raises(SystemExit, match="needs dataset="):
        ope_main([f"checkpoint={run / 'checkpoints' / 'last.pt'}"])


@pytest.mark.parametrize("bad, message", [
    (["algos=[bc,ppo]"], "unknown offline algorithm 'ppo'; available: .*'td3bc'"),
    (["suite=atari"], "unknown suite 'atari'; available: \\['locomotion'\\]"),
    (["datasets=[a]", "launcher=ray"], "unknown launcher 'ray'; available"),
    (["datasets=[nowhere/x-v0]"], "dataset error: .*nowhere/x-v0"),
    ([], "give datasets="),
    (["datasets=[a]", "seeds=0"], "seeds must be >= 1"),
    (["datasets=[a]", "updates=ten"], "updates='ten' is not a valid int"),
])
def test_bad_input_is_named(bad, message, tmp_path):
    with pytest.raises(SystemExit, match=message):
        offline_bench_main([*bad, f"out={tmp_path}"])
    assert not any(tmp_path.iterdir())  # nothing written
