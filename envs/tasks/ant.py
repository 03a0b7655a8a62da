"""Ant, as Gymnasium's ``Ant-v5``."""

from __future__ import annotations

import dataclasses

import mujoco
import torch

from robotrl.envs.tasks.base import MujocoTask, Sim, TaskConfig, View


@dataclasses.dataclass
class AntConfig(TaskConfig):
    forward_reward_weight: float = 1.0
    """Weight of the forward (x) velocity reward."""
    ctrl_cost_weight: float = 0.5
    """Weight of the squared-action cost."""
    contact_cost_weight: float = 5e-4
    """Weight of the squared (clipped) external contact force cost."""
    healthy_reward: float = 1.0
    """Reward per step while the torso height is in ``healthy_z_range``."""
    main_body: int | str = 1
    """Body (id or name) whose x-y displacement gives the velocity reward."""
    terminate_when_unhealthy: bool = True
    """End the episode when the state leaves the healthy set."""
    healthy_z_range: tuple[float, float] = (0.2, 1.0)
    """Closed interval of torso heights (qpos[2]) that counts as healthy."""
    contact_force_range: tuple[float, float] = (-1.0, 1.0)
    """Clip range of ``cfrc_ext`` entries, in the observation and the contact cost."""
    reset_noise_scale: float = 0.1
    """Uniform qpos noise and normal qvel noise scale."""
    exclude_current_positions_from_observation: bool = True
    """Leave the torso's x-y position out of the observation."""
    include_cfrc_ext_in_observation: bool = True
    """Append the clipped external contact forces of every body but the world."""


class Ant(MujocoTask):
    name = "ant"
    gym_id = "Ant-v5"
    xml_file = "ant.xml"
    frame_skip = 5
    view = View(distance=4.0, track="torso")
    config_cls = AntConfig
    needs_cfrc_ext = True
    cfg: AntConfig

    def __init__(self, cfg: AntConfig, model: mujoco.MjModel) -> None:
        super().__init__(cfg, model)
        body = cfg.main_body
        if isinstance(body, str):
            body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, body)
            if body < 0:
                raise ValueError(f"main_body {cfg.main_body!r} is not a body of {self.xml_file}")
        self._body = int(body)
        self.unobserved_qpos = 2 if cfg.exclude_current_positions_from_observation else 0

    @property
    def obs_dim(self) -> int:
        dim = super().obs_dim  # the state
        if self.cfg.include_cfrc_ext_in_observation:
            dim += (self.model.nbody - 1) * 6
        return dim

    @property
    def reward_terms(self) -> tuple[str, ...]:
        return ("forward", "healthy", "ctrl", "contact")

    def reset_state(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.cfg.reset_noise_scale
        qpos = self.init_qpos + self.uniform(gen, n, self.model.nq, s)
        qvel = self.init_qvel + self.normal(gen, n, self.model.nv, s)
        return qpos, qvel

    def before_step(self, sim: Sim) -> torch.Tensor:
        return sim.xpos[:, self._body, :2].clone()

    def _contact_forces(self, sim: Sim) -> torch.Tensor:
        """[N, nbody, 6]: ``cfrc_ext`` clipped to ``contact_force_range``."""
        low, high = self.cfg.contact_force_range
        return sim.cfrc_ext.clamp(low, high)

    def observe(self, sim: Sim) -> torch.Tensor:
        parts = [sim.qpos[:, self.unobserved_qpos :], sim.qvel]
        if self.cfg.include_cfrc_ext_in_observation:
            parts.append(self._contact_forces(sim)[:, 1:].flatten(1))
        return torch.cat(parts, dim=1)

    def _healthy(self, sim: Sim) -> torch.Tensor:
        low, high = self.cfg.healthy_z_range
        z = sim.qpos[:, 2]
        finite = torch.isfinite(sim.qpos).all(dim=1) & torch.isfinite(sim.qvel).all(dim=1)
        return finite & (z >= low) & (z <= high)

    def rewards(
        self, sim: Sim, before: torch.Tensor, action: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        x_velocity = (sim.xpos[:, self._body, 0] - before[:, 0]) / self.dt
        cfg = self.cfg
        return {
            "forward": cfg.forward_reward_weight * x_velocity,
            "healthy": cfg.healthy_reward * self._healthy(sim).to(torch.float64),
            "ctrl": -cfg.ctrl_cost_weight * action.square().sum(dim=1),
            "contact": -cfg.contact_cost_weight
            * self._contact_forces(sim).square().sum(dim=(1, 2)),
        }

    def terminated(self, sim: Sim) -> torch.Tensor:
        if not self.cfg.terminate_when_unhealthy:
            return super().terminated(sim)
        return ~self._healthy(sim)
