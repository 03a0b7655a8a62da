"""Every loader of a file from a stranger, fuzzed (Hypothesis): truncations, bit flips, wrong
dtypes and shapes, NaN/Inf, inconsistent episode boundaries, headers that claim 10^12 rows.

Each case must end either in a valid result or in the project's own named error
(``CheckpointError``, ``DatasetError``; a config's ``TypeError``/``ValueError`` naming the key),
never in another exception, a crash or a large allocation. The default run tries a few hundred
cases per loader; ``pytest -m slow`` runs thousands.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robotrl.checkpoint import CheckpointError, dumps, loads, save_checkpoint
from robotrl.config import TrainConfig, from_dict, to_dict
from robotrl.data import Dataset, DatasetCard, DatasetError, load_dataset, save_hdf5, save_minari
from robotrl.data.io import load_hdf5, parse_card

CASES = [pytest.param(150, id="150"), pytest.param(2000, id="2000", marks=pytest.mark.slow)]
"""Cases per loader: the default run, and the slow run."""


def fuzz(cases: int, strategy: st.SearchStrategy, check: Callable[[Any], None]) -> None:
    """Run ``check`` on ``cases`` examples drawn from ``strategy`` (no deadline: the machine is
    shared; the examples are small)."""
    run = settings(max_examples=cases, deadline=None, derandomize=True, database=None,
                   suppress_health_check=list(HealthCheck))(given(strategy)(check))
    run()


def mutate(raw: bytes, ops: list[tuple[str, int, int]]) -> bytes:
    """Apply byte-level damage: ``("truncate", at, _)``, ``("flip", at, bit)``,
    ``("set", at, byte)``, ``("insert", at, byte)`` (positions taken modulo the length)."""
    data = bytearray(raw)
    for op, at, value in ops:
        if not data:
            break
        at %= len(data) + (op == "insert")
        if op == "truncate":
            del data[at:]
        elif op == "flip":
            data[at % len(data)] ^= 1 << (value % 8)
        elif op == "set":
            data[at % len(data)] = value % 256
        else:
            data.insert(at, value % 256)
    return bytes(data)


DAMAGE = st.lists(st.tuples(st.sampled_from(["truncate", "flip", "set", "insert"]),
                            st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=4)
JSON = st.recursive(st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats()
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


def tiny(obs_dim: int = 3, act_dim: int = 2, lengths: tuple[int, ...] = (4, 3)) -> Dataset:
    rng = np.random.default_rng(0)
    episodes = [{"observations": rng.normal(size=(n + 1, obs_dim)).astype(np.float32),
                 "actions": rng.uniform(-1, 1, (n, act_dim)).astype(np.float32),
                 "rewards": rng.normal(size=n).astype(np.float32),
                 "terminations": np.arange(n) == n - 1, "truncations": np.zeros(n, bool)}
                for n in lengths]
    return Dataset.from_episodes(episodes, DatasetCard(task="Hopper-v5", kind="medium"))


# ---------------------------------------------------------------------------- checkpoints
def checkpoint_bytes() -> bytes:
    """A checkpoint shaped like a runner's: module and optimizer state, RNG states, config."""
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(net.parameters())
    net(torch.ones(1, 3)).sum().backward()
    opt.step()
    from robotrl.seeding import rng_state

    return dumps({"algo": {"net": net.state_dict(), "opt": opt.state_dict()}, "rng": rng_state(),
                  "config": to_dict(from_dict(TrainConfig, {"algo": {"name": "ppo"}})), "iteration": 3, "best_eval": None,
                  "evaluations": [{"step": 1, "return_mean": float("nan")}]})


def load_or_refuse(raw: bytes) -> None:
    try:
        out = loads(raw)
    except CheckpointError:
        return
    assert isinstance(out, dict)


@pytest.mark.parametrize("cases", CASES)
def test_checkpoint_bytes_damaged(cases: int) -> None:
    base = checkpoint_bytes()
    fuzz(cases, DAMAGE, lambda ops: load_or_refuse(mutate(base, ops)))


def safetensors_file(header: Any, body: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


@pytest.mark.parametrize("cases", CASES)
def test_checkpoint_payload_json_fuzzed(cases: int) -> None:
    """Any JSON in the metadata (tags included) is decoded or refused by name."""
    tags = st.sampled_from(["$tensor", "$ndarray", "$tuple", "$dict", "$npscalar", "$float"])
    tagged = st.builds(lambda t, v, extra: {t: v, **extra}, tags, JSON,
                       st.dictionaries(st.sampled_from(["dtype", "shape", "value"]), JSON))
    payload = st.recursive(JSON | tagged, lambda inner: st.dictionaries(st.text(max_size=4), inner,
                                                                        max_size=3), max_leaves=8)

    def check(value: Any) -> None:
        meta = {"robotrl_checkpoint": "2", "payload": json.dumps(value)}
        header = {"__metadata__": meta, "0": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}
        load_or_refuse(safetensors_file(header, b"\x01\x02\x03\x04"))

    fuzz(cases, payload, check)


def test_checkpoint_header_claiming_10_12_rows_fails_fast() -> None:
    for shape in ([10**12, 10], [2**62, 2**62], [-1]):
        header = {"__metadata__": {"robotrl_checkpoint": "2", "payload": "{}"},
                  "0": {"dtype": "F32", "shape": shape, "data_offsets": [0, 40]}}
        with pytest.raises(CheckpointError, match="corrupt or truncated"):
            loads(safetensors_file(header, bytes(40)))
    huge = struct.pack("<Q", 10**12) + b"{}"  # a header length past the end of the file
    with pytest.raises(CheckpointError):
        loads(huge)
    deep = {"robotrl_checkpoint": "2", "payload": "[" * 100_000 + "]" * 100_000}
    with pytest.raises(CheckpointError):
        loads(safetensors_file({"__metadata__": deep}))
    array = {"$ndarray": "0", "dtype": "<f8", "shape": [10**12]}
    meta = {"robotrl_checkpoint": "2", "payload": json.dumps({"format_version": 2, "a": array})}
    header = {"__metadata__": meta, "0": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}
    with pytest.raises(CheckpointError, match="do not make"):
        loads(safetensors_file(header, bytes(8)))
    meta["payload"] = json.dumps({"format_version": 2, "a": {**array, "dtype": "|O"}})
    with pytest.raises(CheckpointError, match="not allowed"):
        loads(safetensors_file(header, bytes(8)))


def same(a: Any, b: Any) -> bool:
    """Equal values of equal types, tensors and arrays element for element (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b or (a != a and b != b)


def test_checkpoint_file_round_trip_is_exact(tmp_path: Path) -> None:
    payload = loads(checkpoint_bytes())
    path = save_checkpoint(tmp_path / "c.pt", {k: v for k, v in payload.items()
                                               if k != "format_version"})
    assert same(loads(path.read_bytes()), payload)
    assert type(payload["rng"]["numpy"][1]) is np.ndarray and payload["rng"]["numpy"][0] == "MT19937"
    assert isinstance(payload["algo"]["opt"]["state"], dict) and 0 in payload["algo"]["opt"]["state"]


# ---------------------------------------------------------------------------- HDF5
@pytest.fixture(scope="module")
def hdf5_base(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = save_hdf5(tiny(), tmp_path_factory.mktemp("h5") / "base.hdf5")
    return path.read_bytes()


def load_h5_or_refuse(path: Path) -> None:
    try:
        data = load_hdf5(path)
    except DatasetError:
        return
    assert len(data) > 0 and bool(torch.isfinite(data.table).all())


@pytest.mark.parametrize("cases", CASES)
def test_hdf5_bytes_damaged(cases: int, hdf5_base: bytes, tmp_path: Path) -> None:
    path = tmp_path / "d.hdf5"

    def check(ops: list[tuple[str, int, int]]) -> None:
        path.write_bytes(mutate(hdf5_base, ops))
        load_h5_or_refuse(path)

    fuzz(cases, DAMAGE, check)


FIELD = st.sampled_from(["observations", "actions", "rewards", "terminals", "timeouts",
                         "next_observations"])
BAD_DTYPES = st.sampled_from(["f4", "f8", "i4", "u1", "?", "f2", "S4", "O", "vlen", "compound",
                              "opaque"])


def write_field(f: h5py.File, name: str, dtype: str, shape: tuple[int, ...], fill: float) -> None:
    if dtype == "O":  # variable-length strings: h5py's object arrays
        f.create_dataset(name, (max(shape[:1] or (1,)),), dtype=h5py.string_dtype())
    elif dtype == "vlen":
        f.create_dataset(name, (max(shape[:1] or (1,)),), dtype=h5py.vlen_dtype(np.float32))
    elif dtype == "compound":
        f[name] = np.zeros(shape[:1] or (1,), dtype=[("a", "f4"), ("b", "i4")])
    elif dtype == "opaque":  # pickled bytes: h5py hands back raw bytes, never unpickles
        f[name] = np.void(b"\x80\x04cos\nsystem\n")
    else:
        with np.errstate(invalid="ignore"):  # a NaN or inf fill cast to integers, on purpose
            f[name] = np.full(shape, fill).astype(dtype)


@pytest.mark.parametrize("cases", CASES)
def test_hdf5_fields_fuzzed(cases: int, tmp_path: Path) -> None:
    """Fields replaced by arrays of any dtype and shape, NaN/Inf or odd episode flags."""
    path = tmp_path / "d.hdf5"
    shape = st.lists(st.integers(0, 7), min_size=0, max_size=3).map(tuple)
    change = st.tuples(FIELD, BAD_DTYPES, shape, st.sampled_from([0.0, 1.0, np.nan, np.inf]))

    def check(changes: list[tuple[str, str, tuple[int, ...], float]]) -> None:
        path.unlink(missing_ok=True)
        save_hdf5(tiny(), path)
        with h5py.File(path, "a") as f:
            for name, dtype, shp, fill in changes:
                if name in f:
                    del f[name]
                write_field(f, name, dtype, shp, fill)
        load_h5_or_refuse(path)

    fuzz(cases, st.lists(change, min_size=1, max_size=3), check)


def test_hdf5_header_claiming_10_12_rows_fails_fast(tmp_path: Path) -> None:
    path = tmp_path / "huge.hdf5"
    with h5py.File(path, "w") as f:  # a few kilobytes on disk, 10^12 rows claimed
        for name, width in (("observations", 3), ("actions", 2), ("rewards", 0),
                            ("terminals", 0), ("timeouts", 0)):
            shape = (10**12, width) if width else (10**12,)
            f.create_dataset(name, shape, dtype="f4", chunks=True)
    assert path.stat().st_size < 1 << 20
    with pytest.raises(DatasetError, match="more than this machine's memory"):
        load_hdf5(path)
    with h5py.File(path, "w") as f:  # small enough to allocate, but never written
        for name, width in (("observations", 3), ("actions", 2), ("rewards", 0),
                            ("terminals", 0), ("timeouts", 0)):
            f.create_dataset(name, (10**6, width) if width else (10**6,), dtype="f4")
    with pytest.raises(DatasetError, match="truncated or corrupt"):
        load_hdf5(path)


# ---------------------------------------------------------------------------- Minari
@pytest.fixture(scope="module")
def minari_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_minari(tiny(), "fuzz/hopper/base-v0", tmp_path_factory.mktemp("minari"))


def load_minari_or_refuse(folder: Path) -> None:
    try:
        data = load_dataset(str(folder))
    except DatasetError:
        return
    assert len(data) > 0


METADATA_KEYS = st.sampled_from(["observation_space", "action_space", "total_steps",
                                 "total_episodes", "data_format", "env_spec", "robotrl_card",
                                 "ref_min_score", "dataset_id"])
SPACES = st.one_of(
    JSON.map(json.dumps),
    st.builds(lambda shape, dtype: json.dumps({"type": "Box", "shape": shape, "dtype": dtype,
                                               "low": -1.0, "high": 1.0}),
              st.lists(st.integers(-1, 10**7), max_size=3),
              st.sampled_from(["float32", "object", "<U4", 3])),
)


@pytest.mark.parametrize("cases", CASES)
def test_minari_metadata_and_episodes_fuzzed(cases: int, minari_base: Path,
                                             tmp_path: Path) -> None:
    folder = tmp_path / "ds"
    meta_change = st.tuples(st.just("meta"), METADATA_KEYS, st.one_of(JSON, SPACES, st.just(None)))
    episode_change = st.tuples(
        st.sampled_from(["episode_0", "episode_1", "episode_2"]),
        st.sampled_from(["observations", "actions", "rewards", "terminations", "truncations"]),
        st.tuples(BAD_DTYPES, st.lists(st.integers(0, 6), max_size=3).map(tuple),
                  st.sampled_from([0.0, np.nan, np.inf])))

    def check(changes: list[tuple[str, str, Any]]) -> None:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(minari_base, folder)
        meta_file = folder / "data" / "metadata.json"
        meta = json.loads(meta_file.read_text())
        for where, key, value in changes:
            if where == "meta":
                if value is None:
                    meta.pop(key, None)
                else:
                    meta[key] = value
                continue
            with h5py.File(folder / "data" / "main_data.hdf5", "a") as f:
                group = f.require_group(where)
                if key in group:
                    del group[key]
                write_field(group, key, *value)
        meta_file.write_text(json.dumps(meta))
        load_minari_or_refuse(folder)

    fuzz(cases, st.lists(st.one_of(meta_change, episode_change), min_size=1, max_size=3), check)


def test_minari_never_builds_the_environment_a_file_names(minari_base: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Without declared spaces minari would ``gym.make`` the metadata's env_spec, importing the
    module its entry point names: a sentinel module shows that nothing is imported."""
    sentinel = tmp_path / "pwned"
    (tmp_path / "evil_env_module.py").write_text(
        f"import pathlib\npathlib.Path({str(sentinel)!r}).touch()\nclass Env: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    folder = tmp_path / "ds"
    shutil.copytree(minari_base, folder)
    meta_file = folder / "data" / "metadata.json"
    meta = json.loads(meta_file.read_text())
    del meta["observation_space"], meta["action_space"]
    meta["env_spec"] = json.dumps({
        "id": "Evil-v0", "entry_point": "evil_env_module:Env", "reward_threshold": None,
        "nondeterministic": False, "max_episode_steps": None, "order_enforce": True,
        "disable_env_checker": True, "kwargs": {}, "additional_wrappers": [],
        "vector_entry_point": None})
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match="gym.make"):
        load_dataset(str(folder))
    assert not sentinel.exists() and "evil_env_module" not in sys.modules


# ---------------------------------------------------------------------------- cards, configs
@pytest.mark.parametrize("cases", CASES)
def test_dataset_card_fuzzed(cases: int) -> None:
    fields = st.sampled_from(["task", "dataset_id", "kind", "policy", "policy_return",
                              "action_noise", "seed", "ref_min_score", "ref_max_score", "source",
                              "observations", "task_options", "policy_return_low",
                              "policy_return_high", "recipe", "reference", "other"])
    cards = st.dictionaries(fields, JSON, max_size=6) | JSON

    def check(value: Any) -> None:
        for raw in (json.dumps(value), json.dumps(value)[:-1]):  # whole, and cut short
            try:
                card = parse_card(raw, "card")
            except DatasetError:
                continue
            assert isinstance(card, DatasetCard)
            card.normalized_score(1.0)  # every numeric field is a number (or None)

    with pytest.raises(DatasetError, match="ref_min_score and ref_max_score are both 0"):
        parse_card(json.dumps({"ref_min_score": 0, "ref_max_score": 0}), "card")  # slow run's find
    fuzz(cases, cards, check)


@pytest.mark.parametrize("cases", CASES)
def test_train_config_fuzzed(cases: int) -> None:
    """A config read back from a checkpoint or a run directory: valid or a named error."""
    base = to_dict(from_dict(TrainConfig, {"algo": {"name": "ppo"}}))
    keys = st.sampled_from(sorted(base) + ["unknown"])
    sub = st.sampled_from(["name", "lr", "rollout_steps", "task", "options", "hidden", "x"])
    edit = st.tuples(keys, st.one_of(JSON, st.dictionaries(sub, JSON, max_size=3)))

    def check(edits: list[tuple[str, Any]]) -> None:
        data = json.loads(json.dumps(base))
        for key, value in edits:
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        try:
            from_dict(TrainConfig, data)
        except (TypeError, ValueError) as err:
            assert str(err)  # names what is wrong

    fuzz(cases, st.lists(edit, min_size=1, max_size=3), check)


def test_yaml_configs_never_construct_python_objects(tmp_path: Path) -> None:
    """Configs and presets are read with safe YAML loaders: a python tag is an error."""
    import yaml
    from omegaconf import OmegaConf

    sentinel = tmp_path / "pwned"
    evil = tmp_path / "config.yaml"
    evil.write_text(f"seed: !!python/object/apply:os.system ['touch {sentinel}']\n")
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load(evil.read_text())
    with pytest.raises(Exception, match="python/object"):
        OmegaConf.load(evil)
    assert not sentinel.exists()
