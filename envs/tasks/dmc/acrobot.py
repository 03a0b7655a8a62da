"""dm_control's acrobot: ``dmc/acrobot-swingup`` (swing the two-link pole up, tip to target).

Two 1 m links on damped hinges (Coulom's model), only the elbow actuated; no contacts. The model
integrates with RK4 (0.01 s), which dm_control steps with ``mj_step`` and then ``mj_step1`` at
the new state (as the other integrators' ``step_stage``).
"""

from __future__ import annotations

import mujoco
import numpy as np
import torch

from robotrl.envs.tasks.base import Sim, View
from robotrl.envs.tasks.dmc import DmcTask, tolerance


class AcrobotSwingup(DmcTask):
    """Observation: ``orientations`` (the upper and lower arm frames' xz rotation entries, then
    their zz: sines and cosines of the links' angles from upright), ``velocity`` (qvel).
    Reward: 1 while the tip is within the target's 0.2 m radius (the target 4 m above the
    floor, straight above the shoulder), else gaussian in the distance beyond, 0.1 at 1 m."""

    name = "dmc/acrobot-swingup"
    domain = "acrobot"
    xml_file = "acrobot.xml"
    frame_skip = 1  # control timestep = physics timestep, 0.01 s; 10 s episodes
    margin = 1.0  # m: distance beyond the target where the reward is 0.1 (swingup, not sparse)
    view = View(distance=8.0, elevation=-10.0, lookat=(0.0, 0.0, 2.0))

    def __init__(self, cfg, model: mujoco.MjModel) -> None:
        body, site = mujoco.mjtObj.mjOBJ_BODY, mujoco.mjtObj.mjOBJ_SITE
        self.arms = [mujoco.mj_name2id(model, body, n) for n in ("upper_arm", "lower_arm")]
        self.tip = mujoco.mj_name2id(model, site, "tip")
        self.target = mujoco.mj_name2id(model, site, "target")
        self.target_radius = float(model.site_size[self.target, 0])  # 0.2 m
        super().__init__(cfg, model)

    def observe_parts(self, sim: Sim) -> dict[str, torch.Tensor]:
        xmat = sim.xmat[:, self.arms]
        return {"orientations": torch.cat([xmat[:, :, 2], xmat[:, :, 8]], dim=1),
                "velocity": sim.qvel}

    def reward(self, sim: Sim) -> torch.Tensor:
        distance = torch.linalg.vector_norm(
            sim.site_xpos[:, self.target] - sim.site_xpos[:, self.tip], dim=1)
        return tolerance(distance, bounds=(0.0, self.target_radius), margin=self.margin)

    def initialize(self, data: mujoco.MjData, random: np.random.RandomState) -> None:
        joints = [self.qpos_index(n) for n in ("shoulder", "elbow")]
        data.qpos[joints] = random.uniform(-np.pi, np.pi, 2)
