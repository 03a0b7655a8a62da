"""Goal-conditioned locomotion: Gymnasium's Ant and Humanoid told where to go.

Each task keeps its Gymnasium model, dynamics, reset noise and healthy-state termination, and
changes what goal-conditioned RL needs (JaxGCRL's ant, ant maze and humanoid goal tasks,
Bortkiewicz et al. 2024, whose numbers these follow):

* the observation starts with the root position and ends with the goal,

      ant:       [qpos (15, torso x y z first), qvel (14), goal x y (2)]                  [N, 31]
      humanoid:  [qpos (24), qvel (23), cinert (130), cvel (78), qfrc_actuator (17),
                  goal x y z (3)]                                                          [N, 275]

  so ``spec.goal`` names the goal columns (the last ones) and the achieved columns (the root's
  first two or three coordinates) that hindsight relabelling compares;
* the goal is drawn per episode from the task's goal distribution and kept in MjData's
  ``userdata`` (part of snapshots, so GRPO groups and evaluation states carry it);
* the reward is sparse: 1 while the root is within ``success_distance`` of the goal
  (``info["success"]``; ``info["goal_distance"]`` every step); an episode succeeds if the root
  is there at its last step.

``ant_umaze`` and ``ant_bigmaze`` build JaxGCRL's (D4RL's) U and big mazes as MJCF boxes around
Gymnasium's Ant: cell (row i, column j) is centred at (x, y) = (i, j) * ``MAZE_SCALE``, the ant
starts in the ``R`` cell and goals are the centres of ``G``/``E`` cells (``goals="eval"``: only the
``E`` cells, the far ones JaxGCRL's evaluation mazes keep).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import mujoco
import torch

from robotrl.envs.tasks.ant import Ant, AntConfig
from robotrl.envs.tasks.base import GoalTask, GymnasiumSpec, Sim, View
from robotrl.envs.tasks.humanoid import Humanoid, HumanoidConfig


class PositionGoal(GoalTask):
    """A goal task whose goal is a position of the root body (qpos[:goal_dim]), drawn per
    episode by ``sample_goal`` and kept in ``userdata``; the goal closes the observation."""

    goal_dim: ClassVar[int] = 2
    """Coordinates of the root position a goal fixes (x, y; or x, y, z)."""

    def __init__(self, cfg, model: mujoco.MjModel) -> None:  # noqa: ANN001 (task config)
        if cfg.exclude_current_positions_from_observation:
            raise ValueError(f"task {self.name!r} observes the root position (the achieved "
                             "goal): exclude_current_positions_from_observation must be false")
        super().__init__(cfg, model)
        self.num_userdata = self.goal_dim
        self.needs_cfrc_ext = bool(cfg.include_cfrc_ext_in_observation)
        dim = self.obs_dim
        self.goal_columns = tuple(range(dim - self.goal_dim, dim))
        self.achieved_columns = tuple(range(self.goal_dim))

    @classmethod
    def load_model(cls) -> mujoco.MjModel:
        gym_spec = GymnasiumSpec(cls.xml_file)
        cls.edit_spec(gym_spec.spec)
        return gym_spec.compile_model()

    @classmethod
    def edit_spec(cls, spec: mujoco.MjSpec) -> None:
        """Edit Gymnasium's MJCF before compiling: room for the goal in userdata."""
        spec.nuserdata = cls.goal_dim

    @property
    def obs_dim(self) -> int:
        return super().obs_dim + self.goal_dim

    @property
    def reward_terms(self) -> tuple[str, ...]:
        return ("success",)

    def sample_goal(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """[n, goal_dim] float64 goals of ``n`` fresh episodes."""
        raise NotImplementedError

    def reset_userdata(self, n: int, gen: torch.Generator) -> torch.Tensor:
        return self.sample_goal(n, gen)

    def goal(self, sim: Sim) -> torch.Tensor:
        """[N, goal_dim] float64: every world's goal."""
        return sim.userdata[:, : self.goal_dim]

    def observe(self, sim: Sim) -> torch.Tensor:
        return torch.cat([super().observe(sim), self.goal(sim)], dim=1)

    def markers(self, data: mujoco.MjData) -> list[tuple[tuple[float, float, float], float]]:
        """The goal, a sphere of the success radius (on the floor for x-y goals)."""
        goal = [*data.userdata[: self.goal_dim], 0.0][:3]
        return [(tuple(float(v) for v in goal), float(self.cfg.success_distance))]

    def goal_distance(self, sim: Sim) -> torch.Tensor:
        return (sim.qpos[:, : self.goal_dim] - self.goal(sim)).norm(dim=1)

    def rewards(self, sim: Sim, before: object, action: torch.Tensor
                ) -> dict[str, torch.Tensor]:
        return {"success": self.success(sim).double()}


def ring(n: int, gen: torch.Generator, low: float, high: float) -> torch.Tensor:
    """[n, 2] float64 points at a uniform angle and a distance uniform in [low, high] (not
    uniform in area: nearer goals are denser, as JaxGCRL's humanoid samples them)."""
    angle = torch.rand(n, generator=gen, dtype=torch.float64) * 2 * math.pi
    radius = low + torch.rand(n, generator=gen, dtype=torch.float64) * (high - low)
    return torch.stack([angle.cos(), angle.sin()], dim=1) * radius[:, None]


# ---------------------------------------------------------------------------------------- ant
@dataclasses.dataclass
class AntGoalConfig(AntConfig):
    exclude_current_positions_from_observation: bool = False
    """Must stay false: the torso's x-y position is the achieved goal."""
    include_cfrc_ext_in_observation: bool = False
    """Append the clipped external contact forces (JaxGCRL's goal tasks leave them out)."""
    success_distance: float = 0.5
    """The goal counts as reached with the torso's (x, y) within this distance (m)."""
    goal_radius: float = 10.0
    """Goals lie on the circle of this radius (m) around the start, at a uniform angle."""


class AntGoal(PositionGoal, Ant):
    name = "ant_goal"
    gym_id = "robotrl/AntGoal"
    config_cls = AntGoalConfig
    cfg: AntGoalConfig

    def sample_goal(self, n: int, gen: torch.Generator) -> torch.Tensor:
        return ring(n, gen, self.cfg.goal_radius, self.cfg.goal_radius)


MAZE_SCALE = 4.0
"""Side of a maze cell (m); walls are boxes of one cell, ``MAZE_SCALE / 2`` high."""
MAZES: dict[str, tuple[str, ...]] = {
    # '#' wall, 'R' start, 'G' goal, 'E' goal also in the evaluation set, '.' free
    "u": ("#####",
          "#RGG#",
          "###G#",
          "#EEE#",
          "#####"),
    "big": ("########",
            "#RG##EE#",
            "#GG#GEE#",
            "##GGG###",
            "#GG#GGG#",
            "#G#EG#E#",
            "#GEE#EE#",
            "########"),
}
"""Maze layouts by name (JaxGCRL's U_MAZE / BIG_MAZE, their _EVAL goals marked ``E``)."""
GOAL_SETS = ("train", "eval")


def maze_view(layout: tuple[str, ...]) -> View:
    """The whole maze from nearly overhead (rows run along x, columns along y)."""
    x, y = (len(layout) - 1) * MAZE_SCALE / 2, (len(layout[0]) - 1) * MAZE_SCALE / 2
    side = max(len(layout), len(layout[0])) * MAZE_SCALE
    return View(distance=1.3 * side, elevation=-80.0, lookat=(x, y, 0.0))


def maze_cells(layout: tuple[str, ...], marks: str) -> torch.Tensor:
    """[k, 2] float64 (x, y) centres of the cells marked with any of ``marks``."""
    return torch.tensor([[i * MAZE_SCALE, j * MAZE_SCALE] for i, row in enumerate(layout)
                         for j, c in enumerate(row) if c in marks], dtype=torch.float64)


@dataclasses.dataclass
class AntMazeConfig(AntGoalConfig):
    goals: str = "train"
    """Goal cells: "train" (every goal cell) or "eval" (the far cells of JaxGCRL's evaluation
    mazes)."""


class AntMaze(AntGoal):
    """Ant in a maze of walls (``layout``): start in the R cell, goals at goal-cell centres."""

    config_cls = AntMazeConfig
    cfg: AntMazeConfig
    layout: ClassVar[tuple[str, ...]]

    def __init__(self, cfg: AntMazeConfig, model: mujoco.MjModel) -> None:
        if cfg.goals not in GOAL_SETS:
            raise ValueError(f"unknown goals {cfg.goals!r}; known: {list(GOAL_SETS)}")
        super().__init__(cfg, model)
        self.start = maze_cells(self.layout, "R")[0]
        self.goal_cells = maze_cells(self.layout, "GE" if cfg.goals == "train" else "E")

    @classmethod
    def edit_spec(cls, spec: mujoco.MjSpec) -> None:
        super().edit_spec(spec)
        half = MAZE_SCALE / 2
        for i, row in enumerate(cls.layout):
            for j, c in enumerate(row):
                if c == "#":
                    spec.worldbody.add_geom(
                        name=f"wall_{i}_{j}", type=mujoco.mjtGeom.mjGEOM_BOX,
                        pos=[i * MAZE_SCALE, j * MAZE_SCALE, half / 2],
                        size=[half, half, half / 2], contype=1, conaffinity=1,
                        rgba=[0.7, 0.5, 0.3, 1.0])

    def reset_state(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        qpos, qvel = super().reset_state(n, gen)
        qpos[:, :2] += self.start
        return qpos, qvel

    def sample_goal(self, n: int, gen: torch.Generator) -> torch.Tensor:
        pick = torch.randint(len(self.goal_cells), (n,), generator=gen)
        return self.goal_cells[pick]


class AntUMaze(AntMaze):
    name = "ant_umaze"
    gym_id = "robotrl/AntUMaze"
    layout = MAZES["u"]
    view = maze_view(layout)


class AntBigMaze(AntMaze):
    name = "ant_bigmaze"
    gym_id = "robotrl/AntBigMaze"
    layout = MAZES["big"]
    view = maze_view(layout)


# ----------------------------------------------------------------------------------- humanoid
@dataclasses.dataclass
class HumanoidGoalConfig(HumanoidConfig):
    exclude_current_positions_from_observation: bool = False
    """Must stay false: the torso's position is the achieved goal."""
    include_cfrc_ext_in_observation: bool = False
    """Append the external contact forces (JaxGCRL's humanoid leaves them out)."""
    success_distance: float = 0.5
    """The goal counts as reached with the torso's (x, y, z) within this distance (m)."""
    goal_distance_range: tuple[float, float] = (1.0, 5.0)
    """Goals lie at a uniform angle and a distance uniform in this range (m) from the start."""
    goal_height: float = 1.25
    """The goal's z: about the standing torso's height, so reaching it means arriving upright."""


class HumanoidGoal(PositionGoal, Humanoid):
    name = "humanoid_goal"
    gym_id = "robotrl/HumanoidGoal"
    config_cls = HumanoidGoalConfig
    cfg: HumanoidGoalConfig
    goal_dim = 3

    def sample_goal(self, n: int, gen: torch.Generator) -> torch.Tensor:
        xy = ring(n, gen, *self.cfg.goal_distance_range)
        return torch.cat([xy, torch.full((n, 1), self.cfg.goal_height, dtype=torch.float64)], 1)
