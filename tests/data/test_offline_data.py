"""Offline datasets: round trips through Minari and HDF5, the D4RL layout, n-step returns,
segments, deterministic collection, and every bad input named with its file and field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from robotrl.data import (
    Dataset,
    DatasetCard,
    DatasetError,
    load_card,
    load_dataset,
    save_hdf5,
    save_minari,
)
from robotrl.envs import make
from robotrl.runners.collect import collect, uniform_policy


def tiny(obs_dim: int = 4, act_dim: int = 1, lengths: tuple[int, ...] = (5, 3, 4),
         task: str = "InvertedPendulum-v5", seed: int = 0) -> Dataset:
    """Three episodes: the first terminates, the others are truncated."""
    rng = np.random.default_rng(seed)
    episodes = []
    for i, n in enumerate(lengths):
        episodes.append({
            "observations": rng.normal(size=(n + 1, obs_dim)).astype(np.float32),
            "actions": rng.uniform(-1, 1, (n, act_dim)).astype(np.float32),
            "rewards": rng.normal(size=n).astype(np.float32),
            "terminations": np.arange(n) == (n - 1 if i == 0 else n),
            "truncations": np.arange(n) == (n - 1 if i > 0 else n),
        })
    card = DatasetCard(task=task, kind="expert", policy="test", ref_min_score=0.0,
                       ref_max_score=1000.0, seed=seed)
    return Dataset.from_episodes(episodes, card)


@pytest.fixture
def minari_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "datasets"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


def test_minari_round_trip(minari_root: Path) -> None:
    data = tiny()
    path = save_minari(data, "test/inverted_pendulum/expert-v0")
    assert path == minari_root / "test/inverted_pendulum/expert-v0"
    for ref in ("test/inverted_pendulum/expert-v0", str(path), str(path / "data")):
        back = load_dataset(ref)
        assert torch.equal(back.table, data.table)
        assert torch.equal(back.episode_starts, data.episode_starts)
    card = load_card("test/inverted_pendulum/expert-v0")
    assert (card.task, card.kind, card.ref_min_score, card.ref_max_score) == (
        "InvertedPendulum-v5", "expert", 0.0, 1000.0)
    import minari  # the file is Minari's own: its API reads it and its metadata

    ds = minari.load_dataset("test/inverted_pendulum/expert-v0")
    assert ds.total_episodes == 3 and ds.total_steps == len(data)
    assert minari.get_normalized_score(ds, np.array([500.0])) == pytest.approx(0.5)
    with pytest.raises(DatasetError, match="exists"):
        save_minari(data, "test/inverted_pendulum/expert-v0")


def test_a_minari_dataset_is_checked_once_until_its_files_change(
        minari_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a card again reads nothing (``bench list`` composes an offline grid's every cell:
    each check of a 1M-step dataset's episode headers took 5-15 s); a rewritten data file is
    checked again, and refused when it is bad, in the same process."""
    import robotrl.data.io as io

    checks = []
    monkeypatch.setattr(io, "_check_minari", lambda path, check=io._check_minari: (
        checks.append(path), check(path))[1])
    path = save_minari(tiny(), "test/inverted_pendulum/once-v0")
    first = load_card("test/inverted_pendulum/once-v0")
    first.kind = "changed by the caller"  # a copy: the next reader gets the file's card
    assert load_card("test/inverted_pendulum/once-v0").kind == "expert"
    assert len(load_dataset("test/inverted_pendulum/once-v0")) == len(tiny())
    assert len(checks) == 1
    with h5py.File(path / "data" / "main_data.hdf5", "a") as f:
        del f["episode_1/rewards"]
        f["episode_1/rewards"] = np.zeros(7, np.float32)  # 3 steps: 7 rewards, 4 observations
    with pytest.raises(DatasetError, match="episode_1/"):
        load_dataset("test/inverted_pendulum/once-v0")
    assert len(checks) == 2


def test_hdf5_round_trip_and_d4rl_layout(tmp_path: Path) -> None:
    data = tiny()
    path = save_hdf5(data, tmp_path / "d.hdf5")
    back = load_dataset(str(path))
    assert torch.equal(back.table, data.table) and back.card.kind == "expert"
    assert torch.equal(back.episode_starts, data.episode_starts)
    with pytest.raises(DatasetError, match="exists"):
        save_hdf5(data, path)
    # D4RL without next_observations: a row's successor is the next observation; the row that
    # ends an episode by timeout has none and is dropped; a terminal row keeps its own
    obs = np.arange(12, dtype=np.float32).reshape(6, 2)
    with h5py.File(tmp_path / "d4rl.hdf5", "w") as f:
        f["observations"], f["actions"] = obs, np.zeros((6, 1), np.float32)
        f["rewards"] = np.arange(6, dtype=np.float32)
        f["terminals"] = np.array([0, 1, 0, 0, 0, 0], bool)
        f["timeouts"] = np.array([0, 0, 0, 1, 0, 0], bool)
    d = load_dataset(str(tmp_path / "d4rl.hdf5"))
    assert d.rewards.tolist() == [0, 1, 2, 4]  # row 3 (timeout) and row 5 (no successor) dropped
    assert d.next_observations[:, 0].tolist() == [2, 2, 6, 10]
    assert d.terminations.tolist() == [False, True, False, False]
    assert d.episode_starts.tolist() == [0, 2, 3]


def test_n_step_and_segments_by_hand() -> None:
    data = tiny()  # rows 0-4 (terminated at 4), 5-7 (truncated at 7), 8-11
    r = data.rewards.double()
    returns, discount, last = data.n_step(0.5, 2)
    assert returns[3].item() == pytest.approx((r[3] + 0.5 * r[4]).item(), rel=1e-6)
    assert (discount[3].item(), last[3].item()) == (0.0, 4)  # the window hits the termination
    assert (discount[6].item(), last[6].item()) == (0.25, 7)
    assert (discount[7].item(), last[7].item()) == (0.5, 7)  # truncated: bootstrap after 1 step
    assert returns[7].item() == pytest.approx(r[7].item())
    one = data.n_step(0.5, 1)
    assert torch.equal(one[0], data.rewards) and torch.equal(one[2], torch.arange(len(data)))
    segs = data.segments(3)
    assert segs.tolist() == [[0, 1, 2], [1, 2, 3], [2, 3, 4], [5, 6, 7], [8, 9, 10], [9, 10, 11]]


def test_sample_is_one_batch_from_the_generator() -> None:
    data = tiny()
    a = data.sample(7, torch.Generator().manual_seed(3))
    b = data.sample(7, torch.Generator().manual_seed(3))
    assert a["obs"].shape == (7, 4) and a["action"].shape == (7, 1) and a["reward"].shape == (7,)
    assert a["terminated"].dtype == torch.bool
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_collection_is_deterministic_and_marks_the_cut_episode() -> None:
    def run() -> Dataset:
        env = make("inverted_pendulum", 4, seed=0)
        card = DatasetCard(task="InvertedPendulum-v5")
        return collect(env, uniform_policy(env, torch.Generator().manual_seed(0)), 200, card,
                       seed=5, action_noise=0.1, progress=False)

    a, b = run(), run()
    assert len(a) == 200 and torch.equal(a.table, b.table)
    ends = a.episode_ends() - 1
    assert bool((a.terminations[ends] | a.truncations[ends]).all())  # every episode closed
    assert a.card.seed == 5 and a.card.policy_return > 0
    # each row's next observation is the next row's observation inside an episode
    inner = torch.ones(len(a), dtype=torch.bool)
    inner[ends] = False
    rows = inner.nonzero().squeeze(1)
    assert torch.equal(a.next_observations[rows], a.observations[rows + 1])


@pytest.mark.parametrize(("field", "value", "message"), [
    ("rewards", float("nan"), "field 'rewards' has NaN"),
    ("observations", float("inf"), "field 'observations' has NaN/Inf"),
])
def test_non_finite_fields_are_named(tmp_path: Path, field: str, value: float,
                                     message: str) -> None:
    path = save_hdf5(tiny(), tmp_path / "d.hdf5")
    with h5py.File(path, "r+") as f:
        f[field][2] = value
    with pytest.raises(DatasetError, match=message) as err:
        load_dataset(str(path))
    assert str(path) in str(err.value)


def test_missing_field_truncated_file_and_unknown_id(tmp_path: Path, minari_root: Path) -> None:
    path = save_hdf5(tiny(), tmp_path / "d.hdf5")
    with h5py.File(path, "r+") as f:
        del f["timeouts"]
    with pytest.raises(DatasetError, match=r"missing field\(s\) \['timeouts'\]"):
        load_dataset(str(path))
    good = save_hdf5(tiny(lengths=(400, 300)), tmp_path / "big.hdf5")
    cut = tmp_path / "cut.hdf5"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(DatasetError, match="cut.hdf5"):
        load_dataset(str(cut))
    (tmp_path / "junk.hdf5").write_bytes(b"not an hdf5 file")
    with pytest.raises(DatasetError, match="not a readable HDF5 file"):
        load_dataset(str(tmp_path / "junk.hdf5"))
    save_minari(tiny(), "test/ip/expert-v0")
    with pytest.raises(DatasetError, match=r"unknown dataset 'robotrl/ip/nope-v0'.*test/ip/exp"):
        load_dataset("robotrl/ip/nope-v0")  # robotrl's namespace: never downloaded


def test_a_remote_minari_id_is_downloaded_or_named_in_one_error(
        minari_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mujoco/hopper/medium-v0`` and friends come from Minari's remote through
    ``minari.download_dataset`` (here a stand-in that writes the files, or fails as without a
    network); a failure names the id, leaves nothing under the root, and robotrl's own
    namespaces are never sent to the remote."""
    import minari

    asked: list[str] = []

    def offline(dataset_id: str, force_download: bool = False) -> None:
        asked.append(dataset_id)
        raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.setattr(minari, "download_dataset", offline)
    with pytest.raises(DatasetError, match=r"unknown dataset 'mujoco/hopper/medium-v0'.*"
                       r"not downloadable from Minari's remote \(ConnectionError: .*minari "
                       r"download mujoco/hopper/medium-v0"):
        load_dataset("mujoco/hopper/medium-v0")
    assert asked == ["mujoco/hopper/medium-v0"] and not list(minari_root.glob("**/data"))
    for local in ("robotrl/hopper/medium-v0", "gymnasium/hopper/medium-expert-v0", "nope"):
        with pytest.raises(DatasetError, match="unknown dataset"):
            load_dataset(local)
    assert asked == ["mujoco/hopper/medium-v0"]

    def online(dataset_id: str, force_download: bool = False) -> None:  # as minari does it
        save_minari(tiny(), dataset_id, os.environ["MINARI_DATASETS_PATH"])

    monkeypatch.setattr(minari, "download_dataset", online)
    data = load_dataset("mujoco/ip/expert-v0")
    assert len(data) == len(tiny()) and (minari_root / "mujoco/ip/expert-v0/data").is_dir()
    assert not list(minari_root.glob(".robotrl-*"))  # the download's folder is gone


def _robotrl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "robotrl.cli.main", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=300)


@pytest.mark.slow  # five robotrl train processes (~35 s)
def test_train_refuses_bad_datasets_with_exit_2(tmp_path: Path) -> None:
    wide = save_hdf5(tiny(obs_dim=5), tmp_path / "wide.hdf5")  # InvertedPendulum has 4
    run_dir = tmp_path / "run"
    out = _robotrl("train", "algo=td3bc", f"dataset={wide}", f"run_dir={run_dir}")
    assert out.returncode == 2, out.stderr
    assert "field 'observations' has width 5" in out.stderr and "needs 4" in out.stderr
    assert not run_dir.exists()  # nothing written
    ip = save_hdf5(tiny(), tmp_path / "ip.hdf5")
    out = _robotrl("train", "algo=iql", f"dataset={ip}", "env=hopper", f"run_dir={run_dir}")
    assert out.returncode == 2 and "recorded on InvertedPendulum-v5" in out.stderr
    out = _robotrl("train", "algo=ppo", f"dataset={ip}", f"run_dir={run_dir}")
    assert out.returncode == 2 and "dataset= is for offline algorithms" in out.stderr
    out = _robotrl("train", "algo=cql", f"run_dir={run_dir}")
    assert out.returncode == 2 and "learns from a dataset" in out.stderr
    out = _robotrl("train", "algo=bc", f"dataset={tmp_path / 'none.hdf5'}", f"run_dir={run_dir}")
    assert out.returncode == 2 and "no such HDF5 file" in out.stderr
    assert not run_dir.exists()


def test_a_dataset_minari_records_from_gymnasium_trains_here(minari_root: Path) -> None:
    """Data written by minari itself from Gymnasium's own Hopper-v5 (as the Minari hub's MuJoCo
    datasets are) maps to our hopper task and fits its spec."""
    import gymnasium as gym
    import minari
    from minari.data_collector import EpisodeBuffer

    from robotrl.experiment import task_from_dataset

    env = gym.make("Hopper-v5")
    env.action_space.seed(0)
    buffers = []
    for ep in range(2):
        obs, _ = env.reset(seed=ep)
        observations, actions, rewards, terms, truncs = [obs], [], [], [], []
        for t in range(20):
            action = env.action_space.sample()
            obs, reward, term, trunc, _ = env.step(action)
            observations.append(obs)
            actions.append(action)
            rewards.append(reward)
            terms.append(term)
            truncs.append(trunc or t == 19)
            if term:
                break
        buffers.append(EpisodeBuffer(id=ep, observations=np.stack(observations),
                                     actions=np.stack(actions), rewards=rewards,
                                     terminations=terms, truncations=truncs))
    minari.create_dataset_from_buffers("gym/hopper/random-v0", buffers, env="Hopper-v5",
                                       eval_env="Hopper-v5", algorithm_name="random",
                                       author="robotrl tests", author_email="tests@example.org",
                                       code_permalink="tests/data/test_offline_data.py",
                                       description="two uniform-random episodes")
    data = load_dataset("gym/hopper/random-v0")
    assert data.card.task == "Hopper-v5" and data.num_episodes == 2
    robot = make("hopper", 1)
    data.check_spec(robot.spec.obs_dim, robot.spec.action_dim)
    from robotrl.config import TrainConfig

    cfg = TrainConfig(dataset="gym/hopper/random-v0")
    task_from_dataset(cfg, [])
    assert cfg.env.task == "hopper"


@pytest.mark.slow  # four robotrl processes (~25 s)
def test_dataset_collect_and_info_commands(tmp_path: Path) -> None:
    out = tmp_path / "ip_random.hdf5"
    run = _robotrl("dataset", "collect", "task=inverted_pendulum", "kind=random", "steps=300",
                   "num_envs=4", "eval_episodes=2", f"out={out}", "progress=false")
    assert run.returncode == 0, run.stderr
    data = load_dataset(str(out))
    assert len(data) == 300 and data.card.kind == "random" and data.card.ref_min_score > 0
    assert data.card.ref_max_score is None  # no expert= given: no normalized score
    info = _robotrl("dataset", "info", str(out))
    assert info.returncode == 0 and "300 transitions" in info.stdout
    again = _robotrl("dataset", "collect", "task=inverted_pendulum", "steps=10", f"out={out}")
    assert again.returncode == 2 and "exists" in again.stderr  # never overwritten
    bad = _robotrl("dataset", "collect", "kind=expert", "task=hopper")
    assert bad.returncode == 2 and "checkpoint=PATH" in bad.stderr
    bad = _robotrl("dataset", "collect", "kind=replay")
    assert bad.returncode == 2 and "unknown kind 'replay'" in bad.stderr


def test_medium_replay_records_what_the_training_run_saw(tmp_path: Path, make_config) -> None:  # noqa: ANN001
    from robotrl.cli.dataset import _training_replay
    from robotrl.experiment import run_training

    run_training(make_config(tmp_path / "run", "ppo"))  # 6 iterations x 4 worlds x 8 steps
    ckpt = tmp_path / "run" / "checkpoints" / "last.pt"
    data = _training_replay(str(ckpt), DatasetCard(task="InvertedPendulum-v5"), progress=False)
    assert len(data) == 6 * 4 * 8  # the checkpoint's global_step
    assert bool((data.actions.abs() <= 3).all())  # as applied: clipped to the bounds
    ends = data.episode_ends() - 1
    assert bool((data.terminations[ends] | data.truncations[ends]).all())
    assert data.num_episodes > 4  # early PPO on InvertedPendulum falls many times
    assert "training replay" in data.card.policy


def test_collect_on_gymnasiums_own_env(tmp_path: Path, make_config, capsys,  # noqa: ANN001
                                      monkeypatch) -> None:  # noqa: ANN001
    """``backend=gymnasium`` records (references included) through Gymnasium's own env, the
    same checkpoint acting; the card says which simulator; other backends and kinds that
    cannot record there are refused with exit 2."""
    import gymnasium

    from robotrl.cli.dataset import collect_main
    from robotrl.experiment import run_training

    run_training(make_config(tmp_path / "run", "ppo"))
    ckpt = str(tmp_path / "run" / "checkpoints" / "last.pt")
    out = tmp_path / "gym.hdf5"
    made: list[tuple[str, int]] = []
    make_vec = gymnasium.make_vec

    def spy(env_id: str, num_envs: int = 1, **kwargs: object) -> object:
        made.append((env_id, num_envs))
        return make_vec(env_id, num_envs, **kwargs)

    monkeypatch.setattr(gymnasium, "make_vec", spy)
    collect_main(["kind=expert", f"checkpoint={ckpt}", "backend=gymnasium", "steps=64",
                  "num_envs=2", "eval_episodes=3", f"out={out}", "progress=false"])
    # the random and the expert references (3 episodes each), then the recording (2 worlds)
    assert made == [("InvertedPendulum-v5", 3), ("InvertedPendulum-v5", 3),
                    ("InvertedPendulum-v5", 2)]
    data = load_dataset(str(out))
    assert len(data) == 64 and data.card.simulator == "gymnasium"
    assert data.card.task == "InvertedPendulum-v5" and data.card.ref_max_score is not None
    for argv, message in ((["backend=mjx"], "recorded on 'mujoco' or 'gymnasium'"),
                          (["kind=medium-replay", "backend=gymnasium"], "mujoco backend only")):
        with pytest.raises(SystemExit) as stop:
            collect_main([f"checkpoint={ckpt}", f"out={tmp_path / 'x.hdf5'}", *argv])
        assert stop.value.code == 2 and message in capsys.readouterr().err


def test_d4rl_recipe_samples_the_sac_agent_and_normalizes_by_d4rl(
        tmp_path: Path, make_config, capsys) -> None:  # noqa: ANN001
    """``recipe=d4rl``: every action drawn from the SAC agent's stochastic policy (none is its
    mean, no noise added), deterministic for a seed; the card records the recipe, the behaviour
    return's interval and D4RL's published references; random data is the untrained agent;
    medium-expert is ``steps`` of each; a learner without a stochastic policy, noise= and an
    unknown recipe are refused with exit 2."""
    from robotrl.cli.dataset import collect_main
    from robotrl.data.recipes import D4RL_REFERENCE
    from robotrl.experiment import run_training
    from robotrl.experiment.build import load_trained

    hopper = {"task": "hopper", "options": {}}
    run_training(make_config(tmp_path / "sac", "sac", {"learning_starts": 64}, env=hopper))
    ckpt = str(tmp_path / "sac" / "checkpoints" / "last.pt")

    def record(name: str, *argv: str) -> Dataset:
        out = tmp_path / f"{name}.hdf5"
        collect_main([f"checkpoint={ckpt}", "recipe=d4rl", "num_envs=2", "eval_episodes=2",
                      f"out={out}", "progress=false", *argv])
        return load_dataset(str(out))

    data = record("expert", "kind=expert", "steps=40")
    card = data.card
    assert card.recipe == "d4rl" and card.action_noise == 0.0 and "sampled" in card.policy
    assert (card.ref_min_score, card.ref_max_score) == D4RL_REFERENCE["hopper"]
    assert "D4RL" in card.reference
    assert card.policy_return is not None
    if card.policy_return_low is not None:  # two or more episodes ended by themselves
        assert card.policy_return_low <= card.policy_return <= card.policy_return_high
    mean = load_trained(ckpt, 1).alg.act_deterministic(data.observations)
    assert float((data.actions - mean).abs().min()) > 1e-6  # sampled, not the mean
    assert torch.equal(record("again", "kind=expert", "steps=40").actions, data.actions)
    random = record("random", "kind=random", "steps=40")
    assert "untrained" in random.card.policy and not torch.equal(random.actions, data.actions)
    mixed = record("me", "kind=medium-expert", f"expert={ckpt}", "steps=40")
    assert len(mixed) == 80 and mixed.card.policy_return_low is None
    assert mixed.card.policy.count("return") == 2  # each half's behaviour return
    capsys.readouterr()
    run_training(make_config(tmp_path / "ppo", "ppo", env=hopper))
    ppo = str(tmp_path / "ppo" / "checkpoints" / "last.pt")
    for argv, message in ((["kind=expert", f"checkpoint={ppo}"], "algo=ppo, which has no"),
                          (["kind=expert", f"checkpoint={ckpt}", "noise=0.1"], "no noise"),
                          (["kind=expert", f"checkpoint={ckpt}", "recipe=d4rl2"],
                           "unknown recipe 'd4rl2'"),
                          (["kind=random", "task=hopper"], "give expert=PATH")):
        with pytest.raises(SystemExit) as stop:
            collect_main(["recipe=d4rl", f"out={tmp_path / 'x.hdf5'}", *argv])
        assert stop.value.code == 2 and message in capsys.readouterr().err, message
