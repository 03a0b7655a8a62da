"""InvertedPendulum, as Gymnasium's ``InvertedPendulum-v5``."""

from __future__ import annotations

import dataclasses

import torch

from robotrl.envs.tasks.base import MujocoTask, Sim, TaskConfig, View


@dataclasses.dataclass
class InvertedPendulumConfig(TaskConfig):
    healthy_reward: float = 1.0
    """Reward per step while the pole is up (Gymnasium: 1, not configurable there)."""
    max_pole_angle: float = 0.2
    """The episode ends once |hinge angle| (qpos[1], radians) exceeds this."""
    reset_noise_scale: float = 0.01
    """Uniform qpos and qvel noise scale."""


class InvertedPendulum(MujocoTask):
    name = "inverted_pendulum"
    gym_id = "InvertedPendulum-v5"
    xml_file = "inverted_pendulum.xml"
    frame_skip = 2
    view = View(distance=2.04)
    config_cls = InvertedPendulumConfig
    cfg: InvertedPendulumConfig

    @property
    def obs_dim(self) -> int:
        return self.model.nq + self.model.nv

    @property
    def reward_terms(self) -> tuple[str, ...]:
        return ("healthy",)

    def reset_state(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.cfg.reset_noise_scale
        qpos = self.init_qpos + self.uniform(gen, n, self.model.nq, s)
        qvel = self.init_qvel + self.uniform(gen, n, self.model.nv, s)
        return qpos, qvel

    def observe(self, sim: Sim) -> torch.Tensor:
        return torch.cat([sim.qpos, sim.qvel], dim=1)

    def rewards(self, sim: Sim, before: None, action: torch.Tensor) -> dict[str, torch.Tensor]:
        # Gymnasium pays the survival reward only on steps that do not terminate
        alive = (~self.terminated(sim)).to(torch.float64)
        return {"healthy": self.cfg.healthy_reward * alive}

    has_success = True

    def success(self, sim: Sim) -> torch.Tensor:
        """Success: the pole is still up (the episode has not terminated); at the last step:
        the pole stayed up until the time limit."""
        return ~self.terminated(sim)

    def terminated(self, sim: Sim) -> torch.Tensor:
        finite = torch.isfinite(sim.qpos).all(dim=1) & torch.isfinite(sim.qvel).all(dim=1)
        return ~finite | (sim.qpos[:, 1].abs() > self.cfg.max_pole_angle)
