"""dm_control's dog: ``dmc/dog-run`` (a 38-actuator dog running forward at 9 m/s or faster).

The model is dm_control's ``make_model`` for its move tasks: the floor resized to the distance
the target speed covers in an episode (135 m half-width), the ball, target, walls and the two
cameras looking at them removed. Its actuators have activation states (``act``), which
dm_control draws at each reset with the heading and the root's planar velocities.
"""

from __future__ import annotations

import math
from typing import ClassVar

import mujoco
import numpy as np
import torch

from robotrl.envs.tasks.base import Sim, View
from robotrl.envs.tasks.dmc import DmcTask, tolerance, unactuated

TIME_LIMIT = 15.0  # s per episode (1000 control steps of 0.015 s)
MIN_UPRIGHT_COSINE = math.cos(math.radians(30))  # upright reward 1 within 30 degrees of z
STAND_HEIGHT_FRACTION = 0.9  # of the default pose's torso and pelvis heights
ROOT_SPEED_STD = 2.0  # m/s (and rad/s about z): the root's initial velocities, normal
WALLS = ("wall_px", "wall_nx", "wall_py", "wall_ny")
INERTIAL = ("accelerometer", "velocimeter", "gyro")  # at the head
FOOT_FORCES = ("foot_L", "foot_R", "hand_L", "hand_R")  # force sensors at the feet's anchors
TOUCH = ("palm_L", "palm_R", "sole_L", "sole_R")


class DogRun(DmcTask):
    """Observation: ``joint_angles`` and ``joint_velocites`` (the hinges; dm_control's
    spelling), ``torso_pelvis_height`` (z of torso and pelvis), ``z_projection`` (the skull's,
    torso's and pelvis' z axes' world components, 9), ``torso_com_velocity`` (the torso
    subtree's centre-of-mass velocity in the torso's frame), ``inertial_sensors`` (the head's
    accelerometer, velocimeter, gyro), ``foot_forces``, ``touch_sensors``, ``actuator_state``
    (``act``). Reward: the product of torso and pelvis at 0.9 of their default heights or
    higher (gaussian, margin that height), the three z axes within 30 degrees of vertical
    (linear to 0 upside down), the four touch sensors' sum at least the body weight (linear,
    0.9 at 0), and (4 x forward + 1) / 5, forward 1 for the torso-frame forward centre-of-mass
    speed in [9, 18] m/s, linear to 0 a margin of 9 m/s away."""

    name = "dmc/dog-run"
    domain = "dog"
    xml_file = "dog.xml"
    frame_skip = 3  # 0.015 s control over 0.005 s physics
    move_speed: ClassVar[float] = 9.0  # m/s
    view = View(distance=3.0, elevation=-20.0, lookat=(0.0, 0.0, 0.5), track="torso")

    @classmethod
    def edit_spec(cls, spec: mujoco.MjSpec) -> None:
        size = cls.move_speed * TIME_LIMIT  # m, the floor's half-width
        spec.geom("floor").size = [size, size, 0.1]
        spec.delete(spec.body("ball"))
        for name in ("target", *WALLS):
            spec.delete(spec.geom(name))
        for name in ("ball", "head"):
            spec.delete(spec.camera(name))

    def __init__(self, cfg, model: mujoco.MjModel) -> None:
        hinges = np.flatnonzero(model.jnt_type == mujoco.mjtJoint.mjJNT_HINGE)
        self.hinge_qpos = model.jnt_qposadr[hinges].tolist()
        self.hinge_qvel = model.jnt_dofadr[hinges].tolist()
        body = lambda name: mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, name)  # noqa: E731
        self.torso, self.pelvis, self.skull = body("torso"), body("pelvis"), body("skull")
        self.root = int(model.jnt_qposadr[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT,
                                                            "root")])
        self.model = model  # the sensors' columns, which the base's observation probe reads
        self.linvel = self.sensor("torso_linvel")
        self.inertial = self._columns(INERTIAL)
        self.foot_forces = self._columns(FOOT_FORCES)
        self.touch = self._columns(TOUCH)
        super().__init__(cfg, model)
        data = self.scratch  # the default pose, as dm_control measures it at each reset
        mujoco.mj_resetData(model, data)
        with unactuated(model):
            mujoco.mj_forward(model, data)
        self.stand_height = (STAND_HEIGHT_FRACTION * data.xpos[self.torso, 2],
                             STAND_HEIGHT_FRACTION * data.xpos[self.pelvis, 2])  # m
        self.body_weight = float(-model.opt.gravity[2] * model.body_subtreemass[self.torso])  # N

    def _columns(self, names: tuple[str, ...]) -> list[int]:
        """``sensordata`` columns of the named sensors, in that order."""
        return [c for n in names for c in range(*self.sensor(n).indices(10 ** 9))]

    def torso_com_velocity(self, sim: Sim) -> torch.Tensor:
        """[N, 3] the torso subtree's centre-of-mass velocity in the torso's frame."""
        frame = sim.xmat[:, self.torso].reshape(-1, 3, 3)
        return torch.einsum("ni,nij->nj", sim.sensordata[:, self.linvel], frame)

    def observe_parts(self, sim: Sim) -> dict[str, torch.Tensor]:
        bodies = [self.skull, self.torso, self.pelvis]
        return {"joint_angles": sim.qpos[:, self.hinge_qpos],
                "joint_velocites": sim.qvel[:, self.hinge_qvel],
                "torso_pelvis_height": sim.xpos[:, [self.torso, self.pelvis], 2],
                "z_projection": sim.xmat[:, bodies, 6:9].reshape(-1, 9),
                "torso_com_velocity": self.torso_com_velocity(sim),
                "inertial_sensors": sim.sensordata[:, self.inertial],
                "foot_forces": sim.sensordata[:, self.foot_forces],
                "touch_sensors": sim.sensordata[:, self.touch],
                "actuator_state": sim.act}

    def reward(self, sim: Sim) -> torch.Tensor:
        torso_h, pelvis_h = self.stand_height
        torso = tolerance(sim.xpos[:, self.torso, 2], bounds=(torso_h, float("inf")),
                          margin=torso_h)
        pelvis = tolerance(sim.xpos[:, self.pelvis, 2], bounds=(pelvis_h, float("inf")),
                           margin=pelvis_h)
        upright = tolerance(sim.xmat[:, [self.skull, self.torso, self.pelvis], 8],
                            bounds=(MIN_UPRIGHT_COSINE, float("inf")), sigmoid="linear",
                            margin=MIN_UPRIGHT_COSINE + 1, value_at_margin=0)
        touch = tolerance(sim.sensordata[:, self.touch].sum(dim=1),
                          bounds=(self.body_weight, float("inf")), margin=self.body_weight,
                          sigmoid="linear", value_at_margin=0.9)
        forward = tolerance(self.torso_com_velocity(sim)[:, 0],
                            bounds=(self.move_speed, 2 * self.move_speed),
                            margin=max(1.0, self.move_speed), value_at_margin=0,
                            sigmoid="linear")
        return torso * pelvis * upright.prod(dim=1) * touch * (4 * forward + 1) / 5

    def initialize(self, data: mujoco.MjData, random: np.random.RandomState) -> None:
        azimuth = random.uniform(0, 2 * np.pi)  # heading, about z
        data.qpos[self.root + 3:self.root + 7] = (np.cos(azimuth / 2), 0, 0, np.sin(azimuth / 2))
        for dof in (0, 1, 5):  # the root's x, y and yaw velocities
            data.qvel[dof] = ROOT_SPEED_STD * random.randn()
        for i in range(self.model.nu):  # dm_control's dog: one activation per actuator
            data.act[i] = random.uniform(*self.model.actuator_ctrlrange[i])
