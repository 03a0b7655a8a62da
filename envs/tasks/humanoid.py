"""Humanoid, as Gymnasium's ``Humanoid-v5``."""

from __future__ import annotations

import dataclasses
import math

import mujoco
import torch

from robotrl.envs.tasks.base import MujocoTask, Sim, TaskConfig, View


@dataclasses.dataclass
class HumanoidConfig(TaskConfig):
    forward_reward_weight: float = 1.25
    """Weight of the forward (x) velocity of the center of mass."""
    ctrl_cost_weight: float = 0.1
    """Weight of the squared-control cost."""
    contact_cost_weight: float = 5e-7
    """Weight of the squared external contact force cost."""
    contact_cost_range: tuple[float, float] = (-math.inf, 10.0)
    """Clip range of the weighted contact cost (clipped after weighting, as Gymnasium)."""
    healthy_reward: float = 5.0
    """Reward per step while the torso height is in ``healthy_z_range``."""
    terminate_when_unhealthy: bool = True
    """End the episode when the torso height leaves ``healthy_z_range``."""
    healthy_z_range: tuple[float, float] = (1.0, 2.0)
    """Open interval of torso heights (qpos[2]) that counts as healthy."""
    reset_noise_scale: float = 0.01
    """Uniform qpos and qvel noise scale."""
    exclude_current_positions_from_observation: bool = True
    """Leave the torso's x-y position out of the observation."""
    include_cinert_in_observation: bool = True
    """Append ``cinert`` of every body but the world (10 per body)."""
    include_cvel_in_observation: bool = True
    """Append ``cvel`` of every body but the world (6 per body)."""
    include_qfrc_actuator_in_observation: bool = True
    """Append ``qfrc_actuator`` of every dof but the free joint's."""
    include_cfrc_ext_in_observation: bool = True
    """Append ``cfrc_ext`` of every body but the world (6 per body)."""


class Humanoid(MujocoTask):
    name = "humanoid"
    gym_id = "Humanoid-v5"
    xml_file = "humanoid.xml"
    frame_skip = 5
    view = View(distance=4.0, elevation=-20.0, lookat=(0.0, 0.0, 2.0), track="torso")
    config_cls = HumanoidConfig
    needs_cfrc_ext = True
    cfg: HumanoidConfig

    def __init__(self, cfg: HumanoidConfig, model: mujoco.MjModel) -> None:
        super().__init__(cfg, model)
        self.unobserved_qpos = 2 if cfg.exclude_current_positions_from_observation else 0

    @property
    def obs_dim(self) -> int:
        m, cfg = self.model, self.cfg
        dim = super().obs_dim  # the state
        dim += (m.nbody - 1) * 10 * cfg.include_cinert_in_observation
        dim += (m.nbody - 1) * 6 * cfg.include_cvel_in_observation
        dim += (m.nv - 6) * cfg.include_qfrc_actuator_in_observation
        dim += (m.nbody - 1) * 6 * cfg.include_cfrc_ext_in_observation
        return dim

    @property
    def reward_terms(self) -> tuple[str, ...]:
        return ("forward", "healthy", "ctrl", "contact")

    def reset_state(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.cfg.reset_noise_scale
        qpos = self.init_qpos + self.uniform(gen, n, self.model.nq, s)
        qvel = self.init_qvel + self.uniform(gen, n, self.model.nv, s)
        return qpos, qvel

    def _mass_center_xy(self, sim: Sim) -> torch.Tensor:
        """[N, 2]: x-y of the center of mass. Gymnasium's mass_center, sum_b m_b xipos_b /
        sum_b m_b, is MuJoCo's ``subtree_com`` of the world body (same stage, same step), which
        also weighs each world's own masses when they are randomized."""
        return sim.subtree_com[:, 0, :2].clone()  # natively a live view of the simulation

    def before_step(self, sim: Sim) -> torch.Tensor:
        return self._mass_center_xy(sim)

    def observe(self, sim: Sim) -> torch.Tensor:
        cfg = self.cfg
        parts = [sim.qpos[:, self.unobserved_qpos :], sim.qvel]
        if cfg.include_cinert_in_observation:
            parts.append(sim.cinert[:, 1:].flatten(1))
        if cfg.include_cvel_in_observation:
            parts.append(sim.cvel[:, 1:].flatten(1))
        if cfg.include_qfrc_actuator_in_observation:
            parts.append(sim.qfrc_actuator[:, 6:])
        if cfg.include_cfrc_ext_in_observation:
            parts.append(sim.cfrc_ext[:, 1:].flatten(1))
        return torch.cat(parts, dim=1)

    def _healthy(self, sim: Sim) -> torch.Tensor:
        low, high = self.cfg.healthy_z_range
        z = sim.qpos[:, 2]
        return (z > low) & (z < high)

    def rewards(
        self, sim: Sim, before: torch.Tensor, action: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        x_velocity = (self._mass_center_xy(sim)[:, 0] - before[:, 0]) / self.dt
        contact = cfg.contact_cost_weight * sim.cfrc_ext.square().sum(dim=(1, 2))
        contact = contact.clamp(*cfg.contact_cost_range)
        return {
            "forward": cfg.forward_reward_weight * x_velocity,
            "healthy": cfg.healthy_reward * self._healthy(sim).to(torch.float64),
            "ctrl": -cfg.ctrl_cost_weight * action.square().sum(dim=1),
            "contact": -contact,
        }

    def terminated(self, sim: Sim) -> torch.Tensor:
        if not self.cfg.terminate_when_unhealthy:
            return super().terminated(sim)
        return ~self._healthy(sim)
