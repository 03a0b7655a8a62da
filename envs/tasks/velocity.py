"""Velocity tracking for legged robots: follow commanded (vx, vy, yaw rate) on flat ground.

The task of mjlab's ``tasks/velocity``, MuJoCo Playground's Go1 joystick and legged_gym, written
once for any robot of ``robotrl.envs.robots`` (the robot is configuration: ``Go1Velocity`` and
``G1Velocity`` below differ only in the robot's name). Physics at 200 Hz, control at 50 Hz.

* **Action**: one number per joint; the joint's servo target is ``default_pose + action_scale *
  action`` (minus the world's encoder bias, see below), with actions clipped to
  ``[-action_limit, action_limit]``.
* **Commands**: (vx, vy) in m/s in the body frame and a yaw rate in rad/s, drawn uniformly from
  the config's ranges every 3-8 s; a ``standing_fraction`` of draws are zero. With
  ``command_grid`` every world ``i`` holds ``command_grid[i % len]`` (the evaluation grid).
* **Observation** ``policy`` (what the robot measures): projected gravity (3), body angular
  velocity (3), command (3), joint angles relative to the default pose (nu), joint velocities
  (nu), last action (nu); with ``observe_lin_vel`` the body's linear velocity (3) first, as
  mjlab's, legged_gym's and MuJoCo Playground's actors read it (on a robot, a state estimator's).
  ``obs_noise_scale`` gives each part its own noise (std), which the randomization's
  ``obs_noise`` multiplies (``randomization=legged`` sets it to 1).
* **Observation** ``privileged`` (for an asymmetric critic): body linear velocity (3), foot
  contact forces (one per foot, N), the policy observation without noise or encoder bias; the
  backend appends every body's mass and every geom's friction as simulated.
* **Rewards** (legged_gym's terms and names, weights in ``VelocityConfig``, each multiplied by
  the control period as legged_gym does): exp tracking of linear and yaw velocity; penalties on
  vertical velocity, roll/pitch rate, body tilt, joint torques, action rate, joint angles beyond
  the soft limits, distance from the default pose (off for the Go1), foot slip, each body
  other than a foot that touches the ground; a reward for feet air time, and mjlab's posture
  reward, tight standing and loose walking (off unless ``posture`` weighs it).
* **Termination**: the body tilts beyond ``fall_angle`` or the root falls below the robot's
  ``min_base_height`` (the trunk is on the ground); 1000 steps (20 s) truncate.
* **Rough ground** (``go1_velocity_rough``): a heightfield of rough and sloped tiles in ten
  levels, and legged_gym's terrain curriculum (``envs/terrain.py``); ``env/terrain_level`` is
  logged. The policy stays blind (no height scan), as the flat task's.
* **Encoder bias**: each episode draws a per-joint offset in ``[-encoder_bias, encoder_bias]``
  that the measured joint angles carry and the servo targets inherit (the controller works in
  the biased frame), as mjlab's ``encoder_bias`` event.

Episode variables (command, time to the next draw, feet air time, last action, encoder bias)
live in MjData's ``userdata``, so snapshots carry them.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, ClassVar

import mujoco
import torch

from robotrl.envs.robots import RobotDescription, edit_spec, robot_description, robot_spec
from robotrl.envs.tasks.base import MujocoTask, Sim, TaskConfig, View
from robotrl.envs.terrain import MAX_ROUGHNESS, Curriculum, Ground, add_terrain

TIMESTEP = 0.005
"""Physics step (s): 200 Hz."""
FRAME_SKIP = 4
"""Physics steps per control step: 50 Hz control."""


@dataclasses.dataclass
class VelocityConfig(TaskConfig):
    max_episode_steps: int = 1000
    """Control steps per episode (20 s)."""
    reset_noise_scale: float = 0.05
    """Joint angles start uniformly within this many radians of the default pose."""
    command_x: tuple[float, float] = (-1.0, 1.0)
    """Range of the forward velocity command (m/s)."""
    command_y: tuple[float, float] = (-0.5, 0.5)
    """Range of the sideways velocity command (m/s)."""
    command_yaw: tuple[float, float] = (-1.0, 1.0)
    """Range of the yaw-rate command (rad/s)."""
    resample_seconds: tuple[float, float] = (3.0, 8.0)
    """Seconds between command draws, uniform in this range (mjlab's)."""
    standing_fraction: float = 0.1
    """Fraction of command draws that are zero (stand still)."""
    command_grid: tuple[tuple[float, float, float], ...] = ()
    """Fixed commands: world i always holds ``command_grid[i % len]`` (evaluation); empty:
    random draws."""
    action_limit: float = 4.0
    """Actions are clipped to [-action_limit, action_limit] (the action bounds)."""
    encoder_bias: float = 0.0
    """Largest per-joint encoder bias (rad) drawn per episode; 0: none."""
    tracking_sigma: float = 0.25
    """Tracking rewards are exp(-error^2 / tracking_sigma) (legged_gym's)."""
    tracking_sigma_yaw: float | None = None
    """The yaw-rate tracking reward's sigma; None: ``tracking_sigma``. mjlab's velocity tasks
    use 0.5 (std sqrt(0.5)) for yaw against 0.25 for linear velocity: at a 0.8 rad/s error the
    wider one pays 0.28 instead of 0.08 of the weight, so a robot that stands still when told
    to turn still feels the slope toward turning."""
    alive: float = 0.0
    """Reward per step of not having fallen (Gymnasium's healthy reward; a humanoid needs one:
    while falling, tracking pays for the fall's own velocity)."""
    tracking_lin_vel: float = 1.0
    """Weight of the (vx, vy) tracking reward."""
    tracking_ang_vel: float = 0.5
    """Weight of the yaw-rate tracking reward."""
    lin_vel_z: float = -2.0
    """Weight of the squared vertical body velocity."""
    ang_vel_xy: float = -0.05
    """Weight of the squared roll and pitch rates."""
    orientation: float = -5.0
    """Weight of the squared horizontal components of projected gravity (body tilt)."""
    torques: float = -2e-4
    """Weight of the summed squared joint torques."""
    action_rate: float = -0.01
    """Weight of the summed squared change of action between steps."""
    joint_limits: float = -1.0
    """Weight of the radians by which joints exceed their soft limits."""
    pose: float = 0.0
    """Weight of the summed squared deviation of the joints from the default pose (a humanoid's
    arms and waist otherwise wander: mjlab's G1 keeps a pose reward)."""
    posture: float = 0.0
    """Weight of mjlab's speed-dependent posture reward, exp(-mean over joints of ((q - default)
    / std)^2), the std of each joint from ``posture_std`` by the command's speed: tight when
    told to stand, loose when walking (mjlab's Go1 and G1 weigh it 1). No tuned file uses it
    yet."""
    posture_std: dict[str, tuple[float, float, float]] = dataclasses.field(default_factory=dict)
    """Joint-name pattern (``re.search``) -> the std (rad) standing, walking and running; every
    joint must match one. mjlab's Go1: hips and thighs (0.05, 0.3, 0.3), calves (0.1, 0.6, 0.6)."""
    posture_speeds: tuple[float, float] = (0.05, 1.5)
    """|(vx, vy)| + |yaw rate| of the command at which walking, then running, begins (mjlab's)."""
    soft_limit_factor: float = 0.9
    """Soft joint limits: this fraction of each joint's range, about its middle."""
    feet_slip: float = -0.1
    """Weight of the squared horizontal speed of feet in contact."""
    collision: float = -1.0
    """Weight of the number of the robot's bodies touching the ground other than through its
    feet (legged_gym's ``collision`` term, -1 on the thighs and calves of its quadrupeds; mjlab's
    rough Go1 charges its shins): without it a Go1 learned to walk on its shins."""
    feet_air_time: float = 0.5
    """Weight of (air time - ``air_time_threshold``) at each touchdown, while commanded to move."""
    air_time_threshold: float = 0.2
    """Swing time (s) a touchdown must exceed to be rewarded."""
    only_positive_rewards: bool = False
    """Clip each step's total reward at 0 (legged_gym's ``only_positive_rewards``, MuJoCo
    Playground's clip): early on, penalties outweigh tracking and ending the episode would pay;
    the ``positive_clip`` term is what the clip adds back."""
    contact_force: float = 1.0
    """A foot is in contact when its touch sensor reads more than this (N)."""
    fall_angle: float = 70.0
    """The episode ends when the body tilts more than this (degrees) from upright."""
    terrain_init_level: int = 3
    """Rough-ground tasks: worlds start at a level drawn from 0..this (``envs/terrain.py``)."""
    observe_lin_vel: bool = False
    """Put the body's linear velocity (body frame, m/s) first in the policy observation, as the
    field's velocity tasks do (mjlab, legged_gym, MuJoCo Playground); False: the critic alone
    sees it (``privileged``), the issue's robot that measures only its IMU and joints."""
    noise_lin_vel: float = 0.29
    """Observation noise std of body linear velocity (m/s; mjlab's uniform +-0.5)."""
    noise_gravity: float = 0.03
    """Observation noise std of projected gravity (mjlab's uniform +-0.05, same variance)."""
    noise_ang_vel: float = 0.12
    """Observation noise std of body angular velocity (rad/s; mjlab's +-0.2)."""
    noise_joint_pos: float = 0.006
    """Observation noise std of joint angles (rad; mjlab's +-0.01)."""
    noise_joint_vel: float = 0.87
    """Observation noise std of joint velocities (rad/s; mjlab's +-1.5)."""


def quat_rotate_inverse(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``v`` [N, 3] (world frame) in the frame of unit quaternions ``q`` [N, 4] (w, x, y, z)."""
    w, xyz = q[:, :1], q[:, 1:]
    t = 2.0 * torch.linalg.cross(xyz, v, dim=1)
    return v - w * t + torch.linalg.cross(xyz, t, dim=1)


class VelocityTask(MujocoTask):
    """Velocity tracking for the robot ``robot`` (a name of ``configs/robot``)."""

    robot: ClassVar[str]
    gym_id = "robotrl/VelocityTracking"
    xml_file = ""
    frame_skip = FRAME_SKIP
    config_cls = VelocityConfig
    cfg: VelocityConfig
    unobserved_qpos = None
    terrain: ClassVar[bool] = False
    """Rough ground with a curriculum (``envs/terrain.py``) instead of the flat floor."""

    @classmethod
    def description(cls) -> RobotDescription:
        return robot_description(cls.robot)

    @classmethod
    def observation_parts(cls, observe_lin_vel: bool) -> list[tuple[str, int]]:
        """(name, size) of each part of the policy observation, in order: the one layout that
        ``obs_dim``, the noise model and an exported controller's metadata read."""
        nu = len(cls.description().joints)
        first = [("body_linear_velocity", 3)] if observe_lin_vel else []
        return [*first, ("projected_gravity", 3), ("body_angular_velocity", 3), ("command", 3),
                ("joint_pos_minus_default", nu), ("joint_vel", nu), ("last_action", nu)]

    @classmethod
    def controller_metadata(cls, options: dict[str, Any] | None = None) -> dict[str, Any]:
        desc = cls.description()
        parts = cls.observation_parts(bool((options or {}).get("observe_lin_vel")))
        layout, offset = [], 0
        for name, size in parts:
            layout.append({"name": name, "offset": offset, "size": size})
            offset += size
        return {"robot": desc.name, "menagerie": desc.menagerie, "joints": list(desc.joints),
                "default_pose": list(desc.default_pose), "action_scale": list(desc.action_scale),
                "kp": list(desc.kp), "kd": list(desc.kd),
                "effort_limit": list(desc.effort_limit), "observation_parts": layout}

    @classmethod
    def load_model(cls) -> mujoco.MjModel:
        desc = cls.description()
        spec = edit_spec(robot_spec(desc), desc, TIMESTEP)
        spec.nuserdata = cls.userdata_size(desc)
        if cls.terrain:
            add_terrain(spec)
        return spec.compile()

    @classmethod
    def userdata_size(cls, desc: RobotDescription) -> int:
        """Command (3), time to the next draw, air time per foot, last action and encoder bias
        per joint, and on rough ground the episode's start (x, y)."""
        return 4 + len(desc.feet) + 2 * len(desc.joints) + (2 if cls.terrain else 0)

    def __init__(self, cfg: VelocityConfig, model: mujoco.MjModel) -> None:
        super().__init__(cfg, model)
        desc = self.description()
        self.desc = desc
        nu, nf = len(desc.joints), len(desc.feet)
        self.num_userdata = self.userdata_size(desc)
        self._start = slice(4 + nf + 2 * nu, 6 + nf + 2 * nu)
        self.ground = Ground() if self.terrain else None
        self.curriculum = (Curriculum(cfg.terrain_init_level, torch.Generator().manual_seed(0))
                           if self.terrain else None)
        self._spawn: torch.Tensor | None = None
        # userdata columns: command, time to the next draw, air time, last action, encoder bias
        self._cmd, self._timer, self._air = slice(0, 3), 3, slice(4, 4 + nf)
        self._last = slice(4 + nf, 4 + nf + nu)
        self._bias = slice(4 + nf + nu, 4 + nf + 2 * nu)
        jid = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in desc.joints]
        self.qpos_ids = torch.tensor([int(model.jnt_qposadr[j]) for j in jid])
        self.dof_ids = torch.tensor([int(model.jnt_dofadr[j]) for j in jid])
        f64 = torch.float64
        self.default = torch.tensor(desc.default_pose, dtype=f64)
        self.scale = torch.tensor(desc.action_scale, dtype=f64)
        rng = torch.tensor(model.jnt_range[jid], dtype=f64)
        mid, half = rng.mean(1), (rng[:, 1] - rng[:, 0]) / 2 * cfg.soft_limit_factor
        self.soft_low, self.soft_high = mid - half, mid + half
        self.site_ids = torch.tensor([mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, f)
                                      for f in desc.feet])
        self.touch_adr = torch.tensor([int(model.sensor_adr[mujoco.mj_name2id(
            model, mujoco.mjtObj.mjOBJ_SENSOR, f"{f}_touch")]) for f in desc.feet])
        ground = [i for i in range(model.nsensor) if model.sensor(i).name.endswith("_ground")]
        self.ground_adr = torch.tensor([int(model.sensor_adr[i]) for i in ground], dtype=torch.long)
        bodies = [int(model.geom_bodyid[model.sensor_objid[i]]) for i in ground]
        # [sensors, bodies]: which body each non-foot geom's ground contact belongs to
        self.ground_body = torch.tensor([[float(b == c) for c in sorted(set(bodies))]
                                         for b in bodies], dtype=torch.float64).reshape(
                                             len(ground), -1)
        self.root_qpos = int(model.jnt_qposadr[model.body_jntadr[mujoco.mj_name2id(
            model, mujoco.mjtObj.mjOBJ_BODY, desc.root_body)]])
        self.init_qpos[self.root_qpos + 2] = desc.base_height
        self.init_qpos[self.qpos_ids] = self.default
        self.cos_fall = math.cos(math.radians(cfg.fall_angle))
        self.posture_std = posture_stds(desc.joints, cfg.posture_std) if cfg.posture else None
        self.yaw_sigma = cfg.tracking_sigma if cfg.tracking_sigma_yaw is None \
            else cfg.tracking_sigma_yaw
        self.grid = torch.tensor(cfg.command_grid, dtype=f64).reshape(-1, 3)
        self._parts = self.observation_parts(cfg.observe_lin_vel)
        std = {"body_linear_velocity": cfg.noise_lin_vel, "projected_gravity": cfg.noise_gravity,
               "body_angular_velocity": cfg.noise_ang_vel, "command": 0.0,
               "joint_pos_minus_default": cfg.noise_joint_pos, "joint_vel": cfg.noise_joint_vel,
               "last_action": 0.0}  # commands and the last action are exact
        self._noise = torch.cat([torch.full((size,), std[name], dtype=f64)
                                 for name, size in self._parts])

    # ------------------------------------------------------------------ shapes
    @property
    def obs_dim(self) -> int:
        return sum(size for _, size in self._parts)

    @property
    def privileged_dim(self) -> int:
        return 3 + len(self.desc.feet) + self.obs_dim

    def obs_noise_scale(self) -> torch.Tensor:
        return self._noise.clone()

    @property
    def reward_terms(self) -> tuple[str, ...]:
        return ("alive", "tracking_lin_vel", "tracking_ang_vel", "lin_vel_z", "ang_vel_xy", "orientation",
                "torques", "action_rate", "joint_limits", "pose", "posture", "feet_slip",
                "feet_air_time", "collision", "positive_clip")

    def action_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        limit = torch.full((len(self.desc.joints),), float(self.cfg.action_limit))
        return -limit, limit.clone()

    # ------------------------------------------------------------------ reset and commands
    def reset_state(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        qpos = self.init_qpos.expand(n, -1).clone()
        yaw = (torch.rand(n, generator=gen, dtype=torch.float64) * 2 - 1) * math.pi
        r = self.root_qpos
        qpos[:, r + 3], qpos[:, r + 6] = torch.cos(yaw / 2), torch.sin(yaw / 2)
        qpos[:, self.qpos_ids] += self.uniform(gen, n, len(self.qpos_ids),
                                               self.cfg.reset_noise_scale)
        if self.curriculum is not None and self.ground is not None:
            xy = self.curriculum.spawn(n) + self.uniform(gen, n, 2, 1.0)
            qpos[:, r:r + 2] = xy
            qpos[:, r + 2] = self.ground(xy) + self.desc.base_height + MAX_ROUGHNESS
            self._spawn = xy
        return qpos, torch.zeros(n, self.model.nv, dtype=torch.float64)

    def before_reset(self, sim: Sim, ids: torch.Tensor) -> None:
        if self.curriculum is None:
            return
        r = self.root_qpos
        start = sim.userdata[ids, self._start]
        walked = (sim.qpos[ids, r:r + 2] - start).norm(dim=1)
        asked = self.commands(sim)[ids, :2].norm(dim=1) * sim.time[ids]
        self.curriculum.update(ids, walked, asked, sim.num_envs, started=sim.time[ids] > 0)

    def step_metrics(self, sim: Sim) -> dict[str, torch.Tensor]:
        if self.curriculum is None:
            return {}
        return {"terrain_level": self.curriculum.ensure(sim.num_envs).double()}

    def _draw_commands(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """[n, 3] commands from the ranges, a ``standing_fraction`` of them zero."""
        lo = torch.tensor([self.cfg.command_x[0], self.cfg.command_y[0], self.cfg.command_yaw[0]],
                          dtype=torch.float64)
        hi = torch.tensor([self.cfg.command_x[1], self.cfg.command_y[1], self.cfg.command_yaw[1]],
                          dtype=torch.float64)
        cmd = lo + (hi - lo) * torch.rand(n, 3, generator=gen, dtype=torch.float64)
        stand = torch.rand(n, generator=gen, dtype=torch.float64) < self.cfg.standing_fraction
        return cmd.masked_fill(stand[:, None], 0.0)

    def _draw_timers(self, n: int, gen: torch.Generator) -> torch.Tensor:
        lo, hi = self.cfg.resample_seconds
        return lo + (hi - lo) * torch.rand(n, generator=gen, dtype=torch.float64)

    def reset_userdata(self, n: int, gen: torch.Generator) -> torch.Tensor:
        out = torch.zeros(n, self.num_userdata, dtype=torch.float64)
        out[:, self._cmd] = self._draw_commands(n, gen)
        out[:, self._timer] = self._draw_timers(n, gen)
        if self.cfg.encoder_bias > 0:
            out[:, self._bias] = self.uniform(gen, n, len(self.qpos_ids), self.cfg.encoder_bias)
        if self._spawn is not None:
            out[:, self._start] = self._spawn
        return out

    def commands(self, sim: Sim) -> torch.Tensor:
        """[N, 3] float64 current (vx, vy, yaw rate) commands; the grid's when one is set."""
        if len(self.grid):
            return self.grid[torch.arange(sim.num_envs) % len(self.grid)]
        return sim.userdata[:, self._cmd]

    def advance(self, sim: Sim, gen: torch.Generator) -> None:
        ud = sim.userdata
        contact = self.contact(sim)
        ud[:, self._air] = torch.where(contact, 0.0, ud[:, self._air] + self.dt)
        ud[:, self._timer] -= self.dt
        due = (ud[:, self._timer] <= 0).nonzero().flatten()
        if len(due):
            ud[due, self._cmd] = self._draw_commands(len(due), gen)
            ud[due, self._timer] = self._draw_timers(len(due), gen)

    # ------------------------------------------------------------------ action
    def apply_action(self, sim: Sim, action: torch.Tensor, policy_action: torch.Tensor
                     ) -> torch.Tensor:
        limit = self.cfg.action_limit
        sim.userdata[:, self._last] = policy_action.clamp(-limit, limit)
        action = action.clamp(-limit, limit)
        return self.default + self.scale * action - sim.userdata[:, self._bias]

    # ------------------------------------------------------------------ measurements
    def quat(self, sim: Sim) -> torch.Tensor:
        return sim.qpos[:, self.root_qpos + 3 : self.root_qpos + 7]

    def gravity(self, sim: Sim) -> torch.Tensor:
        """[N, 3] gravity's direction in the body frame (upright: (0, 0, -1))."""
        down = torch.tensor([[0.0, 0.0, -1.0]], dtype=torch.float64).expand(sim.num_envs, -1)
        return quat_rotate_inverse(self.quat(sim), down)

    def lin_vel(self, sim: Sim) -> torch.Tensor:
        """[N, 3] body linear velocity in the body frame (m/s)."""
        return quat_rotate_inverse(self.quat(sim), sim.qvel[:, 0:3])

    def ang_vel(self, sim: Sim) -> torch.Tensor:
        """[N, 3] body angular velocity in the body frame (a free joint's qvel[3:6])."""
        return sim.qvel[:, 3:6]

    def touch(self, sim: Sim) -> torch.Tensor:
        """[N, feet] normal contact force at each foot (N)."""
        return sim.sensordata[:, self.touch_adr]

    def bodies_on_ground(self, sim: Sim) -> torch.Tensor:
        """[N, bodies] float: 1 where a body touches the ground other than through a foot."""
        found = (sim.sensordata[:, self.ground_adr] > 0).double()
        return (found @ self.ground_body > 0).double()

    def contact(self, sim: Sim) -> torch.Tensor:
        return self.touch(sim) > self.cfg.contact_force

    def _observe(self, sim: Sim, bias: bool) -> torch.Tensor:
        ud = sim.userdata
        q = sim.qpos[:, self.qpos_ids] - self.default
        if bias:
            q = q + ud[:, self._bias]
        first = [self.lin_vel(sim)] if self.cfg.observe_lin_vel else []
        return torch.cat([*first, self.gravity(sim), self.ang_vel(sim), self.commands(sim), q,
                          sim.qvel[:, self.dof_ids], ud[:, self._last]], dim=1)

    def observe(self, sim: Sim) -> torch.Tensor:
        return self._observe(sim, bias=True)

    def privileged(self, sim: Sim) -> torch.Tensor:
        return torch.cat([self.lin_vel(sim), self.touch(sim), self._observe(sim, bias=False)],
                         dim=1)

    # ------------------------------------------------------------------ reward, termination
    def before_step(self, sim: Sim) -> tuple[torch.Tensor, torch.Tensor]:
        return sim.userdata[:, self._last].clone(), sim.site_xpos[:, self.site_ids].clone()

    def rewards(self, sim: Sim, before: Any, action: torch.Tensor) -> dict[str, torch.Tensor]:
        cfg, dt = self.cfg, self.dt
        last_action, feet_before = before
        cmd, v, w, g = self.commands(sim), self.lin_vel(sim), self.ang_vel(sim), self.gravity(sim)
        q = sim.qpos[:, self.qpos_ids]
        contact = self.contact(sim)
        feet_v = (sim.site_xpos[:, self.site_ids, :2] - feet_before[..., :2]) / dt
        air = sim.userdata[:, self._air] + dt
        touchdown = contact & (air > dt * 1.5)
        moving = (cmd[:, :2].norm(dim=1) > 0.1).double()
        lin_err = (cmd[:, :2] - v[:, :2]).square().sum(1)
        terms = {
            "alive": cfg.alive * (~self.fallen(sim)).double(),
            "tracking_lin_vel": cfg.tracking_lin_vel * torch.exp(-lin_err / cfg.tracking_sigma),
            "tracking_ang_vel": cfg.tracking_ang_vel * torch.exp(
                -(cmd[:, 2] - w[:, 2]).square() / self.yaw_sigma),
            "lin_vel_z": cfg.lin_vel_z * v[:, 2].square(),
            "ang_vel_xy": cfg.ang_vel_xy * w[:, :2].square().sum(1),
            "orientation": cfg.orientation * g[:, :2].square().sum(1),
            "torques": cfg.torques * sim.actuator_force.square().sum(1),
            "action_rate": cfg.action_rate * (sim.userdata[:, self._last] - last_action
                                              ).square().sum(1),
            "joint_limits": cfg.joint_limits * ((self.soft_low - q).clamp_min(0)
                                                + (q - self.soft_high).clamp_min(0)).sum(1),
            "pose": cfg.pose * (q - self.default).square().sum(1),
            "posture": self.posture(q, cmd),
            "feet_slip": cfg.feet_slip * (feet_v.square().sum(2) * contact).sum(1),
            "feet_air_time": cfg.feet_air_time * moving * (
                (air - cfg.air_time_threshold) * touchdown).sum(1),
            "collision": cfg.collision * self.bodies_on_ground(sim).sum(1),
        }
        terms = {k: v * dt for k, v in terms.items()}
        total = torch.stack(list(terms.values())).sum(0)
        clip = (-total).clamp_min(0) if cfg.only_positive_rewards else torch.zeros_like(total)
        return {**terms, "positive_clip": clip}

    def posture(self, q: torch.Tensor, cmd: torch.Tensor) -> torch.Tensor:
        """[N] the posture reward (weighted): each world's std row by its command's speed."""
        if self.posture_std is None:
            return torch.zeros(q.shape[0], dtype=q.dtype)
        speed = cmd[:, :2].norm(dim=1) + cmd[:, 2].abs()
        walk, run = self.cfg.posture_speeds
        regime = (speed >= walk).long() + (speed >= run).long()
        z = (q - self.default) / self.posture_std[regime]
        return self.cfg.posture * torch.exp(-z.square().mean(1))

    def fallen(self, sim: Sim) -> torch.Tensor:
        """[N] bool: tilted beyond ``fall_angle`` or the root below ``min_base_height``."""
        tilted = self.gravity(sim)[:, 2] > -self.cos_fall
        r = self.root_qpos
        height = sim.qpos[:, r + 2]
        if self.ground is not None:
            height = height - self.ground(sim.qpos[:, r:r + 2])
        low = height < self.desc.min_base_height
        return tilted | low | ~torch.isfinite(sim.qpos).all(1)

    def terminated(self, sim: Sim) -> torch.Tensor:
        return self.fallen(sim)


class Go1Velocity(VelocityTask):
    name = "go1_velocity"
    robot = "go1"
    view = View(distance=1.6, elevation=-20.0, azimuth=135.0, track="trunk")


class Go1VelocityRough(Go1Velocity):
    name = "go1_velocity_rough"
    terrain = True


class G1Velocity(VelocityTask):
    name = "g1_velocity"
    robot = "g1"
    view = View(distance=3.0, elevation=-15.0, azimuth=135.0, track="pelvis")


def posture_stds(joints: list[str] | tuple[str, ...],
                 patterns: dict[str, Any]) -> torch.Tensor:
    """[3, joints] the posture std of each joint standing, walking and running, from the first
    of ``patterns`` (``re.search`` on the joint's name) that matches it; a joint no pattern
    matches, or a std that is not three positive numbers, is an error naming them."""
    rows = []
    for joint in joints:
        hit = next((v for p, v in patterns.items() if re.search(p, joint)), None)
        if hit is None:
            raise ValueError(f"posture_std: no pattern matches joint {joint!r} (patterns "
                             f"{sorted(patterns)}; joints {list(joints)})")
        if len(hit) != 3 or any(float(x) <= 0 for x in hit):
            raise ValueError(f"posture_std[{joint!r}] must be three stds > 0 (standing, "
                             f"walking, running), got {hit!r}")
        rows.append([float(x) for x in hit])
    return torch.tensor(rows, dtype=torch.float64).T.contiguous()
