"""dm_control's quadruped: ``dmc/quadruped-walk``, ``dmc/quadruped-run``.

The model is dm_control's ``make_model`` for these tasks: the floor resized to the distance the
target speed covers in an episode, the walls, ball, target, terrain geom and rangefinders (of
its fetch and escape tasks) removed. Each episode starts from a uniformly random orientation,
dropped at the lowest height, in 1 cm steps up from the floor, where nothing touches.
"""

from __future__ import annotations

from typing import ClassVar

import mujoco
import numpy as np
import torch

from robotrl.envs.tasks.base import Sim, View
from robotrl.envs.tasks.dmc import DmcTask, tolerance, unactuated

TIME_LIMIT = 20.0  # s per episode (1000 control steps of 0.02 s)
WALLS = ("wall_px", "wall_py", "wall_nx", "wall_ny")
HEIGHT_STEP = 0.01  # m, the rise between tries of the drop height
MAX_TRIES = 10_000  # drop heights tried before dm_control gives up


class QuadrupedWalk(DmcTask):
    """Observation: ``egocentric_state`` (the 12 hinges' positions and velocities, then the 12
    actuators' filter states), ``torso_velocity`` (the torso's velocimeter, local frame),
    ``torso_upright`` (z of the torso's z axis), ``imu`` (accelerometer then gyro, at the
    torso), ``force_torque`` (arcsinh of the toes' force then torque sensors). Reward: upright
    (1 upright, linear to 0 upside down) times moving forward in the torso's frame at
    ``desired_speed`` or faster (linear, 0.5 at rest)."""

    name = "dmc/quadruped-walk"
    camera = 2  # "y": the pixel benchmarks' quadruped view (DrQ's camera_id 2)
    domain = "quadruped"
    xml_file = "quadruped.xml"
    frame_skip = 4  # 0.02 s control over 0.005 s physics
    desired_speed: ClassVar[float] = 0.5  # m/s
    view = View(distance=4.0, elevation=-20.0, lookat=(0.0, 0.0, 0.5), track="torso")

    @classmethod
    def edit_spec(cls, spec: mujoco.MjSpec) -> None:
        size = TIME_LIMIT * cls.desired_speed  # m, the floor's half-width
        spec.geom("floor").size = [size, size, 0.5]
        for name in (*WALLS, "terrain"):
            spec.delete(spec.geom(name))
        spec.delete(spec.body("ball"))
        spec.delete(spec.site("target"))
        for sensor in [s for s in spec.sensors
                       if s.type == mujoco.mjtSensor.mjSENS_RANGEFINDER]:
            spec.delete(sensor)

    def __init__(self, cfg, model: mujoco.MjModel) -> None:
        self.torso = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "torso")
        hinges = np.flatnonzero(model.jnt_type == mujoco.mjtJoint.mjJNT_HINGE)
        self.hinge_qpos = model.jnt_qposadr[hinges].tolist()
        self.hinge_qvel = model.jnt_dofadr[hinges].tolist()
        self.root = int(model.jnt_qposadr[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT,
                                                            "root")])
        types = mujoco.mjtSensor
        self.imu_cols = self._columns(model, (types.mjSENS_GYRO, types.mjSENS_ACCELEROMETER))
        self.force_cols = self._columns(model, (types.mjSENS_FORCE, types.mjSENS_TORQUE))
        self.velocimeter = self._columns(model, (types.mjSENS_VELOCIMETER,))
        super().__init__(cfg, model)

    @staticmethod
    def _columns(model: mujoco.MjModel, types: tuple[int, ...]) -> list[int]:
        """``sensordata`` columns of the sensors of these types, in sensor order."""
        ids = np.flatnonzero(np.isin(model.sensor_type, [int(t) for t in types]))
        return [int(model.sensor_adr[i]) + k for i in ids for k in range(model.sensor_dim[i])]

    def observe_parts(self, sim: Sim) -> dict[str, torch.Tensor]:
        return {"egocentric_state": torch.cat([sim.qpos[:, self.hinge_qpos],
                                               sim.qvel[:, self.hinge_qvel], sim.act], dim=1),
                "torso_velocity": sim.sensordata[:, self.velocimeter],
                "torso_upright": sim.xmat[:, self.torso, 8:9],
                "imu": sim.sensordata[:, self.imu_cols],
                "force_torque": torch.asinh(sim.sensordata[:, self.force_cols])}

    def reward(self, sim: Sim) -> torch.Tensor:
        upright = tolerance(sim.xmat[:, self.torso, 8], bounds=(1.0, float("inf")),
                            sigmoid="linear", margin=2.0, value_at_margin=0)
        speed = sim.sensordata[:, self.velocimeter[0]]
        move = tolerance(speed, bounds=(self.desired_speed, float("inf")),
                         margin=self.desired_speed, value_at_margin=0.5, sigmoid="linear")
        return upright * move

    def initialize(self, data: mujoco.MjData, random: np.random.RandomState) -> None:
        orientation = random.randn(4)
        orientation /= np.linalg.norm(orientation)
        z, tries = 0.0, 0  # from inside the floor up, until no contact
        while True:
            mujoco.mj_resetData(self.model, data)
            data.qpos[self.root:self.root + 3] = 0.0, 0.0, z
            data.qpos[self.root + 3:self.root + 7] = orientation
            with unactuated(self.model):
                mujoco.mj_forward(self.model, data)
            z += HEIGHT_STEP
            tries += 1
            if tries > MAX_TRIES:
                raise RuntimeError(f"{self.name}: no contact-free drop height found")
            if data.ncon == 0:
                return


class QuadrupedRun(QuadrupedWalk):
    name = "dmc/quadruped-run"
    desired_speed = 5.0  # m/s
