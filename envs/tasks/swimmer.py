"""Swimmer, as Gymnasium's ``Swimmer-v5``."""

from __future__ import annotations

import dataclasses

import torch

from robotrl.envs.tasks.base import MujocoTask, Sim, TaskConfig, View


@dataclasses.dataclass
class SwimmerConfig(TaskConfig):
    forward_reward_weight: float = 1.0
    """Weight of the forward (x) velocity reward."""
    ctrl_cost_weight: float = 1e-4
    """Weight of the squared-action cost."""
    reset_noise_scale: float = 0.1
    """Uniform qpos and qvel noise scale."""


class Swimmer(MujocoTask):
    name = "swimmer"
    gym_id = "Swimmer-v5"
    xml_file = "swimmer.xml"
    frame_skip = 4
    unobserved_qpos = 2  # the planar (x, y) position of the front tip
    view = View(distance=4.0, elevation=-60.0, track="torso")
    config_cls = SwimmerConfig
    cfg: SwimmerConfig

    @property
    def reward_terms(self) -> tuple[str, ...]:
        return ("forward", "ctrl")

    def reset_state(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.cfg.reset_noise_scale
        qpos = self.init_qpos + self.uniform(gen, n, self.model.nq, s)
        qvel = self.init_qvel + self.uniform(gen, n, self.model.nv, s)
        return qpos, qvel

    def before_step(self, sim: Sim) -> torch.Tensor:
        return sim.qpos[:, 0].clone()

    def observe(self, sim: Sim) -> torch.Tensor:
        return torch.cat([sim.qpos[:, self.unobserved_qpos :], sim.qvel], dim=1)

    def rewards(
        self, sim: Sim, before: torch.Tensor, action: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        x_velocity = (sim.qpos[:, 0] - before) / self.dt
        return {
            "forward": self.cfg.forward_reward_weight * x_velocity,
            "ctrl": -self.cfg.ctrl_cost_weight * action.square().sum(dim=1),
        }
