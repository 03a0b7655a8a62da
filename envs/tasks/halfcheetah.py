"""HalfCheetah, as Gymnasium's ``HalfCheetah-v5``."""

from __future__ import annotations

import dataclasses

import torch

from robotrl.envs.tasks.base import MujocoTask, Sim, TaskConfig, View


@dataclasses.dataclass
class HalfCheetahConfig(TaskConfig):
    forward_reward_weight: float = 1.0
    """Weight of the forward velocity reward."""
    ctrl_cost_weight: float = 0.1
    """Weight of the squared-action cost."""
    reset_noise_scale: float = 0.1
    """Uniform qpos noise and normal qvel noise scale."""


class HalfCheetah(MujocoTask):
    name = "halfcheetah"
    gym_id = "HalfCheetah-v5"
    xml_file = "half_cheetah.xml"
    frame_skip = 5
    unobserved_qpos = 1  # the root's x
    view = View(distance=4.0, track="torso")
    config_cls = HalfCheetahConfig
    cfg: HalfCheetahConfig

    @property
    def reward_terms(self) -> tuple[str, ...]:
        return ("forward", "ctrl")

    def reset_state(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.cfg.reset_noise_scale
        qpos = self.init_qpos + self.uniform(gen, n, self.model.nq, s)
        qvel = self.init_qvel + self.normal(gen, n, self.model.nv, s)
        return qpos, qvel

    def before_step(self, sim: Sim) -> torch.Tensor:
        return sim.qpos[:, 0].clone()

    def observe(self, sim: Sim) -> torch.Tensor:
        return torch.cat([sim.qpos[:, self.unobserved_qpos :], sim.qvel], dim=1)

    def rewards(self, sim: Sim, before: torch.Tensor, action: torch.Tensor) -> dict[str, torch.Tensor]:
        x_velocity = (sim.qpos[:, 0] - before) / self.dt
        return {
            "forward": self.cfg.forward_reward_weight * x_velocity,
            "ctrl": -self.cfg.ctrl_cost_weight * action.square().sum(dim=1),
        }
