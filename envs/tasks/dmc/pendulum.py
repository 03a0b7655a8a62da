"""dm_control's pendulum: ``dmc/pendulum-swingup`` (swing the pole up and balance it).

One pole on a damped hinge, a 1 kg mass at its end, driven by a torque too weak to lift it
straight up: the pendulum has to be pumped up.
"""

from __future__ import annotations

import mujoco
import numpy as np
import torch

from robotrl.envs.tasks.base import Sim, View
from robotrl.envs.tasks.dmc import DmcTask, tolerance


class PendulumSwingup(DmcTask):
    """Observation: ``orientation`` (the pole frame's zz and xz rotation entries: the cosine
    and sine of its angle from upright), ``velocity`` (the hinge's angular velocity). Reward: 1
    while the pole is within 8 degrees of upright, else 0."""

    name = "dmc/pendulum-swingup"
    domain = "pendulum"
    xml_file = "pendulum.xml"
    frame_skip = 1  # control timestep = physics timestep, 0.02 s; 20 s episodes
    cosine_bound = float(np.cos(np.deg2rad(8)))  # the pole's zz at 8 degrees from upright
    view = View(distance=2.5, elevation=-10.0, lookat=(0.0, 0.0, 0.6))

    def __init__(self, cfg, model: mujoco.MjModel) -> None:
        self.pole = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "pole")
        super().__init__(cfg, model)

    def observe_parts(self, sim: Sim) -> dict[str, torch.Tensor]:
        return {"orientation": sim.xmat[:, self.pole][:, [8, 2]], "velocity": sim.qvel}

    def reward(self, sim: Sim) -> torch.Tensor:
        return tolerance(sim.xmat[:, self.pole, 8], bounds=(self.cosine_bound, 1.0))

    def initialize(self, data: mujoco.MjData, random: np.random.RandomState) -> None:
        data.qpos[self.qpos_index("hinge")] = random.uniform(-np.pi, np.pi)
