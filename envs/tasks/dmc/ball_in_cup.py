"""dm_control's ball-in-cup: ``dmc/ball_in_cup-catch`` (swing the ball on its string into the cup).

A planar cup on two sprung, damped slide joints (x and z, motors of gear 5) and a ball on two
free slides, tied to the cup's bottom by a 0.3 m string (a limited spatial tendon).
"""

from __future__ import annotations

import mujoco
import numpy as np
import torch

from robotrl.envs.tasks.base import Sim, View
from robotrl.envs.tasks.dmc import DmcTask, unactuated


class BallInCupCatch(DmcTask):
    """Observation: ``position`` (qpos: cup x, z, ball x, z), ``velocity`` (qvel). Reward: 1
    while the ball's centre is inside the cup's target box shrunk by the ball's radius (x and
    z, strictly), else 0."""

    name = "dmc/ball_in_cup-catch"
    domain = "ball_in_cup"
    xml_file = "ball_in_cup.xml"
    frame_skip = 10  # 0.02 s control over 0.002 s physics; 20 s episodes
    ball_x = (-0.2, 0.2)  # m: the ball's initial x, uniform
    ball_z = (0.2, 0.5)  # m: the ball's initial z, uniform
    view = View(distance=1.2, elevation=-10.0, lookat=(0.0, 0.0, 0.4))

    def __init__(self, cfg, model: mujoco.MjModel) -> None:
        self.target = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, "target")
        self.ball = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "ball")
        ball_size = model.geom_size[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, "ball"), 0]
        # half extents (x, z) the ball's centre must stay within: 0.05 - 0.025 m each
        self.inner = torch.as_tensor(model.site_size[self.target, [0, 2]] - ball_size)
        super().__init__(cfg, model)

    def observe_parts(self, sim: Sim) -> dict[str, torch.Tensor]:
        return {"position": sim.qpos, "velocity": sim.qvel}

    def reward(self, sim: Sim) -> torch.Tensor:
        offset = sim.site_xpos[:, self.target][:, [0, 2]] - sim.xpos[:, self.ball][:, [0, 2]]
        return (offset.abs() < self.inner).all(dim=1).to(offset.dtype)

    def initialize(self, data: mujoco.MjData, random: np.random.RandomState) -> None:
        # ball positions drawn again until the ball touches nothing
        x, z = self.qpos_index("ball_x"), self.qpos_index("ball_z")
        while True:
            data.qpos[x] = random.uniform(*self.ball_x)
            data.qpos[z] = random.uniform(*self.ball_z)
            with unactuated(self.model):
                mujoco.mj_forward(self.model, data)
            if data.ncon == 0:
                return
