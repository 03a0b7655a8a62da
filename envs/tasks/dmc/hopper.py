"""dm_control's hopper: ``dmc/hopper-stand``, ``dmc/hopper-hop``."""

from __future__ import annotations

from typing import ClassVar

import mujoco
import numpy as np
import torch

from robotrl.envs.tasks.base import Sim, View
from robotrl.envs.tasks.dmc import DmcTask, randomize_joints, tolerance


class HopperStand(DmcTask):
    """Observation: ``position`` (qpos without the root's x), ``velocity`` (qvel), ``touch``
    (log1p of the toe and heel touch sensors). Reward: the torso 0.6-2 m above the foot
    (gaussian margin 0), times small controls (stand) or hopping forward at 2 m/s or more
    (hop)."""

    name = "dmc/hopper-stand"
    domain = "hopper"
    xml_file = "hopper.xml"
    frame_skip = 4  # 0.02 s control over 0.005 s physics; 20 s episodes
    stand_height = 0.6
    hop_speed = 2.0
    hopping: ClassVar[bool] = False
    view = View(distance=3.0, elevation=-20.0, lookat=(0.0, 0.0, 0.8), track="torso")

    def __init__(self, cfg, model: mujoco.MjModel) -> None:
        self.torso = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "torso")
        self.foot = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "foot")
        super().__init__(cfg, model)

    def observe_parts(self, sim: Sim) -> dict[str, torch.Tensor]:
        touch = [self.sensor("touch_toe").start, self.sensor("touch_heel").start]
        return {"position": sim.qpos[:, 1:], "velocity": sim.qvel,
                "touch": torch.log1p(sim.sensordata[:, touch])}

    def reward(self, sim: Sim) -> torch.Tensor:
        height = sim.xipos[:, self.torso, 2] - sim.xipos[:, self.foot, 2]
        standing = tolerance(height, (self.stand_height, 2.0))
        if self.hopping:
            speed = sim.sensordata[:, self.sensor("torso_subtreelinvel")][:, 0]
            return standing * tolerance(speed, bounds=(self.hop_speed, float("inf")),
                                        margin=self.hop_speed / 2, value_at_margin=0.5,
                                        sigmoid="linear")
        small = tolerance(sim.ctrl, margin=1, value_at_margin=0, sigmoid="quadratic").mean(dim=1)
        return standing * (small + 4) / 5

    def initialize(self, data: mujoco.MjData, random: np.random.RandomState) -> None:
        randomize_joints(self.model, data, random)


class HopperHop(HopperStand):
    name = "dmc/hopper-hop"
    hopping = True
