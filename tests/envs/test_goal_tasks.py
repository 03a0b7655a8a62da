"""Goal-conditioned locomotion tasks: goal layout in the observation, goal distributions, the
mazes' walls, success, and goals carried by snapshots."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from robotrl.envs import make
from robotrl.envs.registry import make_task
from robotrl.envs.tasks.goals import MAZE_SCALE, MAZES, AntMaze, maze_cells

TASKS = {"ant_goal": (31, 2), "ant_umaze": (31, 2), "ant_bigmaze": (31, 2),
         "humanoid_goal": (275, 3)}


@pytest.mark.parametrize("task", list(TASKS))
def test_goal_closes_the_observation_and_success_follows_the_distance(task: str) -> None:
    dim, k = TASKS[task]
    env = make(task, 4, seed=0, num_threads=1)
    goal = env.spec.goal
    assert goal is not None and goal.success_distance == 0.5
    assert goal.columns == tuple(range(dim - k, dim)) and goal.achieved == tuple(range(k))
    obs = env.reset(seed=0)["policy"]
    assert obs.shape == (4, dim)
    # the achieved columns are the root's position
    torch.testing.assert_close(obs[:, :k], env.sim.qpos[:, :k].float())
    out = env.step(torch.zeros(4, env.spec.action_dim))
    final = out.info["final_obs"]["policy"]
    dist = (final[:, list(goal.achieved)] - final[:, list(goal.columns)]).norm(dim=1)
    torch.testing.assert_close(out.info["goal_distance"], dist, atol=1e-4, rtol=0)
    assert not out.info["success"].any() and torch.equal(out.reward, out.info["success"].float())
    # the goal lives in userdata, the last columns of a snapshot: moving it onto the root
    # makes every world succeed, and restoring the snapshot restores the goal
    state = env.get_state()
    moved = state.clone()
    moved[:, -k:] = env.sim.qpos[:, :k]
    env.set_state(moved)
    torch.testing.assert_close(env.observe()["policy"][:, -k:], env.sim.qpos[:, :k].float())
    out = env.step(torch.zeros(4, env.spec.action_dim))
    assert out.info["success"].all() and (out.reward == 1).all()
    env.set_state(state)
    torch.testing.assert_close(env.observe()["policy"][:, -k:], obs[:, -k:])


def test_goal_distributions() -> None:
    gen = torch.Generator().manual_seed(0)
    ant = make_task("ant_goal")
    r = ant.sample_goal(4000, gen).norm(dim=1)
    torch.testing.assert_close(r, torch.full_like(r, 10.0))
    humanoid = make_task("humanoid_goal")
    g = humanoid.sample_goal(4000, gen)
    r = g[:, :2].norm(dim=1)
    assert (r >= 1.0).all() and (r <= 5.0).all() and (g[:, 2] == 1.25).all()
    # distance uniform in [1, 5]: its median is 3 (so nearer goals are denser than by area)
    assert float(r.median()) == pytest.approx(3.0, abs=0.1)
    angle = torch.atan2(g[:, 1], g[:, 0])
    assert float((angle > 0).double().mean()) == pytest.approx(0.5, abs=0.03)
    for name, layout in (("ant_umaze", "u"), ("ant_bigmaze", "big")):
        for goals, marks in (("train", "GE"), ("eval", "E")):
            task = make_task(name, goals=goals)
            assert isinstance(task, AntMaze)
            cells = maze_cells(MAZES[layout], marks)
            drawn = task.sample_goal(2000, gen)
            # every goal is a goal cell's centre, and every goal cell is drawn
            hits = (drawn[:, None] == cells[None]).all(-1)
            assert (hits.sum(1) == 1).all() and hits.any(0).all(), (name, goals)
    assert len(maze_cells(MAZES["u"], "GE")) == 6 and len(maze_cells(MAZES["u"], "E")) == 3


def test_maze_walls_stand_on_wall_cells_and_the_ant_starts_in_the_start_cell() -> None:
    import mujoco

    env = make("ant_umaze", 8, seed=0, num_threads=1)
    model = env.model
    walls = {mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_GEOM, g): model.geom_pos[g].tolist()
             for g in range(model.ngeom)
             if (mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_GEOM, g) or "").startswith("wall")}
    layout = MAZES["u"]
    expected = {f"wall_{i}_{j}": [i * MAZE_SCALE, j * MAZE_SCALE, MAZE_SCALE / 4]
                for i, row in enumerate(layout) for j, c in enumerate(row) if c == "#"}
    assert walls.keys() == expected.keys()
    for name, pos in walls.items():
        assert pos == pytest.approx(expected[name]), name
    env.reset(seed=0)
    start = torch.tensor([1.0, 1.0]) * MAZE_SCALE
    assert ((env.sim.qpos[:, :2] - start).abs() <= 0.1 + 1e-9).all()
    # rays from the start cell's centre (the ant moved away) meet the walls the layout draws
    data = mujoco.MjData(model)
    data.qpos[:2] = 100.0
    mujoco.mj_forward(model, data)
    for direction, distance, wall in (([-1, 0, 0], 2.0, "wall_0_1"), ([1, 0, 0], 2.0, "wall_2_1"),
                                      ([0, 1, 0], 10.0, "wall_1_4"), ([0, -1, 0], 2.0, "wall_1_0")):
        geom = np.array([-1], dtype=np.int32)
        ray = mujoco.mj_ray(model, data, np.array([4.0, 4.0, 0.3]),
                            np.array(direction, dtype=np.float64), None, 1, -1, geom)
        assert ray == pytest.approx(distance)
        assert mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_GEOM, int(geom[0])) == wall


def test_goal_tasks_refuse_bad_options() -> None:
    with pytest.raises(ValueError, match="unknown goals 'far'; known: \\['train', 'eval'\\]"):
        make_task("ant_umaze", goals="far")
    with pytest.raises(ValueError, match="observes the root position"):
        make_task("ant_goal", exclude_current_positions_from_observation=True)
    with pytest.raises(ValueError, match="unknown option.*'goal_radius'"):
        make_task("humanoid_goal", goal_radius=3.0)
    assert math.isclose(make_task("ant_goal", goal_radius=3.0).cfg.goal_radius, 3.0)


def test_pusher_goal_observes_as_pusher_v5_and_succeeds_with_the_object_on_the_goal() -> None:
    import gymnasium as gym

    env = make("pusher_goal", 4, seed=0, num_threads=1)
    goal = env.spec.goal
    assert goal is not None and (goal.columns, goal.achieved) == ((20, 21), (17, 18))
    assert goal.success_distance == 0.1 and env.spec.max_episode_steps == 100
    obs = env.reset(seed=0)["policy"]
    # Pusher-v5's own observation of the same state
    ref = gym.make("Pusher-v5").unwrapped
    ref.reset(seed=0)
    for i in range(4):
        ref.set_state(env.sim.qpos[i].numpy(), env.sim.qvel[i].numpy())
        torch.testing.assert_close(obs[i], torch.as_tensor(ref._get_obs(), dtype=torch.float32))
    # drawn per episode: object and goal apart, in their ranges ((y, x) joint displacements)
    task = make_task("pusher_goal")
    obj, g = task.sample_positions(4000, torch.Generator().manual_seed(0))
    assert ((obj - g).norm(dim=1) > 0.17).all()
    assert (obj[:, 0] <= 0).all() and (obj[:, 0] >= -0.3).all() and (obj[:, 1].abs() <= 0.2).all()
    assert (g[:, 0] >= -0.55).all() and (g[:, 0] <= -0.25).all() and (g[:, 1].abs() <= 0.2).all()
    out = env.step(torch.zeros(4, 7))
    assert not out.info["success"].any()
    # the object's joints set to the goal's: the bodies share their (x, y), so it succeeds
    state = env.get_state()
    nq = env.model.nq
    state[:, 1 + nq - 4: 1 + nq - 2] = state[:, 1 + nq - 2: 1 + nq]
    env.set_state(state)
    out = env.step(torch.zeros(4, 7))
    assert out.info["success"].all() and (out.info["goal_distance"] < 0.02).all()
