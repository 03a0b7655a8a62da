"""Reacher, as Gymnasium's ``Reacher-v5``."""

from __future__ import annotations

import dataclasses

import mujoco
import torch

from robotrl.envs.tasks.base import MujocoTask, Sim, TaskConfig


@dataclasses.dataclass
class ReacherConfig(TaskConfig):
    reward_dist_weight: float = 1.0
    """Weight of the fingertip-to-target distance cost."""
    reward_control_weight: float = 1.0
    """Weight of the squared-action cost."""
    reset_noise_scale: float = 0.1
    """Uniform noise scale of the arm's initial joint angles."""
    reset_qvel_noise_scale: float = 5e-3
    """Uniform noise scale of the arm's initial joint velocities."""
    goal_radius: float = 0.2
    """Targets are drawn uniformly from the open disc of this radius."""
    max_episode_steps: int = 50
    """Steps before truncation (``Reacher-v5`` registers 50)."""
    success_distance: float = 0.02
    """Success: the fingertip is within this distance (m) of the target; 0.02 is about where
    the fingertip sphere (radius 0.01) touches the target sphere (radius 0.009). Not part of
    Gymnasium's task."""


class Reacher(MujocoTask):
    name = "reacher"
    gym_id = "Reacher-v5"
    xml_file = "reacher.xml"
    frame_skip = 2
    config_cls = ReacherConfig
    cfg: ReacherConfig

    max_goal_tries: int = 1000
    """Rejection-sampling rounds before giving up (each keeps a row with probability pi/4)."""

    def __init__(self, cfg: ReacherConfig, model: mujoco.MjModel) -> None:
        super().__init__(cfg, model)
        self.fingertip_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "fingertip")
        self.target_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "target")

    @property
    def obs_dim(self) -> int:
        # cos and sin of the 2 arm angles, target (x, y), arm velocities, fingertip - target (x, y)
        return 10

    @property
    def reward_terms(self) -> tuple[str, ...]:
        return ("dist", "ctrl")

    def sample_goal(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """[n, 2] float64 uniform in the open disc of radius ``goal_radius``.

        Rejection sampling from the square as Gymnasium does, redrawing only the rejected rows.
        """
        r = self.cfg.goal_radius
        goal = self.uniform(gen, n, 2, r)
        for _ in range(self.max_goal_tries):
            rejected = (goal.norm(dim=1) >= r).nonzero().flatten()
            if rejected.numel() == 0:
                return goal
            goal[rejected] = self.uniform(gen, rejected.numel(), 2, r)
        raise RuntimeError(f"no goal inside radius {r} after {self.max_goal_tries} tries")

    def reset_state(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        qpos = self.init_qpos + self.uniform(gen, n, self.model.nq, self.cfg.reset_noise_scale)
        qpos[:, -2:] = self.sample_goal(n, gen)
        qvel = self.init_qvel + self.uniform(gen, n, self.model.nv, self.cfg.reset_qvel_noise_scale)
        qvel[:, -2:] = 0.0  # the target does not move
        return qpos, qvel

    def fingertip_to_target(self, sim: Sim) -> torch.Tensor:
        """[N, 3] fingertip minus target body positions (Gymnasium's ``get_body_com``: xpos)."""
        return sim.xpos[:, self.fingertip_id] - sim.xpos[:, self.target_id]

    def observe(self, sim: Sim) -> torch.Tensor:
        theta = sim.qpos[:, :2]
        return torch.cat(
            [
                theta.cos(),
                theta.sin(),
                sim.qpos[:, 2:],
                sim.qvel[:, :2],
                self.fingertip_to_target(sim)[:, :2],
            ],
            dim=1,
        )

    has_success = True

    def success(self, sim: Sim) -> torch.Tensor:
        """The fingertip is within ``success_distance`` of the target (3-D distance, the one
        the reward penalizes); at the last step, the arm ended on the target."""
        return self.fingertip_to_target(sim).norm(dim=1) < self.cfg.success_distance

    def rewards(self, sim: Sim, before: None, action: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            "dist": -self.cfg.reward_dist_weight * self.fingertip_to_target(sim).norm(dim=1),
            "ctrl": -self.cfg.reward_control_weight * action.square().sum(dim=1),
        }
