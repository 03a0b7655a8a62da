"""The legged velocity tasks (go1_velocity, g1_velocity) and their robots from MuJoCo Menagerie.

The models come from the offline Menagerie root of ``tests/fixtures/menagerie.py`` (the Go1 and
G1 files mjlab's wheel ships, laid out as Menagerie lays them out), never from this repository.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import mujoco
import numpy as np
import pytest
import torch

import robotrl.envs as E
from robotrl.envs.robots import (
    RobotUnavailable,
    build_model,
    menagerie_root_from_wheel,
    robot_description,
)
from robotrl.runners.tracking import COMMAND_GRID, velocity_tracking

pytestmark = pytest.mark.usefixtures("menagerie_root")


STAND = torch.tensor([[0.0, 0.0, 1.0] * 4])
"""Knees a little straighter than the default pose: sagging under its weight at mjlab's gains,
the default pose grazes the ground with the rear shins about a quarter of the time."""


def _go1(n: int = 4, **options: object) -> E.BatchedEnv:
    return E.make("go1_velocity", n, num_threads=1, seed=0,
                  observations=("policy", "privileged"), **options)


def test_robot_model_is_the_description() -> None:
    desc = robot_description("go1")
    model = build_model(desc, 0.005)
    assert model.nu == 12 and model.opt.timestep == 0.005
    for i, joint in enumerate(desc.joints):
        act = model.actuator(i)
        assert model.joint(int(act.trnid[0])).name == joint
        assert act.gainprm[0] == pytest.approx(desc.kp[i])
        assert act.biasprm[2] == pytest.approx(-desc.kd[i])
        assert act.forcerange[1] == pytest.approx(desc.effort_limit[i])
        assert model.dof_armature[model.joint(joint).dofadr[0]] == pytest.approx(desc.armature[i])
    # the source's sensors removed: a touch sensor per foot, a contact sensor per other geom
    foot = {g for g in range(model.ngeom) if model.geom_priority[g] == 1}
    other = [g for g in range(model.ngeom) if model.geom_contype[g] and g not in foot]
    assert len(other) == 26 and [model.sensor(i).name for i in range(model.nsensor)] == [
        f"{model.geom(g).name}_ground" for g in other] + [f"{f}_touch" for f in desc.feet]
    assert all(model.sensor_objid[i] == g for i, g in enumerate(other))


def test_go1_stands_on_its_feet_at_the_default_pose() -> None:
    """Holding the default pose for 1 s, the Go1 stays up and its feet carry its weight."""
    env = _go1(2)
    for _ in range(50):
        out = env.step(torch.zeros(2, 12))
    assert not bool(out.terminated.any())
    task, sim = env.task, env.sim
    weight = float(env.model.body_subtreemass[1]) * 9.81
    assert float(task.touch(sim)[0].sum()) == pytest.approx(weight, rel=0.2)
    assert float(sim.qpos[0, 2]) > 0.2


def test_observation_groups_and_layout() -> None:
    env = _go1(3)
    obs = env.reset(seed=1)
    assert obs["policy"].shape == (3, 9 + 36)
    spec = env.spec.observations["privileged"]
    assert spec.shape == (3 + 4 + 45 + env.model.nbody + env.model.ngeom,)
    task, sim = env.task, env.sim
    policy = obs["policy"].double()
    assert torch.allclose(policy[:, 0:3], task.gravity(sim), atol=1e-6)
    assert torch.allclose(policy[:, 6:9], task.commands(sim), atol=1e-6)
    gravity = policy[:, 0:3]
    assert torch.allclose(gravity.norm(dim=1), torch.ones(3, dtype=torch.float64), atol=1e-5)


def test_observing_linear_velocity_puts_it_first_with_its_noise() -> None:
    """``observe_lin_vel`` (the field's actors read the body's linear velocity): three columns
    first in the policy observation, their own noise, and the exported controller's layout
    says so; off, the layout is as it was."""
    from robotrl.nn.actor import DeterministicActor
    from robotrl.sim2real.export import build_metadata

    env = _go1(3, observe_lin_vel=True)
    env.reset(seed=1)
    env.step(torch.zeros(3, 12))
    obs = env.observe()
    task, sim = env.task, env.sim
    assert obs["policy"].shape == (3, 12 + 36)
    policy = obs["policy"].double()
    assert torch.allclose(policy[:, 0:3], task.lin_vel(sim), atol=1e-5)
    assert float(task.lin_vel(sim).abs().max()) > 1e-3  # a moving body, not zeros
    assert torch.allclose(policy[:, 3:6], task.gravity(sim), atol=1e-6)
    assert torch.allclose(policy[:, 9:12], task.commands(sim), atol=1e-6)
    noise = task.obs_noise_scale()
    assert noise.shape == (48,) and noise[:3].tolist() == [0.29] * 3
    assert noise[3:].tolist() == _go1(1).task.obs_noise_scale().tolist()
    assert env.spec.observations["privileged"].shape[0] == (
        3 + 4 + 48 + env.model.nbody + env.model.ngeom)
    actor = DeterministicActor(torch.nn.Linear(48, 12), 48, -torch.ones(12), torch.ones(12))
    meta = build_metadata(actor, env.spec, {"env": {"options": {"observe_lin_vel": True}}})
    parts = meta["controller"]["observation_parts"]
    assert parts[0] == {"name": "body_linear_velocity", "offset": 0, "size": 3}
    assert parts[-1] == {"name": "last_action", "offset": 36, "size": 12}
    assert sum(p["size"] for p in parts) == 48
    assert type(task).controller_metadata()["observation_parts"][0]["name"] == "projected_gravity"


def test_commands_are_drawn_in_range_and_resampled() -> None:
    env = _go1(64, resample_seconds=(0.1, 0.1), standing_fraction=0.25)
    first = env.task.commands(env.sim).clone()
    cfg = env.task.cfg
    for lo_hi, col in ((cfg.command_x, 0), (cfg.command_y, 1), (cfg.command_yaw, 2)):
        assert bool((first[:, col] >= lo_hi[0]).all() and (first[:, col] <= lo_hi[1]).all())
    standing = (first == 0).all(1).float().mean()
    assert 0.05 < float(standing) < 0.5
    for _ in range(6):  # 0.12 s: every world past its 0.1 s draw
        env.step(torch.zeros(64, 12))
    now = env.task.commands(env.sim)
    redrawn_standing = (now == 0).all(1) & (first == 0).all(1)  # zero drawn twice
    assert not bool(torch.isclose(now, first).all(1)[~redrawn_standing].any())


def test_command_grid_pins_each_world() -> None:
    env = _go1(len(COMMAND_GRID) + 1, command_grid=COMMAND_GRID, resample_seconds=(0.02, 0.02))
    for _ in range(3):
        env.step(torch.zeros(env.num_envs, 12))
    cmd = env.task.commands(env.sim)
    assert cmd[0].tolist() == list(COMMAND_GRID[0])
    assert cmd[-1].tolist() == list(COMMAND_GRID[0])  # world 12 wraps to the first command
    assert cmd[2].tolist() == list(COMMAND_GRID[2])


def test_reward_terms_by_hand() -> None:
    """One step's tracking terms recomputed from the simulator's state: weight * dt *
    exp(-error^2 / sigma), in the body frame."""
    env = _go1(2, command_grid=((0.6, -0.2, 0.4),))
    out = env.step(torch.zeros(2, 12))
    task, sim, cfg = env.task, env.sim, env.task.cfg
    q = sim.qpos[:, 3:7]
    w, x, y, z = q.unbind(1)
    rot = torch.stack([  # body-to-world rotation matrix of each world
        torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], 1),
        torch.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], 1),
        torch.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], 1),
    ], 1)
    v_body = torch.einsum("nji,nj->ni", rot, sim.qvel[:, :3])
    err = (torch.tensor([0.6, -0.2], dtype=torch.float64) - v_body[:, :2]).square().sum(1)
    expected = cfg.tracking_lin_vel * task.dt * torch.exp(-err / cfg.tracking_sigma)
    assert torch.allclose(out.info["reward_terms"]["tracking_lin_vel"].double(), expected,
                          rtol=1e-5)
    yaw = cfg.tracking_ang_vel * task.dt * torch.exp(
        -(0.4 - sim.qvel[:, 5]).square() / cfg.tracking_sigma)
    assert torch.allclose(out.info["reward_terms"]["tracking_ang_vel"].double(), yaw, rtol=1e-5)
    assert torch.allclose(out.reward, sum(out.info["reward_terms"].values()), atol=1e-6)


def test_yaw_tracking_has_its_own_sigma() -> None:
    """tracking_sigma_yaw widens the yaw term alone (mjlab's 0.5 against 0.25 for linear)."""
    grid = ((0.6, -0.2, 0.4),)
    same, wide = _go1(2, command_grid=grid), _go1(2, command_grid=grid, tracking_sigma_yaw=0.5)
    a, b = same.step(torch.zeros(2, 12)), wide.step(torch.zeros(2, 12))
    err = (0.4 - wide.sim.qvel[:, 5]).square()
    cfg = wide.task.cfg
    yaw = cfg.tracking_ang_vel * wide.task.dt * torch.exp(-err / 0.5)
    assert torch.allclose(b.info["reward_terms"]["tracking_ang_vel"].double(), yaw, rtol=1e-5)
    assert torch.equal(a.info["reward_terms"]["tracking_lin_vel"],
                       b.info["reward_terms"]["tracking_lin_vel"])
    assert (b.info["reward_terms"]["tracking_ang_vel"]
            > a.info["reward_terms"]["tracking_ang_vel"]).all()


POSTURE = {"(hip|thigh)": (0.05, 0.3, 0.5), "calf": (0.1, 0.6, 0.9)}
"""Posture stds (standing, walking, running): mjlab's Go1's, running loosened further so that
each regime has its own."""


def test_posture_reward_is_tight_standing_and_loose_walking() -> None:
    """mjlab's variable posture: weight * dt * exp(-mean(((q - default) / std)^2)), each world's
    std by its command's speed (|(vx, vy)| + |yaw|): standing (0), walking (0.5 forward, 0.8
    turning) and running (1.6 forward) worlds, recomputed by hand from the joints."""
    grid = ((0.0, 0.0, 0.0), (0.5, 0.0, 0.0), (0.0, 0.0, 0.8), (1.6, 0.0, 0.0))
    env = _go1(4, command_grid=grid, posture=1.0, posture_std=POSTURE,
               posture_speeds=(0.05, 1.5))
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        out = env.step(torch.randn(4, 12, generator=gen) * 0.5)
    task = env.task
    z = env.sim.qpos[:, task.qpos_ids] - task.default
    stand = torch.tensor([0.05, 0.05, 0.1] * 4, dtype=torch.float64)  # FR, FL, RR, RL: hip, thigh, calf
    walk = torch.tensor([0.3, 0.3, 0.6] * 4, dtype=torch.float64)
    run = torch.tensor([0.5, 0.5, 0.9] * 4, dtype=torch.float64)
    std = torch.stack([stand, walk, walk, run])
    expected = task.dt * torch.exp(-(z / std).square().mean(1))
    torch.testing.assert_close(out.info["reward_terms"]["posture"].double(), expected)
    off = _go1(1).step(torch.zeros(1, 12))
    assert float(off.info["reward_terms"]["posture"].abs().max()) == 0  # off by default
    with pytest.raises(ValueError, match="no pattern matches joint 'FR_calf_joint'"):
        _go1(1, posture=1.0, posture_std={"(hip|thigh)": (0.05, 0.3, 0.3)})


def test_upside_down_terminates() -> None:
    env = _go1(2)
    state = env.get_state()
    flipped = state.clone()
    qpos = 1  # mjSTATE_FULLPHYSICS: time, then qpos
    flipped[:, qpos + 3:qpos + 7] = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    env.set_state(flipped[:1], env_ids=torch.tensor([0]))
    out = env.step(torch.zeros(2, 12))
    assert out.terminated.tolist() == [True, False]


def test_collision_counts_bodies_on_the_ground_other_than_by_the_feet() -> None:
    """Standing on its feet costs nothing; while random actions fold the legs, the bodies the
    term counts are those whose non-foot geoms MuJoCo finds on the floor (recomputed from each
    world's state), and each step's ``collision`` term is -dt x their number."""
    env = _go1(16)
    model, task = env.model, env.task
    for _ in range(25):  # settled on its feet after the drop from the spawn height
        standing = env.step(STAND.expand(16, -1))
    assert float(standing.info["reward_terms"]["collision"].abs().max()) == 0
    foot = {g for g in range(model.ngeom) if model.geom_priority[g] == 1}
    data = mujoco.MjData(model)
    gen = torch.Generator().manual_seed(0)
    touched = 0
    for _ in range(40):
        out = env.step(torch.randn(16, 12, generator=gen) * 3)
        alive = ~(out.terminated | out.truncated)
        torch.testing.assert_close(  # the term from the step's own sensors (reset worlds aside)
            out.info["reward_terms"]["collision"][alive].double(),
            task.cfg.collision * task.dt * task.bodies_on_ground(env.sim).sum(1)[alive])
        for w in range(16):
            data.qpos[:], data.qvel[:] = env.sim.qpos[w].numpy(), env.sim.qvel[w].numpy()
            mujoco.mj_forward(model, data)
            bodies = {int(model.geom_bodyid[g]) for c in data.contact[:data.ncon]
                      for g in (c.geom1, c.geom2) if model.geom_bodyid[g] != 0 and g not in foot}
            touched += len(bodies)
            sensed = task.bodies_on_ground(SimpleNamespace(
                sensordata=torch.from_numpy(data.sensordata.copy())[None]))
            assert float(sensed.sum()) == len(bodies)
    assert touched > 0


def test_encoder_bias_shifts_measurement_and_target_alike() -> None:
    env = _go1(3, encoder_bias=0.05, reset_noise_scale=0.0)
    task, sim = env.task, env.sim
    bias = sim.userdata[:, task._bias].clone()
    assert float(bias.abs().max()) <= 0.05 and float(bias.abs().max()) > 0
    obs = env.observe()["policy"].double()
    assert torch.allclose(obs[:, 9:21], bias, atol=1e-6)  # at the default pose: q - q0 = 0
    env.step(torch.zeros(3, 12))
    assert torch.allclose(sim.ctrl, task.default - bias, atol=1e-12)


def test_latency_delays_the_servo_targets() -> None:
    env = _go1(2, randomization={"action_delay_min": 2, "action_delay_max": 2})
    task, sim = env.task, env.sim
    act = torch.zeros(2, 12)
    act[:, 0] = 1.0
    seen = []
    for _ in range(3):
        env.step(act)
        seen.append(float(sim.ctrl[0, 0] - task.default[0]))
    assert seen[:2] == [0.0, 0.0] and seen[2] == pytest.approx(task.desc.action_scale[0])
    # the policy's own last action is observed at once, not the delayed one
    assert float(env.observe()["policy"][0, 33]) == pytest.approx(1.0)


def test_observation_noise_follows_the_task_model() -> None:
    env = _go1(256, randomization={"obs_noise": 1.0})
    clean = env.task.observe(env.sim).float()
    noisy = env.observe()["policy"]
    std = (noisy - clean).std(0)
    model = env.task.obs_noise_scale().float()
    assert torch.allclose(std, model, rtol=0.25, atol=1e-6)
    assert float(std[6:9].abs().max()) == 0.0  # commands are exact


def test_the_second_robot_is_configuration() -> None:
    env = E.make("g1_velocity", 2, num_threads=1)
    desc = robot_description("g1")
    assert env.spec.action_dim == len(desc.joints) == 29
    assert env.spec.obs_dim == 9 + 3 * 29
    out = env.step(torch.zeros(2, 29))
    assert set(out.info["reward_terms"]) == set(env.task.reward_terms)


def test_tracking_report_of_a_standing_policy() -> None:
    """A policy that stands still (on its feet) has the commands' own size for linear error, the
    yaw commands' size for yaw error."""
    grid = ((0.0, 0.0, 0.0), (0.5, 0.0, 0.0), (0.0, 0.3, 0.5))
    env = _go1(3, command_grid=grid)
    report = velocity_tracking(env, env.reset(seed=0), lambda obs: STAND.expand(3, -1),
                               seconds=2.5, settle=1.5)
    lin = math.sqrt((0.0 + 0.25 + 0.09) / 3)
    yaw = math.sqrt(0.25 / 3)
    assert report["lin_vel_rmse"] == pytest.approx(lin, abs=0.05)
    assert report["yaw_rate_rmse"] == pytest.approx(yaw, abs=0.05)
    assert report["falls"] == 0 and report["commands"][1]["command"] == [0.5, 0.0, 0.0]
    assert report["off_feet_fraction"] == 0.0  # standing on its feet
    # one that swings its thighs back rests on its rear shins: each command's row says so
    kneeling = velocity_tracking(env, env.reset(seed=0), lambda obs: torch.tensor(
        [[0.0, -0.5, 1.0] * 4] * 3), seconds=2.5, settle=1.5)
    assert kneeling["falls"] == 0 and kneeling["off_feet_fraction"] > 0.5
    assert all(row["off_feet_fraction"] > 0.5 for row in kneeling["commands"])
    with pytest.raises(ValueError, match="command_grid"):
        velocity_tracking(_go1(2), _go1(2).reset(), lambda obs: torch.zeros(2, 12))


def test_missing_model_names_menagerie_root(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MENAGERIE_ROOT", str(tmp_path))
    with pytest.raises(RobotUnavailable, match="MENAGERIE_ROOT=.*unitree_go1"):
        E.make("go1_velocity", 1)
    run = tmp_path / "run"  # the CLI: one line, exit 2, no traceback, no run directory left
    proc = subprocess.run([sys.executable, "-m", "robotrl.cli.main", "train", "env=go1_velocity",
                           "total_steps=1", f"run_dir={run}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("robot error: robot 'go1'") and "MENAGERIE_ROOT=" in proc.stderr
    assert "Traceback" not in proc.stderr and not run.exists()


def test_bad_robot_description_is_named() -> None:
    with pytest.raises(ValueError, match="unknown robot 'spot'; available: .*go1"):
        robot_description("spot")


def test_menagerie_root_from_a_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "mjlab-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("mjlab/asset_zoo/robots/unitree_go1/xmls/go1.xml", "<mujoco/>")
        zf.writestr("mjlab/asset_zoo/robots/unitree_go1/xmls/assets/trunk.stl", b"x")
        zf.writestr("mjlab-0.dist-info/licenses/LICENSE", "licence")
    root = menagerie_root_from_wheel(wheel, tmp_path / "root", robots=("unitree_go1",))
    assert (root / "unitree_go1" / "go1.xml").read_text() == "<mujoco/>"
    assert (root / "unitree_go1" / "assets" / "trunk.stl").exists()
    assert (root / "unitree_go1" / "LICENSE").read_text() == "licence"
    with pytest.raises(ValueError, match="unitree_g1"):
        menagerie_root_from_wheel(wheel, tmp_path / "root", robots=("unitree_g1",))


def test_model_compiles_without_meshes_for_collision() -> None:
    """Collision is primitives only: meshes are visual (contype 0, conaffinity 0)."""
    model = build_model(robot_description("go1"), 0.005)
    mesh = model.geom_type == mujoco.mjtGeom.mjGEOM_MESH
    assert bool(mesh.any())
    assert not bool((model.geom_contype[mesh] | model.geom_conaffinity[mesh]).any())


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "robotrl.cli.main", *args], capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow  # five robotrl processes: ~40 s on 2 cores (the guide test runs them too)
def test_train_eval_gap_export_from_the_cli(tmp_path: Path) -> None:
    """The README's robot commands at tiny sizes: a run's result.json and robotrl eval carry the
    tracking report, gap adds tracking columns, the export carries the servo mapping."""
    run = tmp_path / "go1"
    done = _cli("train", "env=go1_velocity", "randomization=legged", "num_envs=8",
                "algo.rollout_steps=8", "total_steps=128", "eval_episodes=1",
                "logger.progress=false", "logger.tensorboard=false", "backend.num_threads=1",
                f"run_dir={run}")
    assert done.returncode == 0, done.stderr
    final = json.loads((run / "result.json").read_text())["final"]
    assert {"lin_vel_rmse", "yaw_rate_rmse", "falls_per_minute", "mean_abs_torque"} <= set(final)
    assert "tracking RMSE" in done.stdout + done.stderr
    done = _cli("eval", f"checkpoint={run}", "episodes=1", "tracking_seconds=0.5",
                f"out={tmp_path / 'eval.json'}")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "eval.json").read_text())["tracking"]
    assert len(report["commands"]) == len(COMMAND_GRID) and report["seconds_per_world"] == 0.5
    done = _cli("gap", f"checkpoint={run}", "masses=1.0", "frictions=1.0", "delays=2",
                "episodes=1", "tracking_seconds=0.5", f"out={tmp_path / 'gap.json'}")
    assert done.returncode == 0, done.stderr
    row = json.loads((tmp_path / "gap.json").read_text())["results"][0]
    assert row["delay"] == 2 and row["lin_vel_rmse"] >= 0
    done = _cli("export", f"checkpoint={run}", "format=onnx", "num_obs=200")
    assert done.returncode == 0, done.stderr
    from robotrl.sim2real.export import read_metadata

    controller = read_metadata(run / "policy.onnx")["controller"]
    assert controller["robot"] == "go1" and len(controller["kp"]) == 12
    assert controller["observation_parts"][-1] == {"name": "last_action", "offset": 33,
                                                   "size": 12}


def test_robots_cli(tmp_path: Path) -> None:
    done = _cli("robots", "list")
    assert done.returncode == 0 and "unitree_go1/go1: 12 joints" in done.stdout + done.stderr
    done = _cli("robots", "bogus")
    assert done.returncode == 2 and "known: list, offline" in done.stderr


def test_nothing_measured_reads_nan_not_zero() -> None:
    """Worlds whose episodes end before they settle measure nothing: the errors are NaN."""
    env = _go1(2, command_grid=((0.5, 0.0, 0.0),), max_episode_steps=5)
    report = velocity_tracking(env, env.reset(seed=0), lambda obs: torch.zeros(2, 12),
                               seconds=0.5, settle=0.2)
    assert math.isnan(report["lin_vel_rmse"]) and report["measured_seconds"] == 0.0


def test_rough_ground_height_is_the_heightfield_s() -> None:
    """The task's ground lookup (spawn heights, fall test) agrees with MuJoCo's heightfield,
    probed by rays from above."""
    from robotrl.envs.registry import task_class
    from robotrl.envs.terrain import COLUMNS, LEVELS, TILE, Ground

    model = task_class("go1_velocity_rough").load_model()
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    terrain = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, "terrain")
    gen = torch.Generator().manual_seed(0)
    xy = torch.rand(200, 2, generator=gen, dtype=torch.float64) * torch.tensor(
        [LEVELS * TILE, COLUMNS * TILE], dtype=torch.float64)
    ours = Ground()(xy)
    geomid = np.zeros(1, dtype=np.int32)
    for (x, y), z in zip(xy.tolist(), ours.tolist(), strict=True):
        top = 5.0
        dist = mujoco.mj_ray(model, data, np.array([x, y, top]), np.array([0.0, 0.0, -1.0]),
                             None, 1, -1, geomid)
        if geomid[0] == terrain:
            assert top - dist == pytest.approx(z, abs=0.01)
    assert float(ours.max()) > 0.5  # the steepest pyramids rise about a metre


def test_terrain_curriculum_moves_worlds_by_how_far_they_walked() -> None:
    from robotrl.envs.terrain import TILE, Curriculum

    cur = Curriculum(init_level=0, gen=torch.Generator().manual_seed(0))
    levels = cur.ensure(4)
    levels[:] = torch.tensor([2, 2, 2, 0])
    walked = torch.tensor([TILE, 1.0, 2.0, 0.0], dtype=torch.float64)
    asked = torch.tensor([5.0, 5.0, 3.0, 5.0], dtype=torch.float64)
    cur.update(torch.arange(4), walked, asked, 4, started=torch.ones(4, dtype=torch.bool))
    assert cur.levels.tolist() == [3, 1, 2, 0]  # up, down, stay, floor at 0
    xy = cur.spawn(4)
    assert xy[:, 0].tolist() == [(lv + 0.5) * TILE for lv in (3, 1, 2, 0)]


def test_rough_task_spawns_on_its_levels_and_logs_them() -> None:
    from robotrl.envs.terrain import TILE

    env = E.make("go1_velocity_rough", 8, num_threads=1, seed=0)
    levels = env.task.curriculum.levels
    x = env.sim.qpos[:, 0]
    assert torch.all((x >= levels * TILE) & (x <= (levels + 1) * TILE))
    out = env.step(torch.zeros(8, 12))
    assert float(out.info["metrics"]["terrain_level"].mean()) == pytest.approx(
        float(levels.double().mean()))
    assert not bool(out.terminated.any())  # spawned above the ground, not inside it


@pytest.mark.slow  # MJX's compilation of the Go1 step: ~40 s on a 2-core CPU
def test_mjx_steps_the_robot_task_as_the_native_backend() -> None:
    """The velocity task on MJX (CPU JAX): the same snapshot (episode variables included) gives
    the same observation, and one step the same observation and reward to float32 rounding."""
    pytest.importorskip("mujoco.mjx")
    grid = ((0.5, 0.0, 0.3), (0.0, -0.3, 0.0))
    mjx = E.make("go1_velocity", 2, backend="mjx", seed=0, command_grid=grid, encoder_bias=0.02)
    native = E.make("go1_velocity", 2, num_threads=1, seed=0, command_grid=grid,
                    encoder_bias=0.02)
    mjx.set_state(native.get_state())
    assert torch.allclose(mjx.sim.userdata, native.sim.userdata.float().double())
    assert torch.allclose(mjx.task.observe(mjx.sim), native.task.observe(native.sim), atol=1e-5)
    action = torch.randn(2, 12, generator=torch.Generator().manual_seed(0)) * 0.5
    a, b = native.step(action), mjx.step(action)
    assert torch.allclose(a.obs["policy"], b.obs["policy"], atol=1e-4)
    assert torch.allclose(a.reward, b.reward, atol=1e-6)
    assert torch.allclose(mjx.sim.userdata, native.sim.userdata.float().double(), atol=1e-6)


def test_only_positive_rewards_clips_the_total_at_zero() -> None:
    action = torch.randn(16, 12, generator=torch.Generator().manual_seed(0)) * 3
    plain = _go1(16).step(action)
    clipped = _go1(16, only_positive_rewards=True).step(action)
    assert float(plain.reward.min()) < 0 and float(plain.info["reward_terms"][
        "positive_clip"].abs().max()) == 0
    torch.testing.assert_close(clipped.reward, plain.reward.clamp_min(0), atol=1e-6, rtol=0)
    torch.testing.assert_close(clipped.info["reward_terms"]["positive_clip"],
                               (-plain.reward).clamp_min(0), atol=1e-6, rtol=0)


def test_alive_reward_pays_only_upright_worlds() -> None:
    env = _go1(2, alive=2.0)
    state = env.get_state()
    flipped = state.clone()
    flipped[:, 4:8] = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64)  # time, then qpos
    env.set_state(flipped[:1], env_ids=torch.tensor([0]))
    out = env.step(torch.zeros(2, 12))
    assert out.info["reward_terms"]["alive"].tolist() == pytest.approx([0.0, 2.0 * 0.02])
