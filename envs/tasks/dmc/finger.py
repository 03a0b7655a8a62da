"""dm_control's finger: ``dmc/finger-spin`` (flick the free spinner round, fast).

A two-joint planar finger (proximal and distal hinges, motors of gear 30 and 15) beside a body
on a free hinge with friction loss, no gravity. dm_control's Spin sets the hinge's damping to
0.03 and hides the tip and target sites at every reset; here those model edits are made once,
when the model is built (``edit_spec``).
"""

from __future__ import annotations

import mujoco
import numpy as np
import torch

from robotrl.envs.tasks.base import Sim, View
from robotrl.envs.tasks.dmc import DmcTask, randomize_joints, unactuated


class FingerSpin(DmcTask):
    """Observation: ``position`` (the proximal and distal joint angles, then the spinner's tip
    relative to its hinge, x and z), ``velocity`` (the three joint velocities), ``touch`` (log1p
    of the fingertip's top and bottom touch sensors), all read from sensors. Reward: 1 while the
    spinner turns at 15 rad/s or faster in the negative sense of its hinge, else 0."""

    name = "dmc/finger-spin"
    domain = "finger"
    xml_file = "finger.xml"
    frame_skip = 2  # 0.02 s control over 0.01 s physics; 20 s episodes
    spin_velocity = 15.0  # rad/s: hinge velocity at or below minus this is spinning
    hinge_damping = 0.03  # N m s/rad, dm_control's Spin (the file's 0.5 is replaced)
    max_attempts = 1000  # joint draws before a collision-free start is given up
    view = View(distance=1.2, elevation=-10.0, lookat=(0.0, 0.0, 0.3))

    @classmethod
    def edit_spec(cls, spec: mujoco.MjSpec) -> None:
        spec.joint("hinge").damping[0] = cls.hinge_damping
        for site in ("target", "tip"):
            spec.site(site).rgba[3] = 0.0

    def observe_parts(self, sim: Sim) -> dict[str, torch.Tensor]:
        s = sim.sensordata
        tip = s[:, self.sensor("tip")][:, [0, 2]] - s[:, self.sensor("spinner")][:, [0, 2]]
        joints = [self.sensor(n).start for n in ("proximal", "distal")]
        velocity = [self.sensor(n).start
                    for n in ("proximal_velocity", "distal_velocity", "hinge_velocity")]
        touch = [self.sensor(n).start for n in ("touchtop", "touchbottom")]
        return {"position": torch.cat([s[:, joints], tip], dim=1), "velocity": s[:, velocity],
                "touch": torch.log1p(s[:, touch])}

    def reward(self, sim: Sim) -> torch.Tensor:
        hinge = sim.sensordata[:, self.sensor("hinge_velocity").start]
        return (hinge <= -self.spin_velocity).to(hinge.dtype)

    def initialize(self, data: mujoco.MjData, random: np.random.RandomState) -> None:
        # joint angles drawn again until the finger and the spinner do not touch
        for _ in range(self.max_attempts):
            randomize_joints(self.model, data, random)
            with unactuated(self.model):
                mujoco.mj_forward(self.model, data)
            if data.ncon == 0:
                return
        raise RuntimeError(f"{self.name}: no collision-free state in {self.max_attempts} draws")
