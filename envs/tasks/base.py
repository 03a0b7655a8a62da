"""Task definition shared by every MuJoCo backend.

A task is defined once: its MJCF, reset distribution, observation, named reward terms and
termination, all written as batched torch functions over a ``Sim`` (live ``[N, ...]`` float64
views of MjData fields). Backends (native MuJoCo, MJX) provide the ``Sim`` and run the task.

The locomotion tasks reproduce Gymnasium's MuJoCo ``*-v5`` environments: same MJCF (loaded
from Gymnasium's own assets), observation, reward, termination and reset noise.
"""

from __future__ import annotations

import dataclasses
import os
import re
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol

import mujoco
import torch


class Sim(Protocol):
    """Batched view of the simulation a task reads.

    Attribute access returns live float64 tensors ``[N, *field_shape]`` of MjData fields
    (``sim.qpos``: [N, nq], ``sim.xpos``: [N, nbody, 3], ``sim.cfrc_ext``: [N, nbody, 6]).
    """

    model: mujoco.MjModel
    num_envs: int

    def __getattr__(self, name: str) -> torch.Tensor: ...


@dataclasses.dataclass
class TaskConfig:
    """Options every task has; tasks subclass it with their Gymnasium parameters."""

    reset_noise_scale: float = 0.1
    """Scale of the noise added to the initial qpos/qvel."""
    max_episode_steps: int = 1000
    """Steps before truncation (Gymnasium's TimeLimit)."""


def gymnasium_asset(file: str) -> str:
    """Path of an MJCF shipped with Gymnasium's MuJoCo environments."""
    import gymnasium

    path = os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets", file)
    if not os.path.exists(path):
        raise FileNotFoundError(f"Gymnasium asset {file!r} not found at {path}")
    return path


_TOTAL_MASS = re.compile(r'\s+settotalmass="([^"]*)"')
_INCLUDE = re.compile(r'<include\s+file="([^"]*)"')


def before_opengl() -> None:
    """Load Triton (torch's GPU compiler, in torch's CUDA wheels) before an OpenGL context.

    Mesa's EGL driver loads its own LLVM into the process; Triton's library, loaded after it,
    crashes the process (a segmentation fault in ``import triton``, seen with triton 3.8.0 beside
    Debian's Mesa: ``torch._dynamo``, ``torch.export`` and ``transformers`` import it). Loaded
    first, both work. Called before ``mujoco.Renderer`` and before dm_control's import (which
    opens its EGL display there); costs ~0.1 s once, nothing where Triton is not installed."""
    from torch.utils._triton import has_triton_package

    has_triton_package()  # imports triton when it is installed


class MjcfSpec:
    """An MJCF file as an ``MjSpec``, without MuJoCo 4's deprecated compiler attribute
    ``settotalmass`` (Gymnasium's and dm_control's HalfCheetah: each load printed a deprecation
    warning, through the progress bar). The attribute comes out of the XML and the compiled model
    gets what it did: ``mj_setTotalmass`` scales masses and inertias, ``mj_setConst`` recomputes
    what depends on them (checked equal to Gymnasium's own model in tests/envs/test_tasks.py and
    to dm_control's in tests/envs/test_dmc.py). Includes resolve next to the file."""

    def __init__(self, path: str) -> None:
        with open(path) as f:
            xml = f.read()
        found = _TOTAL_MASS.search(xml)
        self.total_mass = float(found.group(1)) if found else None
        """The file's ``settotalmass`` (None: it has none)."""
        folder = os.path.dirname(path)
        include = {name: open(os.path.join(folder, name), "rb").read()
                   for name in _INCLUDE.findall(xml)}
        self.spec = mujoco.MjSpec.from_string(_TOTAL_MASS.sub("", xml) if found else xml,
                                              include=include or None)
        self.spec.modelfiledir = folder

    def compile_model(self) -> mujoco.MjModel:
        """Compile the spec, then rescale to the file's total mass as its compiler would."""
        model = self.spec.compile()
        if self.total_mass is not None and self.total_mass > 0:
            mujoco.mj_setTotalmass(model, self.total_mass)
            mujoco.mj_setConst(model, mujoco.MjData(model))
        return model


class GymnasiumSpec(MjcfSpec):
    """A Gymnasium MJCF (a file name in its assets) as an ``MjcfSpec``."""

    def __init__(self, file: str) -> None:
        super().__init__(gymnasium_asset(file))


@dataclasses.dataclass(frozen=True)
class View:
    """The camera videos are shot from (``render``): MuJoCo's free camera with Gymnasium's
    ``default_camera_config`` of the task (distance, elevation, azimuth, look-at point), and,
    where the robot travels, following a body so it stays in view. (Gymnasium's own free
    camera ignores the config's ``trackbodyid``: a running HalfCheetah leaves its frame.)"""

    distance: float | None = None
    """Metres from the look-at point (None: the model's extent, Gymnasium's default)."""
    elevation: float = -45.0
    """Degrees (negative: looking down; MuJoCo's default -45)."""
    azimuth: float = 90.0
    """Degrees about the vertical (MuJoCo's default 90: looking along +y)."""
    lookat: tuple[float, float, float] | None = None
    """The look-at point (None: the median geom position at the first frame, Gymnasium's)."""
    track: str | None = None
    """Body whose subtree centre of mass the look-at point follows in x and y (its z stays at
    ``lookat``'s when given), or None: the camera stays put."""


class MujocoTask(ABC):
    """One task: MJCF + reset distribution + observation + reward terms + termination."""

    name: ClassVar[str]
    """Registry name (lower case)."""
    gym_id: ClassVar[str]
    """The Gymnasium environment this task reproduces."""
    xml_file: ClassVar[str]
    """MJCF file name in Gymnasium's assets."""
    frame_skip: ClassVar[int]
    """Physics substeps per control step."""
    config_cls: ClassVar[type[TaskConfig]] = TaskConfig
    """The task's config dataclass."""
    needs_cfrc_ext: ClassVar[bool] = False
    """Whether the task reads ``cfrc_ext`` as Gymnasium computes it after a step."""
    step_stage: ClassVar[int] = int(mujoco.mjtStage.mjSTAGE_NONE)
    """The forward stages computed at the new state after a control step, before the task reads
    it: ``mjSTAGE_NONE`` (Gymnasium's: derived fields describe the state before the last
    substep) or ``mjSTAGE_VEL`` (dm_control's: ``mj_step1`` after the step makes positions,
    velocities and their sensors current; acceleration sensors stay the last substep's)."""
    unobserved_qpos: int | None = None
    """Leading ``qpos`` entries the observation leaves out (the root's x, or x and y) where the
    observation starts with ``qpos[unobserved_qpos:]`` and then ``qvel``; None where it does
    not start with the state (see ``state_obs_dim``)."""
    heldout_options: ClassVar[dict[str, Any]] = {}
    """Task options under which resets draw held-out compositions, never seen in training (e.g.
    tabletop's unseen colour-shape instructions); the group runner evaluates on states drawn
    with them apart (``eval/heldout/*``). Empty: the task has none."""

    def __init__(self, cfg: TaskConfig, model: mujoco.MjModel) -> None:
        self.cfg = cfg
        self.model = model
        # Gymnasium's MujocoEnv: init_qpos = qpos0 of the fresh MjData, init_qvel = 0
        self.init_qpos = torch.as_tensor(model.qpos0.copy(), dtype=torch.float64)
        self.init_qvel = torch.zeros(model.nv, dtype=torch.float64)
        # cached: reading model.opt builds a wrapper object (~30 us), too slow for every step
        self.dt = float(model.opt.timestep) * self.frame_skip
        """Control period in seconds."""
        self.root_dofs = [int(model.jnt_dofadr[j]) + k for j in range(model.njnt)
                          if model.jnt_bodyid[j] == 1
                          for k in range({0: 6, 1: 3}.get(int(model.jnt_type[j]), 1))]
        """Velocity indices of the root body's joints (free: 6, ball: 3, slide/hinge: 1)."""

    @classmethod
    def controller_metadata(cls, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """What a controller running an exported policy of this task needs beyond the
        observation and action layout (a robot's joints, default pose, action scale and servo
        gains), as JSON-ready values, for the task built with ``options`` (the training
        config's ``env.options``); empty for tasks whose action is the control."""
        return {}

    @property
    def privileged_dim(self) -> int:
        """Length of ``privileged``'s output."""
        return len(self.root_dofs)

    def obs_noise_scale(self) -> torch.Tensor | None:
        """[obs_dim] float64 per-dimension noise std that the randomization's ``obs_noise``
        multiplies (a robot task's noise model: each measured quantity its own), or None: the
        same ``obs_noise`` on every dimension."""
        return None

    def apply_action(self, sim: Sim, action: torch.Tensor, policy_action: torch.Tensor
                     ) -> torch.Tensor:
        """The ``ctrl`` [N, nu] float64 for ``action`` [N, act_dim] float64 as it reaches the
        actuators (delayed and noised by the randomization); ``policy_action`` is what the
        policy sent this step. Default: the action is the control (Gymnasium's tasks); a robot
        task maps actions to servo targets and may keep the policy's action in ``userdata``."""
        return action

    def before_reset(self, sim: Sim, ids: torch.Tensor) -> None:
        """Worlds ``ids`` [K] long are about to reset, their last state still in ``sim`` (a
        curriculum reads how their episodes went); the reset's ``reset_state`` and
        ``reset_userdata`` follow for the same worlds in the same order. Default: nothing."""
        return None

    def step_metrics(self, sim: Sim) -> dict[str, torch.Tensor]:
        """Quantities logged every step as ``env/<name>`` (their mean over worlds), e.g. a
        curriculum's level: name -> [N] float64. Default: none."""
        return {}

    def advance(self, sim: Sim, gen: torch.Generator) -> None:
        """Update episode variables in ``userdata`` after a step's reward and termination, before
        its observation (e.g. resample velocity commands); ``gen`` is the env's reset stream.
        Default: nothing."""
        return None

    def privileged(self, sim: Sim) -> torch.Tensor:
        """[N, len(root_dofs)] float64: the true base velocity (the root body's joint
        velocities, unclipped and noise-free), for critics that may see what a robot cannot
        measure. Part of the ``privileged`` observation group."""
        return sim.qvel[:, self.root_dofs]

    @classmethod
    def load_model(cls) -> mujoco.MjModel:
        """Compile the task's MJCF."""
        return GymnasiumSpec(cls.xml_file).compile_model()


    @property
    def obs_dim(self) -> int:
        """Observation length. Default: the state alone (``state_obs_dim``); a task that observes
        more than its state, or not the state, overrides it."""
        dim = self.state_obs_dim
        if dim is None:
            raise NotImplementedError(f"{type(self).__name__} sets no unobserved_qpos (its "
                                      "observation does not start with the state): it must "
                                      "define obs_dim")
        return dim

    @property
    def state_obs_dim(self) -> int | None:
        """How many leading observation entries are the simulator's state (observed positions,
        then velocities): what backend-agreement checks hold to a tight tolerance, the rest
        (contact forces, body inertias) being derived quantities; None where the observation
        does not start with the state."""
        if self.unobserved_qpos is None:
            return None
        return self.model.nq - self.unobserved_qpos + self.model.nv

    @property
    @abstractmethod
    def reward_terms(self) -> tuple[str, ...]:
        """Names of the reward terms ``rewards`` returns, in order."""

    def action_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(low, high), each [nu] float32: the actuator control ranges."""
        rng = torch.as_tensor(self.model.actuator_ctrlrange.copy(), dtype=torch.float32)
        return rng[:, 0].clone(), rng[:, 1].clone()

    def uniform(self, gen: torch.Generator, n: int, size: int, scale: float) -> torch.Tensor:
        """[n, size] float64 uniform in [-scale, scale]."""
        return (torch.rand(n, size, generator=gen, dtype=torch.float64) * 2 - 1) * scale

    def normal(self, gen: torch.Generator, n: int, size: int, scale: float) -> torch.Tensor:
        """[n, size] float64 normal with std ``scale``."""
        return torch.randn(n, size, generator=gen, dtype=torch.float64) * scale

    @abstractmethod
    def reset_state(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample ``n`` initial states: (qpos [n, nq], qvel [n, nv]) float64."""

    def before_step(self, sim: Sim) -> Any:
        """Whatever the reward needs from before the step (e.g. the x position)."""
        return None

    @abstractmethod
    def observe(self, sim: Sim) -> torch.Tensor:
        """Observation of every world, [N, obs_dim] float64."""

    @abstractmethod
    def rewards(self, sim: Sim, before: Any, action: torch.Tensor) -> dict[str, torch.Tensor]:
        """Reward terms, each [N] float64, already scaled by their config weights.

        The reward is their sum. ``action``: [N, act_dim] float64 as applied to ``ctrl``.
        """

    def terminated(self, sim: Sim) -> torch.Tensor:
        """[N] bool: terminal states. Default: never."""
        return torch.zeros(sim.num_envs, dtype=torch.bool)

    camera: ClassVar[str | int | None] = None
    """MuJoCo camera (name or id) of the ``image`` observation group (rendered by the backend),
    or None."""
    view: ClassVar[View] = View()
    """The camera of videos and ``render`` (Gymnasium's ``default_camera_config``)."""

    def markers(self, data: mujoco.MjData) -> list[tuple[tuple[float, float, float], float]]:
        """Spheres ``render`` draws that are not in the model (centre, radius), e.g. a goal
        kept in ``userdata``; default none."""
        return []

    def observation_groups(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Observation groups beyond ``policy`` and ``privileged``: name -> (per-world shape,
        dtype), e.g. ``{"tokens": ((8,), torch.long), "image": ((3, 32, 32), torch.uint8)}``.
        ``image`` is rendered by the backend from ``camera`` with ``geom_colors``; the others
        come from ``observe_group``."""
        return {}

    def observe_group(self, name: str, sim: Sim) -> torch.Tensor:
        """[N, *shape] values of the extra group ``name`` (not ``image``)."""
        raise NotImplementedError(f"task {self.name!r} has no observation group {name!r}")

    def geom_colors(self, sim: Sim) -> torch.Tensor:
        """[N, ngeom, 3] float32 geom colours the ``image`` camera shades and videos draw
        (default: the model's, a material's colour where the geom keeps the default rgba, as
        MuJoCo draws them)."""
        from robotrl.envs.camera import material_colors

        model = self.model
        rgb = material_colors(model.geom_rgba, model.mat_rgba, model.geom_matid)
        return torch.from_numpy(rgb).expand(sim.num_envs, -1, -1)

    num_userdata: ClassVar[int] = 0
    """Episode variables kept in MjData's ``userdata`` (part of snapshots), drawn at reset."""

    def reset_userdata(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """[n, num_userdata] float64 episode variables of ``n`` fresh episodes."""
        return torch.zeros(n, 0, dtype=torch.float64)

    def reset_act(self, n: int, gen: torch.Generator) -> torch.Tensor | None:
        """[n, na] float64 actuator activations of ``n`` fresh episodes, asked for right after
        ``reset_state`` (same worlds); None (the default): zero, as ``mj_resetData`` leaves
        them."""
        return None

    reset_unactuated: ClassVar[bool] = False
    """The reset's ``mj_forward`` runs with actuation disabled (as dm_control's resets), so the
    first observation's acceleration-stage quantities carry no actuator force."""

    has_success: ClassVar[bool] = False
    """The task defines ``success`` (reported as ``info["success"]``)."""

    def success(self, sim: Sim) -> torch.Tensor:
        """[N] bool: the task's success criterion holds now; an episode succeeds if it holds at
        the episode's last step. Only tasks with ``has_success`` define one."""
        raise NotImplementedError(f"task {self.name!r} defines no success criterion")

    def goal_spec(self) -> Any:
        """``robotrl.envs.base.GoalSpec`` of a goal-conditioned task (``GoalTask``), else None."""
        return None


class GoalTask(MujocoTask):
    """A goal-conditioned task: its ``policy`` observation holds the commanded goal at
    ``goal_columns`` and the achieved coordinates at ``achieved_columns``; success is the
    Euclidean distance between the two below ``cfg.success_distance``. The goal lives in the
    simulator state (a mocap body or fixed joints), so snapshots carry it."""

    has_success = True
    goal_columns: ClassVar[tuple[int, ...]]
    """Columns of the observation holding the goal."""
    achieved_columns: ClassVar[tuple[int, ...]]
    """Columns of the observation a goal is compared with."""

    def goal_spec(self) -> Any:
        from robotrl.envs.base import GoalSpec

        return GoalSpec(self.goal_columns, self.achieved_columns,
                        float(self.cfg.success_distance))  # type: ignore[attr-defined]

    def goal_distance(self, sim: Sim) -> torch.Tensor:
        """[N] float64: distance from the achieved coordinates to the goal."""
        obs = self.observe(sim)
        return (obs[:, list(self.achieved_columns)] - obs[:, list(self.goal_columns)]).norm(dim=1)

    def success(self, sim: Sim) -> torch.Tensor:
        return self.goal_distance(sim) < self.cfg.success_distance  # type: ignore[attr-defined]


def make_config(cls: type[TaskConfig], task: str, overrides: dict[str, Any]) -> TaskConfig:
    """Build ``cls`` from ``overrides``, naming the allowed keys on a bad one."""
    allowed = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for task {task!r}; allowed: {sorted(allowed)}"
        )
    return cls(**overrides)
