"""The backend table behind ``make``: lookup, option checks, task overrides, new entries."""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import pytest
import torch

import robotrl.envs as E
from robotrl.envs import registry
from robotrl.envs.registry import BACKEND_TABLE, BackendEntry, matches, type_name


def test_backends_come_from_the_table() -> None:
    assert E.BACKENDS == tuple(BACKEND_TABLE) == ("mujoco", "gymnasium", "mjx", "brax")
    for entry in BACKEND_TABLE.values():
        assert entry.description and "\n" not in entry.description
        assert all(isinstance(k, str) for k in entry.options)


def test_unknown_backend_lists_available() -> None:
    with pytest.raises(ValueError, match="unknown backend 'physx'; available backends: "
                                         "mujoco, gymnasium, mjx, brax"):
        E.make("hopper", 1, backend="physx")


def test_unknown_option_names_backend_and_lists_options() -> None:
    with pytest.raises(ValueError) as err:
        E.make("hopper", 1, num_threads=1, ctrl_cost=0.1)
    msg = str(err.value)
    assert "unknown option(s) ['ctrl_cost'] for task 'hopper' on backend 'mujoco'" in msg
    assert "num_threads: int" in msg and "observations: Sequence[str]" in msg
    assert "randomization: RandomizationConfig | str | Mapping | None" in msg
    assert "ctrl_cost_weight" in msg and "reset_noise_scale" in msg  # the task's config fields
    # mjx checks before importing JAX, and points at the backend that takes the option
    with pytest.raises(ValueError, match=r"\['num_threads'\] for task 'hopper' on backend 'mjx' "
                                         r"\('num_threads' is an option of backend\(s\) mujoco\)"
                                         r".*iterations: int \| None"):
        E.make("hopper", 1, backend="mjx", num_threads=1)
    with pytest.raises(ValueError, match="unknown task 'hoper'"):  # the task first
        E.make("hoper", 1, ctrl_cost=0.1)


@pytest.mark.parametrize(
    ("backend", "option", "value", "expected"),
    [("mujoco", "num_threads", "2", "int"),
     ("mujoco", "num_threads", True, "int"),
     ("mujoco", "observations", "policy", r"Sequence\[str\]"),
     ("mujoco", "randomization", 3, r"RandomizationConfig \| str \| Mapping \| None"),
     ("gymnasium", "vectorization", 1, "str"),
     ("mjx", "iterations", 1.5, r"int \| None"),
     ("brax", "fresh_reset", "yes", "bool")],
)
def test_wrong_option_type_is_rejected(backend: str, option: str, value: Any,
                                       expected: str) -> None:
    with pytest.raises(TypeError, match=f"option '{option}' of backend '{backend}' must be "
                                        f"{expected}, got"):
        E.make("hopper", 1, backend=backend, **{option: value})


def test_task_overrides_still_work() -> None:
    env = E.make("hopper", 2, ctrl_cost_weight=0.01, num_threads=1)
    assert env.task.cfg.ctrl_cost_weight == 0.01 and env.num_envs == 2
    env = E.make("hopper", 2, num_threads=1, observations=["policy", "privileged"],
                 randomization=types.MappingProxyType({}))  # any sequence, any mapping
    assert set(env.reset(seed=0)) == {"policy", "privileged"}


def test_num_threads_on_mujoco_but_not_gymnasium() -> None:
    env = E.make("hopper", 2, num_threads=1)
    assert env.batch.nthread == 1
    assert env.reset(seed=0)["policy"].shape == (2, env.spec.obs_dim)
    with pytest.raises(ValueError) as err:
        E.make("hopper", 1, backend="gymnasium", num_threads=1)
    msg = str(err.value)
    assert "unknown option(s) ['num_threads'] for task 'hopper' on backend 'gymnasium'" in msg
    assert "'num_threads' is an option of backend(s) mujoco" in msg
    assert "vectorization: str" in msg and "Gymnasium env options: [" in msg


def test_gymnasium_entry_keeps_its_behaviour() -> None:
    env = E.make("halfcheetah", 1, backend="gymnasium", ctrl_cost_weight=0.0,
                 randomization="none")
    assert env.spec.obs_dim == 17
    env.close()
    env = E.make("Pendulum-v1", 2, backend="gymnasium", g=9.81, vectorization="sync")
    assert env.reset(seed=0)["policy"].shape == (2, 3)  # any Gymnasium id, its own options
    env.close()
    with pytest.raises(ValueError, match="randomization needs the 'mujoco', 'mjx' or 'brax' "
                                         "backend .* takes randomization=none"):
        E.make("hopper", 1, backend="gymnasium", randomization="locomotion")


def test_matches_and_type_name() -> None:
    assert matches(3, int) and not matches(3.0, int) and not matches(False, int)
    assert matches(("a", "b"), Sequence[str]) and not matches(("a", 1), Sequence[str])
    assert not matches("ab", Sequence[str]) and matches(None, int | None)
    assert matches(["a"], tuple[str, ...]) is False and matches(("a",), tuple[str, ...])
    assert type_name(tuple[str, ...]) == "tuple[str, ...]" and type_name(int | None) == \
        "int | None"


def test_new_entry_is_reached(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    def fake(task: str, num_envs: int, device: str | torch.device, seed: int,
             task_options: dict[str, Any], **backend_options: Any) -> Any:
        calls.append((task, num_envs, device, seed, task_options, backend_options))
        return "fake env"

    entry = BackendEntry(constructor=fake, options={"speed": float},
                         description="a fake simulator", task_fields=lambda task: ("size",),
                         task_fields_name="fake task fields")
    monkeypatch.setitem(BACKEND_TABLE, "fake", entry)
    out = E.make("box", 3, backend="fake", device="cpu", seed=7, speed=2, size=1)
    assert out == "fake env"
    assert calls == [("box", 3, "cpu", 7, {"size": 1}, {"speed": 2})]
    with pytest.raises(ValueError, match=r"\['colour'\] for task 'box' on backend 'fake'; "
                                         r"backend 'fake' options: speed: float; "
                                         r"fake task fields: \['size'\]"):
        E.make("box", 1, backend="fake", colour="red")
    with pytest.raises(TypeError, match="option 'speed' of backend 'fake' must be float"):
        E.make("box", 1, backend="fake", speed="fast")
    with pytest.raises(ValueError, match="available backends: mujoco, gymnasium, mjx, brax, fake"):
        E.make("box", 1, backend="nope")
    monkeypatch.undo()
    assert "fake" not in registry.BACKEND_TABLE


def test_brax_checks_its_env_options() -> None:
    pytest.importorskip("brax", reason="the brax backend needs brax (pip install robotrl[brax])")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['bogus'\] for task "
                                         r"'inverted_pendulum' on backend 'brax'.*fresh_reset: "
                                         r"bool.*Brax env options: \['debug', 'n_frames'\]"):
        E.make("inverted_pendulum", 1, backend="brax", bogus=1)
