"""Domain randomization on the native backend: ranges, per-world resampling, reproducibility,
the physics it changes, delay/noise/pushes, bad input, checkpoints and the CLI."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
from pathlib import Path

import mujoco
import numpy as np
import pytest
import torch

import robotrl.envs as E
from robotrl.config import RandomizationConfig, Range, randomization_presets, resolve_randomization
from robotrl.envs.mujoco import MujocoEnv

MASS = {"body_mass": {"low": 0.5, "high": 2.0}}
# the locomotion preset with per-body masses and a 0-1 step action delay: every feature at once
FULL = {**dataclasses.asdict(resolve_randomization("locomotion")), "action_delay_max": 1}
FULL["body_mass"] = {**FULL["body_mass"], "shared": False}


def _make(n: int, randomization: object = None, seed: int = 0, task: str = "hopper",
          **over: object) -> MujocoEnv:
    env = E.make(task, n, seed=seed, num_threads=1, randomization=randomization, **over)
    assert isinstance(env, MujocoEnv)
    return env


def _actions(n: int, act_dim: int, steps: int, seed: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(n, act_dim, generator=gen) * 2 - 1 for _ in range(steps)]


def _ratio(env: MujocoEnv, name: str, nominal: np.ndarray) -> torch.Tensor:
    value = env.physics_params()[name]
    keep = torch.as_tensor(nominal) != 0
    return value[:, keep] / torch.as_tensor(nominal)[keep]


def test_presets_and_none_is_nominal() -> None:
    assert {"none", "locomotion"} <= set(randomization_presets())
    assert not resolve_randomization("none").enabled() and resolve_randomization("locomotion").enabled()
    env = _make(2, "none")
    assert env.physics_params() == {} and env._dr is None


def test_per_world_parameters_differ_and_stay_in_range() -> None:
    env = _make(32, FULL)
    model = env.model
    mass = _ratio(env, "body_mass", model.body_mass)
    assert mass.min() >= 0.6 and mass.max() <= 1.4 and mass.std(dim=0).min() > 0.1
    # inertia follows the mass of its body (uniform density)
    inertia = torch.from_numpy(env.batch.expanded("body_inertia").copy())
    expected = torch.as_tensor(model.body_inertia) * (env.physics_params()["body_mass"]
                                                      / torch.as_tensor(model.body_mass).clamp_min(
                                                          1e-12))[..., None]
    torch.testing.assert_close(inertia[:, 1:], expected[:, 1:])
    friction = _ratio(env, "friction", model.geom_friction[:, 0])
    assert friction.min() >= 0.5 and friction.max() <= 1.5 and friction.std() > 0.1
    gravity = env.physics_params()["gravity"] - torch.as_tensor(model.opt.gravity)
    assert gravity.abs().max() <= 0.3 and gravity.std() > 0.05
    delay = env.physics_params()["action_delay"]
    assert set(delay.tolist()) == {0, 1}
    gain = _ratio(env, "actuator_gain", model.actuator_gear[:, 0])
    assert gain.min() >= 0.85 and gain.max() <= 1.15


def test_same_seed_same_parameters() -> None:
    a, b, c = _make(8, "locomotion", seed=3), _make(8, "locomotion", seed=3), _make(
        8, "locomotion", seed=4)
    pa, pb, pc = a.physics_params(), b.physics_params(), c.physics_params()
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not torch.equal(pa["body_mass"], pc["body_mass"])
    # reset(seed) reseeds the draws too
    a.reset(seed=11)["policy"]
    c.reset(seed=11)["policy"]
    assert torch.equal(a.physics_params()["body_mass"], c.physics_params()["body_mass"])


def test_resampled_at_reset_of_that_world_only() -> None:
    env = _make(4, MASS)
    before = env.physics_params()["body_mass"]
    state = env.get_state()
    state[0, 2] = 0.3  # world 0's torso height (time, rootx, rootz, ...) below the healthy range
    env.set_state(state[:1], env_ids=torch.tensor([0]))
    out = env.step(torch.zeros(4, 3))
    assert out.terminated.tolist() == [True, False, False, False]
    after = env.physics_params()["body_mass"]
    assert not torch.equal(after[0], before[0])
    assert torch.equal(after[1:], before[1:])


def test_dense_draws_select_the_masked_worlds() -> None:
    # the GPU path (draw every row, keep the masked ones with `where`), run on the CPU
    env = _make(6, FULL)
    dr = env._dr
    assert dr is not None and not dr.dense
    dr.dense = True
    before = env.physics_params()
    mask = torch.tensor([True, False, True, False, False, True])
    dr.on_reset(mask)
    after = env.physics_params()
    for name in ("body_mass", "friction", "actuator_gain"):
        assert not torch.equal(after[name][mask], before[name][mask]), name
        assert torch.equal(after[name][~mask], before[name][~mask]), name
    assert set(after["action_delay"].tolist()) <= {0, 1}
    # the batch's physics follows: world 0's model has world 0's new masses
    np.testing.assert_array_equal(env.batch.get_model(0).body_mass, after["body_mass"][0].numpy())
    for _ in range(3):
        assert bool(torch.isfinite(env.step(torch.zeros(6, 3)).obs["policy"]).all())


def test_periodic_resampling_and_curriculum() -> None:
    env = _make(4, {**MASS, "resample_interval": 3}, task="halfcheetah")
    first = env.physics_params()["body_mass"]
    for _ in range(2):
        env.step(torch.zeros(4, 6))
    assert torch.equal(env.physics_params()["body_mass"], first)
    env.step(torch.zeros(4, 6))
    assert not (env.physics_params()["body_mass"][:, 1:] == first[:, 1:]).any()
    # curriculum: new ranges, applied at once with resample=True
    env.set_randomization({"body_mass": {"low": 2.0, "high": 2.0}}, resample=True)
    torch.testing.assert_close(_ratio(env, "body_mass", env.model.body_mass),
                               torch.full((4, env.model.nbody - 1), 2.0, dtype=torch.float64))


def test_masses_hit_the_simulation() -> None:
    """A randomized world steps exactly as one MjData on a model with its parameters."""
    cfg = {"body_mass": {"low": 0.5, "high": 2.0}, "armature": {"low": 0.5, "high": 2.0},
           "friction": {"low": 0.5, "high": 1.5}}
    env = _make(3, cfg)
    env.step(torch.zeros(3, 3))
    params = env.physics_params()
    i = 2
    model = copy.copy(env.model)
    model.body_mass[:] = params["body_mass"][i].numpy()
    model.body_inertia[:] = env.batch.expanded("body_inertia")[i]
    model.dof_armature[:] = params["armature"][i].numpy()
    model.geom_friction[:, 0] = params["friction"][i].numpy()
    mujoco.mj_setConst(model, data := mujoco.MjData(model))
    np.testing.assert_array_equal(model.dof_invweight0, env.batch.get_model(i).dof_invweight0)
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    mujoco.mj_setState(model, data, env.get_state()[i].numpy(), spec)
    mujoco.mj_forward(model, data)
    nominal = _make(3)
    nominal.set_state(env.get_state())
    for action in _actions(3, 3, 30):
        out = env.step(action)
        ref = nominal.step(action)
        data.ctrl[:] = action[i].double().numpy()
        mujoco.mj_step(model, data, nstep=env.task.frame_skip)
        if bool(out.terminated[i] | out.truncated[i]):
            break
        np.testing.assert_allclose(env.sim.qpos[i].numpy(), data.qpos, rtol=0, atol=1e-10)
    # and the nominal world, from the same state with the same actions, went elsewhere
    assert not torch.allclose(out.obs["policy"][i], ref.obs["policy"][i], atol=1e-3)


def test_double_mass_changes_the_motion() -> None:
    """The same push on a cart-pole twice as heavy gives about half the velocity (F = m a)."""
    speed = []
    for scale in (1.0, 2.0):
        env = _make(2, {"body_mass": {"low": scale, "high": scale, "shared": True}},
                    task="inverted_pendulum")
        env.step(torch.ones(2, 1))
        speed.append(env.sim.qvel[:, 0].abs().mean().item())
    assert speed[1] / speed[0] == pytest.approx(0.5, abs=0.05)


def test_action_delay_is_exact() -> None:
    k = 2
    delayed = _make(3, {"action_delay_min": k, "action_delay_max": k}, task="halfcheetah")
    plain = _make(3, task="halfcheetah")
    assert delayed.physics_params()["action_delay"].tolist() == [k] * 3
    actions = _actions(3, 6, 15)
    zeros = [torch.zeros(3, 6)] * k
    for t, (a, b) in enumerate(zip(actions, zeros + actions, strict=False)):
        out_d, out_p = delayed.step(a), plain.step(b)
        torch.testing.assert_close(delayed.sim.ctrl, plain.sim.ctrl, rtol=0, atol=0)
        torch.testing.assert_close(out_d.obs["policy"], out_p.obs["policy"], rtol=0, atol=0, msg=f"step {t}")


def test_observation_noise_statistics() -> None:
    std = torch.linspace(0.1, 1.1, 11)
    noisy = _make(2000, {"obs_noise": std.tolist()})
    clean = _make(2000)
    diff = (noisy.reset(seed=5)["policy"] - clean.reset(seed=5)["policy"]).double()
    assert diff.mean(dim=0).abs().max() < 0.1
    torch.testing.assert_close(diff.std(dim=0), std.double(), rtol=0.08, atol=0)
    with pytest.raises(ValueError, match="obs_noise has 3 entries.*11"):
        _make(2, {"obs_noise": [0.1, 0.2, 0.3]})


def test_action_noise_changes_applied_action() -> None:
    env = _make(500, {"action_noise": 0.1}, task="halfcheetah")
    env.step(torch.zeros(500, 6))
    assert env.sim.ctrl.std().item() == pytest.approx(0.1, rel=0.1)


def test_push_changes_root_velocity() -> None:
    pushed = _make(64, {"push_velocity": 1.0, "push_interval": [1, 1]})
    plain = _make(64)
    a, b = pushed.step(torch.zeros(64, 3)), plain.step(torch.zeros(64, 3))
    dv = (pushed.sim.qvel - plain.sim.qvel)[:, :2]  # rootx, rootz: the translational dofs
    assert dv.abs().min() > 0 and dv.abs().max() < 1.05
    assert not torch.equal(a.obs["policy"], b.obs["policy"])


@pytest.mark.parametrize(
    ("ranges", "match"),
    [
        ({"body_mass": {"low": -0.1, "high": 1.0}}, r"body_mass: scale factors must be >= 1e-06"),
        ({"friction": {"low": -0.5, "high": 1.0}}, r"friction: scale factors must be >= 0"),
        ({"friction": {"low": -5.0, "high": 0.0, "mode": "additive"}},
         r"friction: additive low -5.0 makes a nominal value negative"),
        ({"joint_damping": {"low": 1.2, "high": 0.8}}, r"joint_damping: low 1.2 > high 0.8"),
        ({"armature": {"low": 1, "high": 2, "distribution": "normal"}},
         r"armature.distribution: unknown 'normal'; allowed: uniform, loguniform"),
        ({"gravity": {"low": 1, "high": 2, "mode": "mul"}},
         r"gravity.mode: unknown 'mul'; allowed: scale, additive"),
        ({"actuator_gain": {"low": 0.0, "high": 2, "distribution": "loguniform"}},
         r"actuator_gain: loguniform needs low > 0"),
        ({"action_delay_min": 2, "action_delay_max": 1}, r"action_delay_min <= action_delay_max"),
        ({"mass": {"low": 1, "high": 1}}, r"unknown config key\(s\) \['mass'\].*body_mass"),
        ("locomotin", r"unknown randomization preset 'locomotin'; available: .*locomotion"),
    ],
)
def test_bad_ranges_rejected(ranges: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _make(1, ranges)


def test_none_is_bit_identical_to_no_randomization() -> None:
    a, b = _make(6, "none", seed=2), _make(6, seed=2)
    # turning randomization on does not move the reset distribution's draws either
    c = _make(6, {"body_mass": {"low": 1.0, "high": 1.0}}, seed=2)
    ra, rb, rc = a.reset()["policy"], b.reset()["policy"], c.reset()["policy"]
    assert torch.equal(ra, rb) and torch.equal(rc, rb)
    for action in _actions(6, 3, 120):
        x, y, z = a.step(action), b.step(action), c.step(action)
        assert torch.equal(x.obs["policy"], y.obs["policy"]) and torch.equal(x.reward, y.reward)
        assert torch.equal(x.terminated, y.terminated) and torch.equal(x.truncated, y.truncated)
        assert torch.equal(z.obs["policy"], y.obs["policy"])


def test_state_dict_round_trip_continues_exactly() -> None:
    a = _make(6, FULL, seed=1, max_episode_steps=25)
    actions = _actions(6, 3, 80)
    for action in actions[:30]:
        a.step(action)
    state = copy.deepcopy(a.state_dict())
    b = _make(6, None, seed=99, max_episode_steps=25)  # built nominal: the state brings it all
    b.load_state_dict(state)
    for action in actions[30:]:
        x, y = a.step(action), b.step(action)
        assert torch.equal(x.obs["policy"], y.obs["policy"]) and torch.equal(x.reward, y.reward)
    pa, pb = a.physics_params(), b.physics_params()
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)
    assert b.randomization == a.randomization


def test_com_offset_leaves_simple_bodies_alone() -> None:
    # Reacher's target is compiled as a simple body: mj_setConst refuses to move its inertial
    # frame (it used to raise here); every other body gets its offset
    env = _make(3, {"com_offset": {"low": 0.01, "high": 0.02, "mode": "additive"}}, task="reacher")
    shift = (env.physics_params()["com_offset"] - torch.as_tensor(env.model.body_ipos)).abs()
    simple = torch.as_tensor(env.model.body_simple != 0)
    assert bool((shift[:, simple] == 0).all()) and bool((shift[:, ~simple] >= 0.01).all())
    for _ in range(3):
        env.step(torch.zeros(3, 2))


def test_humanoid_center_of_mass_weighs_each_worlds_masses() -> None:
    env = _make(3, {"body_mass": {"low": 0.5, "high": 2.0}}, task="humanoid")
    env.step(torch.zeros(3, env.spec.action_dim))
    mass = env.physics_params()["body_mass"]
    expected = (mass[:, :, None] * env.sim.xipos[:, :, :2]).sum(1) / mass.sum(1, keepdim=True)
    torch.testing.assert_close(env.task._mass_center_xy(env.sim), expected)
    nominal = torch.as_tensor(env.model.body_mass)
    stale = (nominal[None, :, None] * env.sim.xipos[:, :, :2]).sum(1) / nominal.sum()
    assert float((stale - expected).abs().max()) > 1e-4  # the nominal weights would be off


def test_checkpoint_of_a_nominal_curriculum_loads_anywhere() -> None:
    env = _make(2, MASS)
    env.set_randomization("none", resample=True)  # a curriculum at zero
    plain = _make(2)
    plain.load_state_dict(env.state_dict())
    assert plain.physics_params() == {} and plain._dr is None


def test_gymnasium_backend_refuses_randomization() -> None:
    with pytest.raises(ValueError, match="randomization needs the 'mujoco', 'mjx' or 'brax' backend"):
        E.make("hopper", 1, backend="gymnasium", randomization="locomotion")


def test_config_round_trip_and_overrides() -> None:
    from robotrl.config import TrainConfig, from_dict, to_dict
    from robotrl.experiment import ConfigError, check_overrides

    cfg = from_dict(TrainConfig, {"algo": {"name": "ppo"}, "randomization": {
        "body_mass": {"low": 0.5, "high": 1.5}, "obs_noise": [0.1, 0.2], "push_interval": [3, 4]}})
    back = from_dict(TrainConfig, to_dict(cfg))
    assert back.randomization == cfg.randomization and back.randomization.push_interval == (3, 4)
    assert isinstance(back.randomization.body_mass, Range)
    check_overrides(["randomization=locomotion", "randomization.body_mass.low=0.5",
                     "randomization.obs_noise=0.1"])
    with pytest.raises(ConfigError, match="unknown randomization 'loco'"):
        check_overrides(["randomization=loco"])
    with pytest.raises(ConfigError, match="allowed keys of a range"):
        check_overrides(["randomization.body_mass.lo=0.5"])
    assert RandomizationConfig() == resolve_randomization(None)


def test_cli_train_with_randomization(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "robotrl.cli.main", "train", "env=hopper",
           "randomization=locomotion", "total_steps=512", "num_envs=8", "algo.rollout_steps=16",
           "eval_episodes=2", "logger.progress=false", "logger.tensorboard=false",
           f"run_dir={run}", "backend.num_threads=1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = (run / "config.yaml").read_text()
    assert "body_mass:" in text and "push_velocity: 0.3" in text
    assert (run / "checkpoints" / "last.pt").is_file()


def test_gap_perturbations_are_fixed_physics() -> None:
    from robotrl.sim2real.gap import perturbation

    env = _make(3, perturbation(mass=0.7, friction=1.5, delay=2))
    params = env.physics_params()
    torch.testing.assert_close(_ratio(env, "body_mass", env.model.body_mass),
                               torch.full((3, env.model.nbody - 1), 0.7, dtype=torch.float64))
    torch.testing.assert_close(_ratio(env, "friction", env.model.geom_friction[:, 0]),
                               torch.full((3, env.model.ngeom), 1.5, dtype=torch.float64))
    assert params["action_delay"].tolist() == [2, 2, 2]
    assert not perturbation().enabled()


def test_gap_cli_on_a_checkpoint(tmp_path: Path) -> None:
    import json

    from robotrl.cli.gap import gap_main
    from robotrl.config import TrainConfig, from_dict
    from robotrl.experiment import run_training

    cfg = from_dict(TrainConfig, {
        "algo": {"name": "ppo", "rollout_steps": 8, "actor_hidden": [16], "critic_hidden": [16]},
        "env": {"task": "inverted_pendulum", "options": {}}, "randomization": {
            "body_mass": {"low": 0.8, "high": 1.2}},
        "logger": {"tensorboard": False, "progress": False, "log_interval": 1},
        "num_envs": 4, "total_steps": 64, "run_dir": str(tmp_path / "run"), "eval_episodes": 2})
    run_training(cfg)
    out = tmp_path / "gap.json"
    gap_main([f"checkpoint={tmp_path / 'run'}", "masses=0.5,1.0", "frictions=1.0",
              "delays=0,1", "episodes=3", f"out={out}"])
    data = json.loads(out.read_text())
    rows = data["results"]
    assert [(r["mass"], r["delay"]) for r in rows] == [(0.5, 0), (0.5, 1), (1.0, 0), (1.0, 1)]
    assert rows[2]["relative"] == 1.0 and all(r["episodes"] == 3 for r in rows)
    with pytest.raises(SystemExit, match="masses must be > 0"):
        gap_main([f"checkpoint={tmp_path / 'run'}", "masses=-1"])
    with pytest.raises(SystemExit, match="comma-separated integers"):
        gap_main([f"checkpoint={tmp_path / 'run'}", "delays=a"])


def test_training_resume_with_randomization_is_exact(tmp_path: Path) -> None:
    from robotrl.config import TrainConfig, from_dict
    from robotrl.experiment.build import build_runner
    from robotrl.seeding import seed_everything

    def runner(run: str, total: int) -> object:
        cfg = from_dict(TrainConfig, {
            "algo": {"name": "ppo", "rollout_steps": 8, "actor_hidden": [16], "critic_hidden": [16]},
            "env": {"task": "inverted_pendulum", "options": {"max_episode_steps": 20}},
            "randomization": {"body_mass": {"low": 0.5, "high": 1.5}, "obs_noise": 0.05,
                              "action_delay_max": 2, "push_velocity": 0.2,
                              "push_interval": [3, 9]},
            "logger": {"tensorboard": False, "progress": False, "log_interval": 1},
            "num_envs": 4, "total_steps": total, "run_dir": str(tmp_path / run),
            "checkpoint_interval": 1000})
        seed_everything(cfg.seed)
        r = build_runner(cfg)
        r.evaluator = None
        return r

    full = runner("full", 6 * 32)
    full.train()
    runner("part", 3 * 32).train()
    resumed = runner("part", 6 * 32)
    resumed.load(tmp_path / "part" / "checkpoints" / "last.pt")
    resumed.train()

    def learning(history: list[dict[str, float]]) -> list[dict[str, float]]:
        return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in history]

    assert learning(resumed.history) == learning(list(full.history)[3:])
    assert len(resumed.history) == 3
