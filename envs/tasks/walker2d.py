"""Walker2d, as Gymnasium's ``Walker2d-v5``."""

from __future__ import annotations

import dataclasses

import torch

from robotrl.envs.tasks.base import Sim, TaskConfig, View
from robotrl.envs.tasks.hopper import Hopper


@dataclasses.dataclass
class Walker2dConfig(TaskConfig):
    forward_reward_weight: float = 1.0
    """Weight of the forward velocity reward."""
    ctrl_cost_weight: float = 1e-3
    """Weight of the squared-action cost."""
    healthy_reward: float = 1.0
    """Reward per step while healthy."""
    terminate_when_unhealthy: bool = True
    """End the episode when the walker leaves the healthy ranges."""
    healthy_z_range: tuple[float, float] = (0.8, 2.0)
    """Open range of the torso height for a healthy state."""
    healthy_angle_range: tuple[float, float] = (-1.0, 1.0)
    """Open range of the torso angle for a healthy state."""
    reset_noise_scale: float = 5e-3
    """Uniform qpos and qvel noise scale."""


class Walker2d(Hopper):
    """Hopper's observation, reward terms, reset and termination; its own health check."""

    name = "walker2d"
    gym_id = "Walker2d-v5"
    # v5 model: both feet have friction 1.9 (walker2d.xml, used up to v4, gives the right 0.9)
    xml_file = "walker2d_v5.xml"
    frame_skip = 4
    view = View(distance=4.0, elevation=-20.0, lookat=(0.0, 0.0, 1.15), track="torso")
    config_cls = Walker2dConfig
    cfg: Walker2dConfig

    def is_healthy(self, sim: Sim) -> torch.Tensor:
        """[N] bool: torso height and angle inside their (open) healthy ranges."""
        min_z, max_z = self.cfg.healthy_z_range
        min_angle, max_angle = self.cfg.healthy_angle_range
        z, angle = sim.qpos[:, 1], sim.qpos[:, 2]
        healthy_z = (min_z < z) & (z < max_z)
        healthy_angle = (min_angle < angle) & (angle < max_angle)
        return healthy_z & healthy_angle
