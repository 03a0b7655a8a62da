"""dm_control's fish: ``dmc/fish-swim`` (swim the fish's mouth to a target in a fluid).

A free-floating fish (no gravity, no constraints) in a medium of density 5000 kg/m^3, a tail of
two segments and two fins driven by five position actuators. dm_control moves its target geom
(``geom_pos``) in the model at every reset; here each world keeps its target's position in
``userdata`` instead, so the model (its target geom hidden) is shared by all worlds.
"""

from __future__ import annotations

import mujoco
import numpy as np
import torch

from robotrl.envs.tasks.base import Sim, View
from robotrl.envs.tasks.dmc import DmcTask, tolerance

JOINTS = ("tail1", "tail_twist", "tail2", "finright_roll", "finright_pitch", "finleft_roll",
          "finleft_pitch")
"""The fish's hinges, in dm_control's order (its ``joint_angles``)."""


class FishSwim(DmcTask):
    """Observation: ``joint_angles`` (the 7 hinges), ``upright`` (z of the torso's z axis),
    ``target`` (the target's centre minus the mouth's, in the mouth's frame), ``velocity``
    (qvel). Reward: (7 x in_target + upright') / 8, in_target 1 while the mouth's centre is
    within the sum of the mouth's and target's radii of the target's, gaussian to 0.1 at twice
    that sum beyond; upright' = (upright + 1) / 2."""

    name = "dmc/fish-swim"
    domain = "fish"
    xml_file = "fish.xml"
    frame_skip = 10  # 0.04 s control over 0.004 s physics; 40 s episodes
    joint_range = (-0.2, 0.2)  # rad: the hinges' initial angles, uniform
    target_x = (-0.4, 0.4)  # m: the target's position, uniform per coordinate
    target_y = (-0.4, 0.4)  # m
    target_z = (0.1, 0.3)  # m
    num_userdata = 3  # the target's x, y, z (m)
    view = View(distance=1.5, elevation=-30.0, lookat=(0.0, 0.0, 0.1), track="torso")

    @classmethod
    def edit_spec(cls, spec: mujoco.MjSpec) -> None:
        spec.geom("target").rgba[3] = 0  # drawn from userdata instead (markers)

    def __init__(self, cfg, model: mujoco.MjModel) -> None:
        self.torso = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "torso")
        self.mouth = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, "mouth")
        target = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, "target")
        self.target_size = float(model.geom_size[target, 0])  # 0.04 m
        self.radii = float(model.geom_size[self.mouth, 0]) + self.target_size  # 0.005 + 0.04 m
        joints = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in JOINTS]
        self.joint_qpos = model.jnt_qposadr[joints].tolist()
        self.root = int(model.jnt_qposadr[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT,
                                                            "root")])
        super().__init__(cfg, model)

    def mouth_to_target(self, sim: Sim) -> torch.Tensor:
        """[N, 3] the target's centre minus the mouth's, in the mouth's frame."""
        offset = sim.userdata[:, :3] - sim.geom_xpos[:, self.mouth]
        frame = sim.geom_xmat[:, self.mouth].reshape(-1, 3, 3)
        return torch.einsum("ni,nij->nj", offset, frame)

    def observe_parts(self, sim: Sim) -> dict[str, torch.Tensor]:
        return {"joint_angles": sim.qpos[:, self.joint_qpos],
                "upright": sim.xmat[:, self.torso, 8:9],
                "target": self.mouth_to_target(sim), "velocity": sim.qvel}

    def reward(self, sim: Sim) -> torch.Tensor:
        distance = torch.linalg.vector_norm(self.mouth_to_target(sim), dim=1)
        in_target = tolerance(distance, bounds=(0.0, self.radii), margin=2 * self.radii)
        is_upright = 0.5 * (sim.xmat[:, self.torso, 8] + 1)
        return (7 * in_target + is_upright) / 8

    def initialize(self, data: mujoco.MjData, random: np.random.RandomState) -> None:
        quat = random.randn(4)
        data.qpos[self.root + 3:self.root + 7] = quat / np.linalg.norm(quat)
        for adr in self.joint_qpos:
            data.qpos[adr] = random.uniform(*self.joint_range)
        data.userdata[:] = (random.uniform(*self.target_x), random.uniform(*self.target_y),
                            random.uniform(*self.target_z))

    def userdata_of(self, model: mujoco.MjModel, data: mujoco.MjData) -> np.ndarray:
        return np.array(model.geom_pos[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM,
                                                         "target")])

    def markers(self, data: mujoco.MjData) -> list[tuple[tuple[float, float, float], float]]:
        x, y, z = data.userdata[:3]
        return [((float(x), float(y), float(z)), self.target_size)]
