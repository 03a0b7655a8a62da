"""sim2real: the export contract, verified export with metadata, refusals, the deploy loop."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("onnx", reason="export tests need onnx: pip install 'robotrl[onnx]'")
ort = pytest.importorskip("onnxruntime", reason="export tests need onnxruntime: "
                          "pip install 'robotrl[onnx]'")

from robotrl.algos.ppo import PPO, PPOConfig  # noqa: E402
from robotrl.checkpoint import save_checkpoint  # noqa: E402
from robotrl.cli.deploy import deploy_main  # noqa: E402
from robotrl.cli.export import export_main  # noqa: E402
from robotrl.config import TrainConfig, from_dict, to_dict  # noqa: E402
from robotrl.experiment.build import build_algo, build_env  # noqa: E402
from robotrl.nn.actor import DeterministicActor  # noqa: E402
from robotrl.nn.normalizer import RunningNormalizer  # noqa: E402
from robotrl.nn.residual import ResidualMLP  # noqa: E402
from robotrl.sim2real import verify  # noqa: E402
from robotrl.sim2real.deploy import (  # noqa: E402
    DeployConfig,
    OnnxPolicy,
    SimSource,
    TorchPolicy,
    load_policy,
    run_loop,
)
from robotrl.sim2real.export import (  # noqa: E402
    FORMATS,
    ExportError,
    VerificationError,
    config_sha256,
    delay_steps_range,
    export_policy,
    read_metadata,
)


def _ppo(obs_dim: int = 11, **cfg: object) -> PPO:
    torch.manual_seed(0)
    alg = PPO(obs_dim, -torch.ones(3), torch.ones(3), 4, PPOConfig(**cfg), seed=0)
    alg.obs_normalizer.update(torch.randn(500, obs_dim) * 3.0 + 2.0)
    with torch.no_grad():  # a trained-looking policy: means well beyond the bounds somewhere
        for p in alg.policy.parameters():
            p.add_(torch.randn(p.shape) * 0.5)
    return alg


@pytest.mark.parametrize("cfg", [{}, {"shared_backbone": True, "state_dependent_std": True}])
def test_export_actor_equals_act_deterministic(cfg: dict) -> None:
    alg = _ppo(**cfg)
    actor = alg.export_actor()
    obs = torch.randn(256, 11) * 5.0
    expected = alg.act_deterministic(obs)
    assert torch.equal(actor(obs), expected)
    assert expected.abs().max() == 1.0  # some actions were clipped to the bounds
    assert not any(p.requires_grad for p in actor.parameters())
    with torch.no_grad():  # later training does not reach the frozen copy
        next(alg.policy.parameters()).add_(1.0)
    alg.obs_normalizer.update(torch.randn(10, 11))
    assert torch.equal(actor(obs), expected)


def test_tanh_output_and_bad_transform() -> None:
    net = nn.Linear(4, 2)
    actor = DeterministicActor(net, 4, torch.tensor([-1.0, 0.0]), torch.tensor([3.0, 1.0]), "tanh")
    obs = torch.randn(8, 4)
    y = torch.tanh(net(obs))
    expected = torch.stack([1.0 + 2.0 * y[:, 0], 0.5 + 0.5 * y[:, 1]], dim=1)
    torch.testing.assert_close(actor(obs), expected)
    with pytest.raises(ValueError, match="known: clip, tanh"):
        DeterministicActor(net, 4, -torch.ones(2), torch.ones(2), "squash")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, PPO]:
    """A PPO checkpoint on Hopper, as the runner writes it (config + algo state)."""
    cfg = from_dict(TrainConfig, {
        "algo": {"name": "ppo", "actor_hidden": [32, 32], "critic_hidden": [32, 32]},
        "env": {"task": "hopper", "options": {"ctrl_cost_weight": 0.002}}, "num_envs": 4,
    })
    env = build_env(cfg, 4, 0, train=False)
    alg = build_algo(cfg, env.spec)
    obs = env.reset(seed=0)["policy"]
    for _ in range(50):  # fill the normalizer with real Hopper statistics
        alg.obs_normalizer.update(obs)
        obs = env.step(torch.rand(4, 3) * 2 - 1).obs["policy"]
    path = tmp_path_factory.mktemp("ckpt") / "last.pt"
    save_checkpoint(path, {"config": to_dict(cfg), "algo": alg.state_dict()})
    return path, to_dict(cfg), alg


def test_export_onnx_metadata_and_parity(checkpoint, tmp_path: Path) -> None:  # noqa: ANN001
    path, config, alg = checkpoint
    out = tmp_path / "policy.onnx"
    export_main([f"checkpoint={path}", "format=onnx", f"out={out}"])  # 10k rollout observations
    meta = read_metadata(out)
    assert meta["task"] == "hopper" and meta["algo"] == "ppo"
    assert meta["obs_dim"] == 11 and meta["action_dim"] == 3
    assert meta["action_low"] == [-1.0] * 3 and meta["action_high"] == [1.0] * 3
    assert meta["control_hz"] == pytest.approx(125.0)  # Hopper-v5: dt 0.002 x frame_skip 4
    assert meta["actuator_names"] == ["thigh_joint", "leg_joint", "foot_joint"]
    assert meta["joint_names"][:3] == ["rootx", "rootz", "rooty"]
    assert meta["expected_delay_steps"] == 0 and meta["delay_steps_range"] == [0, 0]
    assert meta["config_sha256"] == config_sha256(config)
    assert meta["observation_layout"] == [{"group": "policy", "offset": 0, "size": 11}]
    assert meta["observation_groups"] == ["policy"]
    assert meta["task_options"] == {"ctrl_cost_weight": 0.002}  # deploy's SimSource uses them
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["obs"]
    assert [o.name for o in session.get_outputs()] == ["action"]
    obs = torch.randn(300, 11) * 2.0
    got = session.run(None, {"obs": obs.numpy()})[0]  # batch 300: the batch dim is dynamic
    np.testing.assert_allclose(got, alg.act_deterministic(obs).numpy(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("fmt", ["torchscript", "pt2"])
def test_export_torch_formats(checkpoint, tmp_path: Path, fmt: str) -> None:  # noqa: ANN001
    path, config, alg = checkpoint
    out = tmp_path / f"policy{FORMATS[fmt][0]}"
    export_main([f"checkpoint={path}", f"format={fmt}", f"out={out}", "num_obs=1000"])
    meta = read_metadata(out)
    assert meta["task"] == "hopper" and meta["config_sha256"] == config_sha256(config)
    assert meta["format"] == fmt and meta["observation_groups"] == ["policy"]
    module = verify.load_torch_module(str(out), fmt)
    obs = torch.randn(7, 11)
    torch.testing.assert_close(module(obs), alg.act_deterministic(obs), atol=1e-5, rtol=0)


PT2_CHILD = """
import io, json, sys, zipfile
sys.modules["robotrl"] = None  # the controller process has torch, not robotrl
import torch
path = sys.argv[1]
extra = {"robotrl_metadata.json": ""}
program = torch.export.load(path, extra_files=extra)
meta = json.loads(extra["robotrl_metadata.json"])
obs = torch.load(sys.argv[2])
with torch.no_grad():
    torch.save(program.module()(obs), sys.argv[3])
print(meta["format"], meta["obs_dim"], meta["action_dim"])
"""


def test_export_pt2_runs_without_robotrl(checkpoint, tmp_path: Path) -> None:  # noqa: ANN001
    path, _, alg = checkpoint
    out = tmp_path / "policy.pt2"
    export_main([f"checkpoint={path}", "format=pt2", f"out={out}", "num_obs=200"])
    obs = torch.randn(5, 11) * 2.0
    torch.save(obs, tmp_path / "obs.pt")
    child = subprocess.run([sys.executable, "-c", PT2_CHILD, str(out), str(tmp_path / "obs.pt"),
                            str(tmp_path / "act.pt")], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path)
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["pt2", "11", "3"]
    torch.testing.assert_close(torch.load(tmp_path / "act.pt"), alg.act_deterministic(obs),
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("fmt", ["pt2", "torchscript"])
def test_torch_formats_deploy(fmt: str, tmp_path: Path) -> None:
    alg = _ppo()
    actor = alg.export_actor()
    meta = {"metadata_version": 1, "task": "hopper", "obs_dim": 11, "action_dim": 3,
            "action_low": [-1.0] * 3, "action_high": [1.0] * 3}
    out = tmp_path / f"p{FORMATS[fmt][0]}"
    report = export_policy(actor, fmt, out, meta, torch.randn(100, 11) * 3.0)
    assert report["passed"] and report["max_abs_diff"][fmt] <= 1e-5
    # torchscript carries a note exactly when this torch deprecates torch.jit
    assert all("prefer format=pt2" in note for note in report["notes"])
    policy = load_policy(str(out))
    assert isinstance(policy, TorchPolicy)
    obs = np.random.default_rng(0).normal(size=11).astype(np.float32)
    np.testing.assert_allclose(policy(obs), actor(torch.from_numpy(obs)[None])[0].numpy(),
                               atol=1e-5)


def test_delay_range_from_randomization_config() -> None:
    assert delay_steps_range({}) == (0, 0)
    assert delay_steps_range({"randomization": "none"}) == (0, 0)
    spec = {"action_delay_min": 1, "action_delay_max": 3}
    assert delay_steps_range({"randomization": spec}) == (1, 3)
    assert delay_steps_range({"env": {"options": {"randomization": spec}}}) == (1, 3)
    cfg = from_dict(TrainConfig, {"algo": {"name": "ppo"}, "randomization": spec})
    assert delay_steps_range(to_dict(cfg)) == (1, 3)  # as a checkpoint stores it


class _DataDependent(nn.Module):
    """Python control flow on a tensor value: a trace would freeze one branch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) if x.sum() > 0 else -self.fc(x)


def _small_actor(network: nn.Module | None = None) -> DeterministicActor:
    torch.manual_seed(0)
    return DeterministicActor(network or nn.Linear(4, 2), 4, -torch.ones(2), torch.ones(2))


def test_untraceable_actor_is_refused_with_the_reason(tmp_path: Path) -> None:
    out = tmp_path / "p.onnx"
    # torch.export's own wording decides which of our two messages applies; both refuse
    untraceable = "cannot be traced faithfully.*data-dependent|torch.export of the actor failed"
    for fmt in ("onnx", "torchscript"):
        with pytest.raises(ExportError, match=untraceable):
            export_policy(_small_actor(_DataDependent()), fmt, out, {}, torch.randn(8, 4))
    with pytest.raises(ExportError, match="available: onnx, pt2, torchscript"):
        export_policy(_small_actor(), "tflite", out, {}, torch.randn(8, 4))
    assert list(tmp_path.iterdir()) == []


def test_failed_verification_leaves_no_file(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    actor, obs = _small_actor(), torch.randn(64, 4)
    existing = tmp_path / "old.onnx"
    existing.write_bytes(b"previous export")
    report = export_policy(actor, "onnx", tmp_path / "ok.onnx", {"metadata_version": 1}, obs)
    assert report["passed"] and report["max_abs_diff"]["onnx"] <= 1e-5
    (tmp_path / "ok.onnx").unlink()

    real = verify.RUNNERS["onnx"]

    def drifting(data: bytes):  # noqa: ANN202 - a backend that is off by 1e-3
        run = real(data)
        return lambda x: run(x) + 1e-3

    monkeypatch.setitem(verify.RUNNERS, "onnx", drifting)
    for target in (tmp_path / "new.onnx", existing):
        with pytest.raises(VerificationError, match="export refused") as err:
            export_policy(actor, "onnx", target, {"metadata_version": 1}, obs)
        assert err.value.report["max_abs_diff"]["onnx"] == pytest.approx(1e-3, rel=1e-2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.onnx"]  # no temp files either
    assert existing.read_bytes() == b"previous export"


def test_deep_residual_actor_exports(tmp_path: Path) -> None:
    torch.manual_seed(0)
    norm = RunningNormalizer(17)
    norm.update(torch.randn(1000, 17) * 2.0 + 1.0)
    net = ResidualMLP(17, 64, 64, 6)  # 130 linear layers
    actor = DeterministicActor(net, 17, -2 * torch.ones(6), 2 * torch.ones(6), "tanh", norm)
    obs = verify.sample_observations(actor, 2000)
    report = export_policy(actor, "onnx", tmp_path / "deep.onnx", {"metadata_version": 1}, obs)
    assert report["passed"]
    assert max(report["max_abs_diff"].values()) <= 1e-5


# ---------------------------------------------------------------------------- deploy loop
class FakeSource:
    """Observations from a script: ``nan`` ticks give NaN, ``late`` ticks sleep, ``missing``
    ticks give None; every written action is kept."""

    def __init__(self, nan=(), late=(), missing=(), late_s: float = 0.2) -> None:  # noqa: ANN001
        self.nan, self.late, self.missing, self.late_s = set(nan), set(late), set(missing), late_s
        self.tick = 0
        self.written: list[np.ndarray] = []

    def read(self) -> np.ndarray | None:
        k = self.tick
        if k in self.late:
            time.sleep(self.late_s)
        if k in self.missing:
            return None
        obs = np.full(4, float(k), dtype=np.float32)
        if k in self.nan:
            obs[2] = np.nan
        return obs

    def write(self, action: np.ndarray) -> None:
        self.written.append(action.copy())
        self.tick += 1


def _loop(source: FakeSource, policy, ticks: int = 20, **cfg: object) -> dict:  # noqa: ANN001
    config = DeployConfig(hz=200, seconds=ticks / 200, obs_timeout=0.1, **cfg)
    return run_loop(policy, source, config, -np.ones(2, np.float32), np.ones(2, np.float32))


def test_watchdog_holds_last_good_action_on_nan_late_and_missing() -> None:
    source = FakeSource(nan=[5], late=[9], missing=[12, 13, 14])
    report = _loop(source, lambda obs: np.array([0.01, -0.01]) * obs[:2], hold_steps=2)
    actions = np.stack(source.written)
    assert report["watchdog"] == {"missing": 3, "late": 1, "nonfinite_obs": 1,
                                  "nonfinite_action": 0}
    assert report["watchdog_trips"] == 5
    np.testing.assert_array_equal(actions[5], actions[4])  # NaN: hold the last good
    np.testing.assert_array_equal(actions[9], actions[8])  # late: hold
    np.testing.assert_array_equal(actions[12], actions[11])
    np.testing.assert_array_equal(actions[13], actions[11])
    np.testing.assert_array_equal(actions[14], [0.0, 0.0])  # past hold_steps: the default
    np.testing.assert_allclose(actions[15], [0.15, -0.15])  # fresh observation: acting again
    assert np.isfinite(actions).all() and report["model_ms"]["p50"] > 0


def test_nonfinite_model_output_trips_to_default() -> None:
    source = FakeSource()
    report = _loop(source, lambda obs: np.array([np.inf, 0.5]), ticks=5, safe_action="default",
                   default_action=(0.2, -0.2))
    assert report["watchdog"]["nonfinite_action"] == 5
    np.testing.assert_allclose(np.stack(source.written), [[0.2, -0.2]] * 5)


def test_rate_limit_and_clipping() -> None:
    source = FakeSource()
    flip = {"sign": 1.0}

    def policy(obs: np.ndarray) -> np.ndarray:  # bang-bang beyond the bounds
        flip["sign"] *= -1.0
        return np.array([5.0, -0.5]) * flip["sign"]

    report = _loop(source, policy, ticks=30, max_delta=0.3)
    actions = np.stack(source.written)
    steps = np.abs(np.diff(np.vstack([np.zeros(2), actions]), axis=0))  # from the default 0
    assert steps.max() <= 0.3 + 1e-6
    assert (actions >= -1).all() and (actions <= 1).all()
    assert report["rate_limited"] > 0
    source = FakeSource()
    report = _loop(source, lambda obs: np.array([5.0, -5.0]), ticks=5)
    np.testing.assert_array_equal(np.stack(source.written), [[1.0, -1.0]] * 5)
    assert report["clipped"] == 5 and report["rate_limited"] == 0


def test_deploy_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="allowed: last, default"):
        DeployConfig(safe_action="zero")
    with pytest.raises(ValueError, match="hz must be > 0"):
        DeployConfig(hz=0)


def test_onnx_policy_in_sim_loop(tmp_path: Path) -> None:
    alg = _ppo()
    actor = alg.export_actor()
    meta = {"metadata_version": 1, "task": "hopper", "obs_dim": 11, "action_dim": 3,
            "action_low": [-1.0] * 3, "action_high": [1.0] * 3, "input_name": "obs",
            "output_name": "action"}
    export_policy(actor, "onnx", tmp_path / "p.onnx", meta, torch.randn(100, 11))
    policy = OnnxPolicy(str(tmp_path / "p.onnx"))
    source = SimSource("hopper", seed=1)
    obs = source.read().copy()
    np.testing.assert_allclose(policy(obs), actor(torch.from_numpy(obs)[None])[0].numpy(),
                               atol=1e-5)
    report = run_loop(policy, source, DeployConfig(hz=500, seconds=0.1, obs_timeout=0.5),
                      policy.low, policy.high)
    assert report["ticks"] == 50 and report["watchdog_trips"] == 0
    assert report["period_ms"]["p50"] > 0 and np.isfinite(report["jitter_ms"]["p99"])


def test_cli_export_then_deploy(checkpoint, tmp_path: Path) -> None:  # noqa: ANN001
    path = checkpoint[0]
    model, out = tmp_path / "policy.onnx", tmp_path / "deploy.json"
    run = [sys.executable, "-m", "robotrl.cli.main"]
    export = subprocess.run([*run, "export", f"checkpoint={path}", f"out={model}",
                             "num_obs=500"], capture_output=True, text=True, timeout=300)
    assert export.returncode == 0, export.stderr
    deploy = subprocess.run([*run, "deploy", f"model={model}", "hz=200", "seconds=0.5",
                             "max_delta=0.2", f"out={out}"],
                            capture_output=True, text=True, timeout=300)
    assert deploy.returncode == 0, deploy.stderr
    printed = deploy.stdout + deploy.stderr  # the console writes to stderr
    assert "model call" in printed and "missed deadlines" in printed
    report = json.loads(out.read_text())
    assert report["ticks"] == 100 and set(report["model_ms"]) == {"p50", "p99", "max"}
    with pytest.raises(SystemExit, match="deploy runs the ONNX, pt2 and TorchScript"):
        deploy_main([f"model={path}"])  # a checkpoint, not an export
    with pytest.raises(SystemExit, match="available: onnx, pt2, torchscript"):
        export_main([f"checkpoint={path}", "format=tflite"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deploy.json", "policy.onnx"]


def test_one_step_agreement_of_two_backends() -> None:
    from robotrl.envs import make
    from robotrl.sim2real.gap import one_step_agreement, relative_error

    # the same physics: exact; 30% heavier bodies: apart from the first step
    ours, theirs = one_step_agreement(make("hopper", 3, num_threads=1), make("hopper", 3), 20)
    assert ours.shape == (20, 3, 11) and torch.equal(ours, theirs)
    heavy = make("hopper", 3, randomization={"body_mass": {"low": 1.3, "high": 1.3}})
    heavy_obs, _ = one_step_agreement(heavy, make("hopper", 3), 20)
    assert float(relative_error(heavy_obs, theirs)[0].min()) > 1e-3
    assert float((theirs[1:] - theirs[:-1]).abs().max()) > 0.1  # the worlds moved
    np.testing.assert_allclose(relative_error(torch.tensor([[1.0, 4.0]]), torch.tensor([[1.0, 2.0]])),
                               [1.0])  # |4 - 2| / max(1, 2)
    with pytest.raises(ValueError, match="env has 2 worlds x 11 observations, the reference 3"):
        one_step_agreement(make("hopper", 2), make("hopper", 3), 1)
