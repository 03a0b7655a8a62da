"""dm_control's cart-pole: ``dmc/cartpole-balance``, ``dmc/cartpole-swingup`` (one pole,
smooth reward). The model integrates with RK4 (its ``<option integrator="RK4">``), which the
backends step as dm_control's ``Physics.step`` does: ``mj_step``, then ``mj_step1``."""

from __future__ import annotations

from typing import ClassVar

import mujoco
import numpy as np
import torch

from robotrl.envs.tasks.base import Sim, View
from robotrl.envs.tasks.dmc import DmcTask, tolerance


class CartpoleBalance(DmcTask):
    """Observation: ``position`` (the cart's x, then the pole's zz and xz rotation entries:
    cosine and sine of its angle), ``velocity`` (qvel). Reward: upright ((1 + cos) / 2) times
    centred ((1 + gaussian of the cart's x, margin 2 m) / 2) times small control
    ((4 + quadratic, margin 1) / 5) times a slow pole ((1 + gaussian of its angular velocity,
    margin 5 rad/s) / 2).

    Start: balance puts the cart uniform in [-0.1, 0.1] m and the pole within 0.034 rad of
    upright; swing-up puts the cart near 0 and the pole near hanging down (0.01 std); both add
    velocities of 0.01 std."""

    name = "dmc/cartpole-balance"
    domain = "cartpole"
    xml_file = "cartpole.xml"
    frame_skip = 1  # control timestep = physics timestep, 0.01 s; 10 s episodes
    swing_up: ClassVar[bool] = False
    view = View(distance=4.0, elevation=-10.0, lookat=(0.0, 0.0, 1.0), track="cart")

    def __init__(self, cfg, model: mujoco.MjModel) -> None:
        self.poles = slice(2, model.nbody)  # bodies after world and cart
        super().__init__(cfg, model)

    def observe_parts(self, sim: Sim) -> dict[str, torch.Tensor]:
        pole = sim.xmat[:, self.poles]
        return {"position": torch.cat([sim.qpos[:, :1],
                                       pole[:, :, [8, 2]].reshape(sim.num_envs, -1)], dim=1),
                "velocity": sim.qvel}

    def reward(self, sim: Sim) -> torch.Tensor:
        upright = ((sim.xmat[:, self.poles, 8] + 1) / 2).mean(dim=1)
        centered = (1 + tolerance(sim.qpos[:, 0], margin=2)) / 2
        small_control = (4 + tolerance(sim.ctrl[:, 0], margin=1, value_at_margin=0,
                                       sigmoid="quadratic")) / 5
        small_velocity = (1 + tolerance(sim.qvel[:, 1:], margin=5).amin(dim=1)) / 2
        return upright * small_control * small_velocity * centered

    def initialize(self, data: mujoco.MjData, random: np.random.RandomState) -> None:
        nv = self.model.nv
        if self.swing_up:
            data.qpos[0] = 0.01 * random.randn()
            data.qpos[1] = np.pi + 0.01 * random.randn()
            data.qpos[2:] = 0.1 * random.randn(nv - 2)  # further poles (none here)
        else:
            data.qpos[0] = random.uniform(-0.1, 0.1)
            data.qpos[1:] = random.uniform(-0.034, 0.034, nv - 1)
        data.qvel[:] = 0.01 * random.randn(nv)


class CartpoleSwingup(CartpoleBalance):
    name = "dmc/cartpole-swingup"
    swing_up = True
