"""dm_control's two-link planar reacher: ``dmc/reacher-easy``, ``dmc/reacher-hard``.

dm_control moves its target geom (``geom_pos``) and sizes it (``geom_size``) in the model at
every reset; here each world keeps its target's x, y and radius in ``userdata`` instead, so the
model (its target geom left at the origin, sized as the task's) is shared by all worlds.
"""

from __future__ import annotations

from typing import ClassVar

import mujoco
import numpy as np
import torch

from robotrl.envs.tasks.base import Sim, View
from robotrl.envs.tasks.dmc import DmcTask, randomize_joints, tolerance


class ReacherEasy(DmcTask):
    """Observation: ``position`` (qpos: shoulder, wrist angles), ``to_target`` (the target's
    centre minus the fingertip's, x and y), ``velocity`` (qvel). Reward: 1 while the fingertip
    touches the target (centre distance at most the sum of their radii), else 0."""

    name = "dmc/reacher-easy"
    domain = "reacher"
    xml_file = "reacher.xml"
    frame_skip = 1  # control timestep = physics timestep, 0.02 s; 20 s episodes
    target_size: ClassVar[float] = 0.05  # target radius (m); dm_control's _BIG_TARGET
    target_radius = (0.05, 0.20)  # target's distance from the shoulder (m), uniform
    num_userdata = 3  # target x, y (m), target radius (m)
    view = View(distance=0.8, elevation=-90.0, lookat=(0.0, 0.0, 0.0))

    @classmethod
    def edit_spec(cls, spec: mujoco.MjSpec) -> None:
        spec.geom("target").size[0] = cls.target_size  # as dm_control sizes it at each reset

    def __init__(self, cfg, model: mujoco.MjModel) -> None:
        self.finger = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, "finger")
        self.finger_size = float(model.geom_size[self.finger, 0])  # 0.01 m
        super().__init__(cfg, model)

    def to_target(self, sim: Sim) -> torch.Tensor:
        return sim.userdata[:, :2] - sim.geom_xpos[:, self.finger, :2]

    def observe_parts(self, sim: Sim) -> dict[str, torch.Tensor]:
        return {"position": sim.qpos, "to_target": self.to_target(sim), "velocity": sim.qvel}

    def reward(self, sim: Sim) -> torch.Tensor:
        distance = torch.linalg.vector_norm(self.to_target(sim), dim=1)
        radii = sim.userdata[:, 2] + self.finger_size
        # dm_control's tolerance(distance, (0, radii)) (margin 0: 1 inside, else 0) with radii a
        # per-world tensor: distance - radii <= 0 is the same comparison, exactly
        return tolerance(distance - radii, bounds=(-float("inf"), 0.0))

    def initialize(self, data: mujoco.MjData, random: np.random.RandomState) -> None:
        randomize_joints(self.model, data, random)
        angle = random.uniform(0, 2 * np.pi)
        radius = random.uniform(*self.target_radius)
        data.userdata[:] = (radius * np.sin(angle), radius * np.cos(angle), self.target_size)

    def userdata_of(self, model: mujoco.MjModel, data: mujoco.MjData) -> np.ndarray:
        target = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, "target")
        return np.array([*model.geom_pos[target, :2], model.geom_size[target, 0]])

    def markers(self, data: mujoco.MjData) -> list[tuple[tuple[float, float, float], float]]:
        x, y, size = data.userdata[:3]
        return [((float(x), float(y), 0.01), float(size))]


class ReacherHard(ReacherEasy):
    name = "dmc/reacher-hard"
    target_size = 0.015  # dm_control's _SMALL_TARGET
