"""Goal-conditioned Pusher: Gymnasium's ``Pusher-v5`` arm, told where to push the cylinder.

The model, frame skip, arm reset noise and observation are ``Pusher-v5``'s,

    [arm qpos (7), arm qvel (7), arm tip (x, y, z), object (x, y, z), goal (x, y, z)]   [N, 23]

(body frame positions, as Gymnasium's ``get_body_com``). What changes is what goal-conditioned RL
needs (JaxGCRL's "easy" pusher, Bortkiewicz et al. 2024): the goal is drawn per episode instead
of fixed, and the reward is sparse: 1 while the object's (x, y) is within ``success_distance``
of the goal's (``spec.goal``: goal columns 20-21, achieved columns 17-18; the bodies' heights
differ by a constant, so only the plane counts). Object and goal positions are their slide
joints' (y, x) displacements (the MJCF's joint order, as Pusher-v5 samples them): the object's
uniform in [-0.3, 0] x [-0.2, 0.2], the goal's in ``goal_y_range`` x [-0.2, 0.2], redrawn until
they are ``min_separation`` apart. The goal lives in its slide joints, so snapshots carry it.
"""

from __future__ import annotations

import dataclasses

import mujoco
import torch

from robotrl.envs.tasks.base import GoalTask, Sim, TaskConfig, View


@dataclasses.dataclass
class PusherGoalConfig(TaskConfig):
    max_episode_steps: int = 100
    """Steps before truncation (Pusher-v5's)."""
    success_distance: float = 0.1
    """The goal counts as reached with the object's (x, y) within this distance (m) of it."""
    goal_y_range: tuple[float, float] = (-0.55, -0.25)
    """Goal y displacement range (JaxGCRL's easy pusher; the object's is [-0.3, 0])."""
    min_separation: float = 0.17
    """Object and goal start at least this far apart (Pusher-v5's rejection distance)."""


class PusherGoal(GoalTask):
    name = "pusher_goal"
    gym_id = "robotrl/PusherGoal"
    xml_file = "pusher_v5.xml"
    frame_skip = 5
    view = View(distance=4.0)
    config_cls = PusherGoalConfig
    cfg: PusherGoalConfig
    achieved_columns = (17, 18)
    goal_columns = (20, 21)

    def __init__(self, cfg: PusherGoalConfig, model: mujoco.MjModel) -> None:
        super().__init__(cfg, model)
        self.bodies = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, b)
                       for b in ("tips_arm", "object", "goal")]

    @property
    def obs_dim(self) -> int:
        return 23

    @property
    def reward_terms(self) -> tuple[str, ...]:
        return ("success",)

    def sample_positions(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(object [n, 2], goal [n, 2]) float64 (y, x) slide-joint displacements,
        ``min_separation`` apart (rejection per row)."""
        low, high = self.cfg.goal_y_range

        def draw(k: int) -> tuple[torch.Tensor, torch.Tensor]:
            u = torch.rand(k, 4, generator=gen, dtype=torch.float64)
            obj = torch.stack([-0.3 * u[:, 0], 0.4 * u[:, 1] - 0.2], dim=1)
            goal = torch.stack([low + (high - low) * u[:, 2], 0.4 * u[:, 3] - 0.2], dim=1)
            return obj, goal

        obj, goal = draw(n)
        for _ in range(1000):
            bad = ((obj - goal).norm(dim=1) <= self.cfg.min_separation).nonzero().flatten()
            if bad.numel() == 0:
                return obj, goal
            obj[bad], goal[bad] = draw(bad.numel())
        raise RuntimeError("could not place object and goal apart; lower min_separation")

    def reset_state(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        qpos = self.init_qpos.expand(n, -1).clone()
        qpos[:, -4:-2], qpos[:, -2:] = self.sample_positions(n, gen)
        qvel = self.init_qvel + self.uniform(gen, n, self.model.nv, 0.005)
        qvel[:, -4:] = 0.0
        return qpos, qvel

    def observe(self, sim: Sim) -> torch.Tensor:
        com = sim.xpos[:, self.bodies].flatten(1)
        return torch.cat([sim.qpos[:, :7], sim.qvel[:, :7], com], dim=1)

    def goal_distance(self, sim: Sim) -> torch.Tensor:
        com = sim.xpos
        return (com[:, self.bodies[1], :2] - com[:, self.bodies[2], :2]).norm(dim=1)

    def rewards(self, sim: Sim, before: None, action: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"success": self.success(sim).double()}
