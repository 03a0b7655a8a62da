"""Goal-conditioned Reacher: Gymnasium's two-link arm, told where to put its fingertip.

The model, reset distribution and goal distribution are ``Reacher-v5``'s (targets uniform in the
disc of radius ``goal_radius``, kept in the target body's two slide joints, so snapshots carry
the goal). What changes is the interface goal-conditioned RL expects (JaxGCRL's reacher, Bortkiewicz
et al. 2024): the observation names the achieved coordinates and the goal apart,

    [cos q (2), sin q (2), qdot (2), fingertip (x, y) (2), goal (x, y) (2)]      [N, 10]

so hindsight relabelling can replace the goal with a fingertip position reached later
(``spec.goal``: goal columns 8-9, achieved columns 6-7), and the reward is sparse: 1 while the
fingertip is within ``success_distance`` of the goal (``info["success"]``; an episode succeeds if
it holds at its last step; ``info["goal_distance"]`` every step).
"""

from __future__ import annotations

import dataclasses

import torch

from robotrl.envs.tasks.base import GoalTask, Sim
from robotrl.envs.tasks.reacher import Reacher, ReacherConfig


@dataclasses.dataclass
class ReacherGoalConfig(ReacherConfig):
    success_distance: float = 0.05
    """The goal counts as reached with the fingertip's planar (x, y) within this distance (m)
    of it (JaxGCRL's reacher threshold; the arm spans 0.21 m)."""


class ReacherGoal(GoalTask, Reacher):
    name = "reacher_goal"
    gym_id = "robotrl/ReacherGoal"
    config_cls = ReacherGoalConfig
    cfg: ReacherGoalConfig
    achieved_columns = (6, 7)
    goal_columns = (8, 9)

    @property
    def obs_dim(self) -> int:
        return 10

    @property
    def reward_terms(self) -> tuple[str, ...]:
        return ("success",)

    def observe(self, sim: Sim) -> torch.Tensor:
        theta = sim.qpos[:, :2]
        tip = sim.xpos[:, self.fingertip_id, :2]
        goal = sim.xpos[:, self.target_id, :2]
        return torch.cat([theta.cos(), theta.sin(), sim.qvel[:, :2], tip, goal], dim=1)

    def goal_distance(self, sim: Sim) -> torch.Tensor:
        return self.fingertip_to_target(sim)[:, :2].norm(dim=1)

    def rewards(self, sim: Sim, before: None, action: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"success": self.success(sim).double()}
