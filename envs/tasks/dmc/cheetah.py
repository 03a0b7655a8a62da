"""dm_control's cheetah: ``dmc/cheetah-run`` (run forward at 10 m/s or more)."""

from __future__ import annotations

import mujoco
import numpy as np
import torch

from robotrl.envs.tasks.base import Sim, View
from robotrl.envs.tasks.dmc import DmcTask, physics_step, tolerance


class CheetahRun(DmcTask):
    """Observation: ``position`` (qpos without the root's x), ``velocity`` (qvel). Reward:
    the torso subtree's forward speed, linear from 0 at rest to 1 at 10 m/s and above."""

    name = "dmc/cheetah-run"
    domain = "cheetah"
    xml_file = "cheetah.xml"
    frame_skip = 1  # control timestep = physics timestep, 0.01 s; 10 s episodes
    run_speed = 10.0
    view = View(distance=4.0, elevation=-20.0, lookat=(0.0, 0.0, 0.6), track="torso")

    def observe_parts(self, sim: Sim) -> dict[str, torch.Tensor]:
        return {"position": sim.qpos[:, 1:], "velocity": sim.qvel}

    def reward(self, sim: Sim) -> torch.Tensor:
        speed = sim.sensordata[:, self.sensor("torso_subtreelinvel")][:, 0]
        return tolerance(speed, bounds=(self.run_speed, float("inf")), margin=self.run_speed,
                         value_at_margin=0, sigmoid="linear")

    def initialize(self, data: mujoco.MjData, random: np.random.RandomState) -> None:
        # limited joints uniform in their ranges, then 200 physics steps to settle, clock at 0
        limited = np.flatnonzero(self.model.jnt_limited == 1)
        low, high = self.model.jnt_range[limited].T
        data.qpos[limited] = random.uniform(low, high)
        physics_step(self.model, data, 200)
        data.time = 0.0
