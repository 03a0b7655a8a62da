"""dm_control's 3D humanoid: ``dmc/humanoid-stand``, ``dmc/humanoid-walk``, ``dmc/humanoid-run``."""

from __future__ import annotations

from typing import ClassVar

import mujoco
import numpy as np
import torch

from robotrl.envs.tasks.base import Sim, View
from robotrl.envs.tasks.dmc import DmcTask, randomize_joints, tolerance, unactuated


class HumanoidStand(DmcTask):
    """Observation: ``joint_angles`` (qpos without the free root's 7), ``head_height`` (the
    head's z), ``extremities`` (left hand, left foot, right hand, right foot relative to the
    torso, in the torso's frame), ``torso_vertical`` (the torso's z axis row zx, zy, zz),
    ``com_velocity`` (the torso subtree's linear velocity), ``velocity`` (qvel).

    Reward: standing (head at 1.4 m or above, gaussian margin 0.35 m) times upright (torso zz
    0.9 or above, linear margin 1.9) times small controls ((4 + quadratic) / 5), times keeping
    still (horizontal centre-of-mass speed, gaussian margin 2 m/s, mean of x and y) for stand,
    or moving at ``move_speed`` or faster ((5 * linear + 1) / 6, margin ``move_speed``) for
    walk and run."""

    name = "dmc/humanoid-stand"
    domain = "humanoid"
    xml_file = "humanoid.xml"
    frame_skip = 5  # 0.025 s control over 0.005 s physics; 25 s episodes
    stand_height = 1.4  # m, head height above which standing is 1
    move_speed: ClassVar[float] = 0.0  # m/s, horizontal speed above which moving is 1
    extremities = ("left_hand", "left_foot", "right_hand", "right_foot")
    view = View(distance=4.0, elevation=-20.0, lookat=(0.0, 0.0, 1.0), track="torso")

    def __init__(self, cfg, model: mujoco.MjModel) -> None:
        body = mujoco.mjtObj.mjOBJ_BODY
        self.torso = mujoco.mj_name2id(model, body, "torso")
        self.head = mujoco.mj_name2id(model, body, "head")
        self.limbs = [mujoco.mj_name2id(model, body, b) for b in self.extremities]
        sensor = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SENSOR, "torso_subtreelinvel")
        adr = int(model.sensor_adr[sensor])
        self.com_vel = slice(adr, adr + 3)  # the torso subtree's linear velocity
        super().__init__(cfg, model)

    def observe_parts(self, sim: Sim) -> dict[str, torch.Tensor]:
        xpos, xmat = sim.xpos, sim.xmat
        frame = xmat[:, self.torso].reshape(-1, 3, 3)
        to_limbs = xpos[:, self.limbs] - xpos[:, self.torso, None]  # [N, 4, 3] world frame
        return {"joint_angles": sim.qpos[:, 7:],
                "head_height": xpos[:, self.head, 2:3],
                "extremities": torch.bmm(to_limbs, frame).reshape(sim.num_envs, -1),
                "torso_vertical": xmat[:, self.torso, 6:9],
                "com_velocity": sim.sensordata[:, self.com_vel],
                "velocity": sim.qvel}

    def reward(self, sim: Sim) -> torch.Tensor:
        standing = tolerance(sim.xpos[:, self.head, 2], bounds=(self.stand_height, float("inf")),
                             margin=self.stand_height / 4)
        upright = tolerance(sim.xmat[:, self.torso, 8], bounds=(0.9, float("inf")),
                            sigmoid="linear", margin=1.9, value_at_margin=0)
        small = tolerance(sim.ctrl, margin=1, value_at_margin=0, sigmoid="quadratic").mean(dim=1)
        base = (4 + small) / 5 * standing * upright
        horizontal = sim.sensordata[:, self.com_vel][:, :2]
        if self.move_speed == 0:
            return base * tolerance(horizontal, margin=2).mean(dim=1)
        move = tolerance(torch.linalg.vector_norm(horizontal, dim=1),
                         bounds=(self.move_speed, float("inf")), margin=self.move_speed,
                         value_at_margin=0, sigmoid="linear")
        return base * (5 * move + 1) / 6

    def initialize(self, data: mujoco.MjData, random: np.random.RandomState) -> None:
        # rejection sampling: redraw every joint until no geoms touch (no contacts)
        while True:
            randomize_joints(self.model, data, random)
            with unactuated(self.model):
                mujoco.mj_forward(self.model, data)
            if data.ncon == 0:
                return


class HumanoidWalk(HumanoidStand):
    name = "dmc/humanoid-walk"
    move_speed = 1.0


class HumanoidRun(HumanoidStand):
    name = "dmc/humanoid-run"
    move_speed = 10.0
