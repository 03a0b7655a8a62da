"""dm_control's planar walker: ``dmc/walker-stand``, ``dmc/walker-walk``, ``dmc/walker-run``."""

from __future__ import annotations

from typing import ClassVar

import mujoco
import numpy as np
import torch

from robotrl.envs.tasks.base import Sim, View
from robotrl.envs.tasks.dmc import DmcTask, randomize_joints, tolerance


class WalkerStand(DmcTask):
    """Observation: ``orientations`` (each body's xx and xz rotation entries), ``height``
    (the torso's z), ``velocity`` (qvel). Reward: standing (torso at 1.2 m or above, gaussian
    margin 0.6) and upright, times moving at ``move_speed`` or faster (linear margin of half of
    it) for walk and run."""

    name = "dmc/walker-stand"
    domain = "walker"
    xml_file = "walker.xml"
    frame_skip = 10  # 0.025 s control over 0.0025 s physics; 25 s episodes
    stand_height = 1.2
    move_speed: ClassVar[float] = 0.0
    view = View(distance=4.0, elevation=-20.0, lookat=(0.0, 0.0, 1.0), track="torso")

    def __init__(self, cfg, model: mujoco.MjModel) -> None:
        self.torso = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "torso")
        super().__init__(cfg, model)

    def observe_parts(self, sim: Sim) -> dict[str, torch.Tensor]:
        xmat = sim.xmat[:, 1:]
        return {"orientations": xmat[:, :, [0, 2]].reshape(sim.num_envs, -1),
                "height": sim.xpos[:, self.torso, 2:3],
                "velocity": sim.qvel}

    def reward(self, sim: Sim) -> torch.Tensor:
        standing = tolerance(sim.xpos[:, self.torso, 2], bounds=(self.stand_height, float("inf")),
                             margin=self.stand_height / 2)
        upright = (1 + sim.xmat[:, self.torso, 8]) / 2
        stand = (3 * standing + upright) / 4
        if self.move_speed == 0:
            return stand
        speed = sim.sensordata[:, self.sensor("torso_subtreelinvel")][:, 0]
        move = tolerance(speed, bounds=(self.move_speed, float("inf")),
                         margin=self.move_speed / 2, value_at_margin=0.5, sigmoid="linear")
        return stand * (5 * move + 1) / 6

    def initialize(self, data: mujoco.MjData, random: np.random.RandomState) -> None:
        randomize_joints(self.model, data, random)


class WalkerWalk(WalkerStand):
    name = "dmc/walker-walk"
    move_speed = 1.0


class WalkerRun(WalkerStand):
    name = "dmc/walker-run"
    move_speed = 8.0
