"""Hopper, as Gymnasium's ``Hopper-v5``."""

from __future__ import annotations

import dataclasses

import torch

from robotrl.envs.tasks.base import MujocoTask, Sim, TaskConfig, View


@dataclasses.dataclass
class HopperConfig(TaskConfig):
    forward_reward_weight: float = 1.0
    """Weight of the forward velocity reward."""
    ctrl_cost_weight: float = 1e-3
    """Weight of the squared-action cost."""
    healthy_reward: float = 1.0
    """Reward per step while healthy."""
    terminate_when_unhealthy: bool = True
    """End the episode when the hopper leaves the healthy ranges."""
    healthy_state_range: tuple[float, float] = (-100.0, 100.0)
    """Open range every entry of qpos[2:] and qvel must lie in for a healthy state."""
    healthy_z_range: tuple[float, float] = (0.7, float("inf"))
    """Open range of the torso height for a healthy state."""
    healthy_angle_range: tuple[float, float] = (-0.2, 0.2)
    """Open range of the torso angle for a healthy state."""
    reset_noise_scale: float = 5e-3
    """Uniform qpos and qvel noise scale."""


class Hopper(MujocoTask):
    name = "hopper"
    gym_id = "Hopper-v5"
    xml_file = "hopper.xml"
    frame_skip = 4
    unobserved_qpos = 1  # the root's x
    view = View(distance=3.0, elevation=-20.0, lookat=(0.0, 0.0, 1.15), track="torso")
    config_cls = HopperConfig
    cfg: HopperConfig

    @property
    def reward_terms(self) -> tuple[str, ...]:
        return ("forward", "healthy", "ctrl")

    def reset_state(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.cfg.reset_noise_scale
        qpos = self.init_qpos + self.uniform(gen, n, self.model.nq, s)
        qvel = self.init_qvel + self.uniform(gen, n, self.model.nv, s)
        return qpos, qvel

    def before_step(self, sim: Sim) -> torch.Tensor:
        return sim.qpos[:, 0].clone()

    def observe(self, sim: Sim) -> torch.Tensor:
        qpos = sim.qpos[:, self.unobserved_qpos :]
        return torch.cat([qpos, sim.qvel.clamp(-10.0, 10.0)], dim=1)

    def is_healthy(self, sim: Sim) -> torch.Tensor:
        """[N] bool: state, height and angle inside their (open) healthy ranges."""
        min_state, max_state = self.cfg.healthy_state_range
        min_z, max_z = self.cfg.healthy_z_range
        min_angle, max_angle = self.cfg.healthy_angle_range
        z, angle = sim.qpos[:, 1], sim.qpos[:, 2]
        state = torch.cat([sim.qpos[:, 2:], sim.qvel], dim=1)
        healthy_state = ((min_state < state) & (state < max_state)).all(dim=1)
        healthy_z = (min_z < z) & (z < max_z)
        healthy_angle = (min_angle < angle) & (angle < max_angle)
        return healthy_state & healthy_z & healthy_angle

    def rewards(
        self, sim: Sim, before: torch.Tensor, action: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        x_velocity = (sim.qpos[:, 0] - before) / self.dt
        return {
            "forward": self.cfg.forward_reward_weight * x_velocity,
            # v5 pays the healthy reward only while healthy, whether or not it terminates
            "healthy": self.is_healthy(sim).to(torch.float64) * self.cfg.healthy_reward,
            "ctrl": -self.cfg.ctrl_cost_weight * action.square().sum(dim=1),
        }

    def terminated(self, sim: Sim) -> torch.Tensor:
        unhealthy = ~self.is_healthy(sim)
        return unhealthy if self.cfg.terminate_when_unhealthy else torch.zeros_like(unhealthy)
