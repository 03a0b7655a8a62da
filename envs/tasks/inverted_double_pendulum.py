"""InvertedDoublePendulum, as Gymnasium's ``InvertedDoublePendulum-v5``."""

from __future__ import annotations

import dataclasses

import torch

from robotrl.envs.tasks.base import MujocoTask, Sim, TaskConfig, View


@dataclasses.dataclass
class InvertedDoublePendulumConfig(TaskConfig):
    healthy_reward: float = 10.0
    """Reward per step while the tip is above ``min_tip_height``."""
    distance_x_weight: float = 0.01
    """Weight of the squared tip x offset."""
    distance_z_weight: float = 1.0
    """Weight of the squared tip height error to ``target_tip_height``."""
    target_tip_height: float = 2.0
    """Tip height the distance penalty pulls toward."""
    velocity_weights: tuple[float, float] = (1e-3, 5e-3)
    """Weights of the squared angular velocities of the first and second pole."""
    min_tip_height: float = 1.0
    """The episode ends once the tip height is at or below this."""
    reset_noise_scale: float = 0.1
    """Uniform qpos noise and normal qvel noise scale."""


class InvertedDoublePendulum(MujocoTask):
    name = "inverted_double_pendulum"
    gym_id = "InvertedDoublePendulum-v5"
    xml_file = "inverted_double_pendulum.xml"
    frame_skip = 5
    view = View(distance=4.1225, lookat=(0.0, 0.0, 0.1225))
    config_cls = InvertedDoublePendulumConfig
    cfg: InvertedDoublePendulumConfig

    @property
    def obs_dim(self) -> int:
        # cart position, sin and cos of the hinge angles, qvel, first constraint force
        return 1 + 2 * (self.model.nq - 1) + self.model.nv + 1

    @property
    def reward_terms(self) -> tuple[str, ...]:
        return ("healthy", "distance", "velocity")

    def reset_state(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.cfg.reset_noise_scale
        qpos = self.init_qpos + self.uniform(gen, n, self.model.nq, s)
        qvel = self.init_qvel + self.normal(gen, n, self.model.nv, s)
        return qpos, qvel

    def observe(self, sim: Sim) -> torch.Tensor:
        angles = sim.qpos[:, 1:]
        return torch.cat(
            [
                sim.qpos[:, :1],
                angles.sin(),
                angles.cos(),
                sim.qvel.clamp(-10.0, 10.0),
                sim.qfrc_constraint[:, :1].clamp(-10.0, 10.0),
            ],
            dim=1,
        )

    def rewards(self, sim: Sim, before: None, action: torch.Tensor) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        tip = sim.site_xpos[:, 0]  # the site at the tip of the second pole
        x, z = tip[:, 0], tip[:, 2]
        w1, w2 = cfg.velocity_weights
        alive = (z > cfg.min_tip_height).to(torch.float64)
        distance = (
            cfg.distance_x_weight * x.square()
            + cfg.distance_z_weight * (z - cfg.target_tip_height).square()
        )
        velocity = w1 * sim.qvel[:, 1].square() + w2 * sim.qvel[:, 2].square()
        return {"healthy": cfg.healthy_reward * alive, "distance": -distance, "velocity": -velocity}

    has_success = True

    def success(self, sim: Sim) -> torch.Tensor:
        """Success: the tip is still above ``min_tip_height`` (not terminated); at the
        last step: the poles stayed up until the time limit."""
        return ~self.terminated(sim)

    def terminated(self, sim: Sim) -> torch.Tensor:
        return sim.site_xpos[:, 0, 2] <= self.cfg.min_tip_height
