"""``robotrl train ... num_seeds=S`` (issue 46): S seeds of TD3+BC, IQL, SAC, CrossQ, FastTD3
or PPO in one process, each an ordinary run directory equal to the run of that seed alone, a
diverging seed stopped without stopping the others, and configs that cannot be batched
refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from robotrl.config import TrainConfig, from_dict
from robotrl.experiment import Experiment, RunDir


def config(pendulum: Path, run_dir: Path, algo: str = "td3bc", **over: object) -> TrainConfig:
    return from_dict(TrainConfig, {
        "algo": {"name": algo, "updates_per_iteration": 50, "batch_size": 64,
                 "hidden": [32, 32]},
        "dataset": str(pendulum), "env": {"task": "inverted_pendulum", "options": {}},
        "total_steps": 150, "eval_episodes": 2, "eval_interval": 2, "run_dir": str(run_dir),
        "logger": {"tensorboard": False, "progress": False}, **over})


def networks(run: Path) -> dict[str, torch.Tensor]:
    """Every parameter of the run's last checkpoint (actor, critics, targets, normalizer)."""
    modules = RunDir(run).checkpoint()["algo"]["modules"]
    return {f"{m}.{k}": v for m, state in modules.items() for k, v in state.items()}


@pytest.mark.parametrize("algo", ["td3bc", "iql"])
def test_each_seed_of_a_batch_is_the_run_of_that_seed_alone(pendulum, tmp_path, algo):
    batched = Experiment(config(pendulum, tmp_path / "batch", algo, seed=4, num_seeds=2)).run()
    assert batched is not None and batched["seeds"] == 2
    for seed in (4, 5):
        alone = tmp_path / f"alone{seed}"
        Experiment(config(pendulum, alone, algo, seed=seed)).run()
        run = RunDir(tmp_path / "batch" / f"s{seed}")
        assert run.finished and run.config.seed == seed and run.config.num_seeds == 1
        # float32: the stacked products may round differently from the solo ones (the float64
        # test in tests/algos/test_seed_batch.py holds them to 1e-10)
        mine, theirs = networks(run.path), networks(alone)
        assert mine.keys() == theirs.keys()
        for k in mine:
            torch.testing.assert_close(mine[k], theirs[k], rtol=1e-4, atol=1e-5, msg=k)
        steps = [e["step"] for e in run.evaluations()]
        assert steps == [e["step"] for e in RunDir(alone).evaluations()] == [100, 150]
        assert run.result["final"]["return_mean"] == pytest.approx(
            RunDir(alone).result["final"]["return_mean"], rel=1e-3)


@pytest.mark.parametrize("algo", ["sac", "crossq", "fasttd3", "ppo"])
def test_online_seeds_collect_in_their_own_worlds_as_alone(tmp_path, make_config, algo):
    """SAC, CrossQ, FastTD3 or PPO, 2 seeds batched: each seed steps its own 4 worlds and
    stores into its own replay (rollout), the updates are batched; each seed's run directory (counters, evaluations,
    checkpoint) is the run of that seed alone, its parameters too up to float32 rounding
    (SAC, FastTD3). CrossQ's float32 runs drift apart from rounding alone (Adam with beta1 0.5
    on batch-normalized networks turns rounding of near-zero gradients into full steps:
    measured 0.16 largest parameter difference after 150 updates, where float64 agrees within
    2e-15), so its parameters are compared in float64 in tests/algos/test_seed_batch_sac.py."""
    over = {"total_steps": 640, "eval_interval": 10 if algo != "ppo" else 5,
            "algo": {"learning_starts": 256} if algo != "ppo" else {"rollout_steps": 16}}
    batched = Experiment(make_config(tmp_path / "batch", algo, seed=4, num_seeds=2,
                                     **over)).run()
    assert batched is not None and batched["seeds"] == 2
    for seed in (4, 5):
        alone = tmp_path / f"alone{seed}"
        Experiment(make_config(alone, algo, seed=seed, **over)).run()
        run = RunDir(tmp_path / "batch" / f"s{seed}")
        assert run.finished and run.config.num_seeds == 1
        mine = RunDir(run.path).checkpoint()["algo"]
        theirs = RunDir(alone).checkpoint()["algo"]
        assert mine.keys() == theirs.keys()
        if algo == "ppo":
            assert mine["lr"] == pytest.approx(theirs["lr"])
        else:
            assert mine["counters"] == theirs["counters"] and mine["counters"][1] > 150
        nets = {"crossq": (), "ppo": ("policy",)}.get(algo, ("actor", "critic", "critic_target"))
        # PPO's 40 Adam minibatch steps carry float32 rounding further: 4.6e-4 largest
        # difference measured on a 2-core Intel Xeon (parameters up to 0.8), under 1e-4 on an AMD
        # EPYC; a seed stepping another's worlds or rollout moves them by orders more
        atol = 2e-3 if algo == "ppo" else 1e-4
        for net in nets:
            for k in mine[net]:
                torch.testing.assert_close(mine[net][k], theirs[net][k], rtol=1e-3, atol=atol,
                                           msg=f"{net}.{k}")
        assert [e["step"] for e in run.evaluations()] == [
            e["step"] for e in RunDir(alone).evaluations()] == [320, 640]


def test_a_diverging_seed_stops_alone(pendulum, tmp_path, monkeypatch):
    import robotrl.experiment.run as run_module

    build = run_module.build_runner

    def poisoned(cfg):  # noqa: ANN001, ANN202 - seed 1's critic starts from NaN
        runner = build(cfg)
        if cfg.seed == 1:
            with torch.no_grad():
                next(runner.alg.critic.parameters()).fill_(float("nan"))
        return runner

    monkeypatch.setattr(run_module, "build_runner", poisoned)
    result = Experiment(config(pendulum, tmp_path, num_seeds=3)).run()
    assert result is not None and result["seeds"] == 2
    for seed in (0, 2):
        assert RunDir(tmp_path / f"s{seed}").finished
    stopped = tmp_path / "s1"
    assert not RunDir(stopped).finished
    assert "seed 1 stopped: loss/critic = nan at update 1" in (stopped / "failed.json").read_text()
    assert RunDir(stopped).checkpoint()["global_step"] == 0  # its last good state, resumable


@pytest.mark.parametrize("over, message", [
    ({"num_seeds": 0}, "num_seeds must be >= 1, got 0"),
    ({"resume": "x.pt"}, "num_seeds > 1 does not take resume="),
    ({"algo": "bc", "policy": {"name": "vla"}}, "num_seeds > 1 batches MLP policies; policy=vla"),
])
def test_what_cannot_be_batched_is_refused(pendulum, tmp_path, over, message):
    cfg = config(pendulum, tmp_path, **{"num_seeds": 2, **over})
    with pytest.raises(ValueError, match=message):
        Experiment(cfg)
    assert not any(tmp_path.iterdir())


def test_what_ppo_cannot_batch_is_refused_before_anything_is_written(tmp_path, make_config):
    cfg = make_config(tmp_path, "ppo", num_seeds=2, algo={"shared_backbone": True})
    with pytest.raises(ValueError, match=r"num_seeds > 1 with PPO .* \['shared_backbone'\]"):
        Experiment(cfg)
    assert not any(tmp_path.iterdir())


def test_a_learner_without_a_seed_batch_is_refused(tmp_path, make_config):
    with pytest.raises(ValueError, match=r"algo=trpo has none \(those that have: \['awac', "
                                         r"'awac_mcep', 'bc', 'cql', 'crossq', 'fasttd3', 'iql', "
                                         r"'ppo', 'rebrac', 'sac', 'td3bc', 'td3bc_mcep'\]\)"):
        Experiment(make_config(tmp_path, "trpo", num_seeds=2))
    assert not any(tmp_path.iterdir())
