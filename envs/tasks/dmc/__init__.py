"""The DeepMind Control Suite (``dmc/<domain>-<task>``) as tasks of every backend.

Each task is dm_control's, step for step: the domain's MJCF read from the installed
``dm_control`` package (never copied here; ``pip install 'robotrl[dmc]'``), its control timestep
(``frame_skip`` physics steps), its reward shapes (``tolerance``: bounds, margins and sigmoids),
its observation keys in its order (the ``policy`` group is their concatenation, as
dm_control's ``flatten_observation``; each key is also an observation group of its own), its
initial-state distribution, and 1000-step episodes with no early termination.

dm_control steps with ``mj_step1`` after the physics step, so its tasks read positions,
velocities and their sensors at the new state (``step_stage = mjSTAGE_VEL``); acceleration
sensors (touch, force, accelerometer) are the last substep's. Its resets run per world on the
host as its ``initialize_episode`` does (``initialize``, drawing from a NumPy ``RandomState``),
so ``initial_state(random, n)`` given dm_control's ``RandomState`` returns dm_control's initial
states. tests/envs/test_dmc.py holds each task to dm_control's own environment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
from collections.abc import Iterator
from typing import Any, ClassVar

import mujoco
import numpy as np
import torch

from robotrl.envs.tasks.base import MjcfSpec, MujocoTask, Sim, TaskConfig, View, before_opengl

EXTRA = "pip install 'robotrl[dmc]'"
"""What installs the suite's models."""

SIGMOIDS = ("gaussian", "hyperbolic", "long_tail", "reciprocal", "cosine", "linear",
            "quadratic", "tanh_squared")
"""The shapes of ``tolerance`` outside its bounds (dm_control's ``rewards.tolerance``)."""


def suite_dir() -> str:
    """The folder of dm_control's suite models in the installed package (found without
    importing dm_control); a clear error naming the extra without it."""
    spec = importlib.util.find_spec("dm_control")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the DeepMind Control Suite's tasks read their models from the dm_control package, "
            f"which is not installed: {EXTRA}")
    return os.path.join(list(spec.submodule_search_locations)[0], "suite")


def _sigmoid(x: torch.Tensor, value_at_1: float, sigmoid: str) -> torch.Tensor:
    """1 at ``x`` = 0, ``value_at_1`` at ``|x|`` = 1, decaying by the named shape."""
    if sigmoid in ("cosine", "linear", "quadratic"):
        if not 0 <= value_at_1 < 1:
            raise ValueError(f"value_at_margin must be in [0, 1) for {sigmoid!r}, "
                             f"got {value_at_1}")
    elif not 0 < value_at_1 < 1:
        raise ValueError(f"value_at_margin must be in (0, 1) for {sigmoid!r}, got {value_at_1}")
    zero = torch.zeros_like(x)
    if sigmoid == "gaussian":
        return torch.exp(-0.5 * (x * math.sqrt(-2 * math.log(value_at_1))) ** 2)
    if sigmoid == "hyperbolic":
        return 1 / torch.cosh(x * math.acosh(1 / value_at_1))
    if sigmoid == "long_tail":
        return 1 / ((x * math.sqrt(1 / value_at_1 - 1)) ** 2 + 1)
    if sigmoid == "reciprocal":
        return 1 / (x.abs() * (1 / value_at_1 - 1) + 1)
    if sigmoid == "cosine":
        scaled = x * (math.acos(2 * value_at_1 - 1) / math.pi)
        return torch.where(scaled.abs() < 1, (1 + torch.cos(math.pi * scaled)) / 2, zero)
    if sigmoid == "linear":
        scaled = x * (1 - value_at_1)
        return torch.where(scaled.abs() < 1, 1 - scaled, zero)
    if sigmoid == "quadratic":
        scaled = x * math.sqrt(1 - value_at_1)
        return torch.where(scaled.abs() < 1, 1 - scaled ** 2, zero)
    if sigmoid == "tanh_squared":
        return 1 - torch.tanh(x * math.atanh(math.sqrt(1 - value_at_1))) ** 2
    raise ValueError(f"unknown sigmoid {sigmoid!r}; allowed: {', '.join(SIGMOIDS)}")


def tolerance(x: torch.Tensor, bounds: tuple[float, float] = (0.0, 0.0), margin: float = 0.0,
              sigmoid: str = "gaussian", value_at_margin: float = 0.1) -> torch.Tensor:
    """dm_control's reward shape: 1 where ``bounds[0] <= x <= bounds[1]``; outside, 0 when
    ``margin`` is 0, else ``sigmoid`` of the distance to the nearest bound in units of
    ``margin``, equal to ``value_at_margin`` one margin away. ``x``: float64 tensor."""
    lower, upper = bounds
    if lower > upper:
        raise ValueError(f"tolerance bounds must have lower <= upper, got {bounds}")
    if margin < 0:
        raise ValueError(f"tolerance margin must be >= 0, got {margin}")
    inside = (lower <= x) & (x <= upper)
    if margin == 0:
        return inside.to(x.dtype)
    d = torch.where(x < lower, lower - x, x - upper) / margin
    return torch.where(inside, torch.ones_like(x), _sigmoid(d, value_at_margin, sigmoid))


class DataSim:
    """One ``MjData`` seen as a ``Sim`` of one world: attribute access returns live
    ``[1, *field_shape]`` float64 views, so a task's batched functions run on it."""

    def __init__(self, model: mujoco.MjModel, data: mujoco.MjData) -> None:
        self.model, self.data, self.num_envs = model, data, 1

    def __getattr__(self, name: str) -> torch.Tensor:
        return torch.from_numpy(np.asarray(getattr(self.data, name)))[None]


@contextlib.contextmanager
def unactuated(model: mujoco.MjModel) -> Iterator[None]:
    """Actuation disabled inside (dm_control's resets run ``mj_forward`` so)."""
    flag = int(mujoco.mjtDisableBit.mjDSBL_ACTUATION)
    before = model.opt.disableflags
    model.opt.disableflags = before | flag
    try:
        yield
    finally:
        model.opt.disableflags = before


def physics_step(model: mujoco.MjModel, data: mujoco.MjData, nstep: int = 1) -> None:
    """dm_control's ``Physics.step``: for Euler, finish the step ``mj_step1`` began
    (``mj_step2``), the rest as ``mj_step``; for RK4 ``mj_step``; then ``mj_step1`` at the new
    state."""
    if model.opt.integrator != int(mujoco.mjtIntegrator.mjINT_RK4):
        mujoco.mj_step2(model, data)
        if nstep > 1:
            mujoco.mj_step(model, data, nstep - 1)
    else:
        mujoco.mj_step(model, data, nstep)
    mujoco.mj_step1(model, data)


def randomize_joints(model: mujoco.MjModel, data: mujoco.MjData,
                     random: np.random.RandomState) -> None:
    """dm_control's ``randomize_limited_and_rotational_joints``, draw for draw: limited hinges
    and slides uniform in their range, limited balls a quaternion within their range, free hinges
    uniform in [-pi, pi], free balls uniform on the 3-sphere, free joints' orientation from
    ``rand(4)`` normalized (dm_control's own choice); free joints' positions kept."""
    types = mujoco.mjtJoint
    for j in range(model.njnt):
        kind, adr = int(model.jnt_type[j]), int(model.jnt_qposadr[j])
        low, high = model.jnt_range[j]
        if model.jnt_limited[j]:
            if kind in (types.mjJNT_HINGE, types.mjJNT_SLIDE):
                data.qpos[adr] = random.uniform(low, high)
            elif kind == types.mjJNT_BALL:
                axis = random.randn(3)
                axis /= np.linalg.norm(axis)
                quat = np.zeros(4)
                mujoco.mju_axisAngle2Quat(quat, axis, random.rand() * high)
                data.qpos[adr:adr + 4] = quat
        elif kind == types.mjJNT_HINGE:
            data.qpos[adr] = random.uniform(-np.pi, np.pi)
        elif kind == types.mjJNT_BALL:
            quat = random.randn(4)
            data.qpos[adr:adr + 4] = quat / np.linalg.norm(quat)
        elif kind == types.mjJNT_FREE:
            quat = random.rand(4)
            data.qpos[adr + 3:adr + 7] = quat / np.linalg.norm(quat)


@dataclasses.dataclass
class DmcConfig(TaskConfig):
    """A suite task's options: dm_control's tasks have none beyond the episode length; the
    ``image`` group's size is ours."""

    max_episode_steps: int = 1000
    """Control steps per episode (dm_control's time limit over its control timestep)."""
    image_size: int = 84
    """Side of the square ``image`` observation group in pixels (the suite's pixel benchmarks,
    DrQ and after, use 84)."""

    def __post_init__(self) -> None:
        if self.image_size < 1:
            raise ValueError(f"image_size must be >= 1, got {self.image_size}")


def dm_control_env(domain: str, task: str, **kwargs: Any) -> Any:
    """dm_control's own environment of ``domain``-``task`` as a Gymnasium env through Farama's
    Shimmy, its observation flattened in dm_control's key order (the layout of ours' ``policy``
    group), so a policy moves between the two. ``kwargs``: Shimmy's (``render_mode``...)."""
    os.environ.setdefault("MUJOCO_GL", "disable")  # dm_control's renderer: not needed to step
    before_opengl()  # dm_control opens its OpenGL display on import where MUJOCO_GL is set
    try:
        import gymnasium
        import shimmy  # noqa: F401  (registers dm_control/<domain>-<task>-v0)
    except ImportError as err:
        raise ModuleNotFoundError(f"dm_control's own environments need Shimmy: {EXTRA}") from err
    env = gymnasium.make(f"dm_control/{domain}-{task}-v0", **kwargs)
    keys = list(env.unwrapped._env.observation_spec())  # dm_control's order
    size = sum(int(np.prod(env.observation_space[k].shape, dtype=int)) for k in keys)
    space = gymnasium.spaces.Box(-np.inf, np.inf, (size,), np.float64)

    def flatten(obs: dict[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([np.asarray(obs[k], dtype=np.float64).ravel() for k in keys])
    return gymnasium.wrappers.TransformObservation(env, flatten, space)


class DmcTask(MujocoTask):
    """A task of the DeepMind Control Suite. Subclasses set the domain's file, the control
    timestep (``frame_skip``), the observation (``observe_parts``, keys in dm_control's order),
    the reward (``reward``) and the initial state (``initialize``). ``gym_id`` names
    dm_control's own environment (``dm_control_env``): ``backend=gymnasium`` runs it."""

    config_cls = DmcConfig
    step_stage = int(mujoco.mjtStage.mjSTAGE_VEL)
    reset_unactuated = True  # dm_control's resets end with mj_forward without actuation
    domain: ClassVar[str]
    """dm_control's domain (the model is ``<domain>.xml`` in its suite)."""
    reward_terms = ("reward",)
    view = View(distance=4.0, elevation=-20.0)
    camera = 0
    """The ``image`` group's camera: the domain's first, as dm_control's pixel wrapper and the
    pixel benchmarks (DrQ: camera 2 for quadruped) render."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            import gymnasium

            domain, task = cls.name.removeprefix("dmc/").split("-", 1)
            cls.gym_id = f"robotrl/dmc-{domain}-{task}-v0"
            if cls.gym_id not in gymnasium.registry:
                gymnasium.register(cls.gym_id, entry_point=dm_control_env,
                                   kwargs={"domain": domain, "task": task},
                                   disable_env_checker=True)

    def __init__(self, cfg: TaskConfig, model: mujoco.MjModel) -> None:
        super().__init__(cfg, model)
        self.scratch = mujoco.MjData(model)
        """Host MjData the resets run on (one world at a time, as dm_control's)."""
        probe = self.observe_parts(DataSim(model, self.scratch))
        self.obs_shapes = {k: int(v.shape[1]) for k, v in probe.items()}
        """Observation key -> its length, in dm_control's order."""

    @classmethod
    def load_model(cls) -> mujoco.MjModel:
        mjcf = MjcfSpec(os.path.join(suite_dir(), cls.xml_file))
        cls.edit_spec(mjcf.spec)
        mjcf.spec.nuserdata = cls.num_userdata
        return mjcf.compile_model()

    @classmethod
    def edit_spec(cls, spec: mujoco.MjSpec) -> None:
        """dm_control's edits of the domain's file before compiling (default: none)."""

    # ------------------------------------------------------------------ named indices
    def id(self, kind: str, name: str) -> int:
        """Index of the named ``body``, ``geom``, ``site``, ``joint``, ``sensor``..."""
        index = mujoco.mj_name2id(self.model, getattr(mujoco.mjtObj, f"mjOBJ_{kind.upper()}"),
                                  name)
        if index < 0:
            raise KeyError(f"{self.name}: the model has no {kind} named {name!r}")
        return index

    def sensor(self, name: str) -> slice:
        """Columns of ``sensordata`` holding the named sensor."""
        i = self.id("sensor", name)
        adr = int(self.model.sensor_adr[i])
        return slice(adr, adr + int(self.model.sensor_dim[i]))

    def qpos_index(self, joint: str) -> int:
        """``qpos`` index of the named joint's first coordinate."""
        return int(self.model.jnt_qposadr[self.id("joint", joint)])

    def qvel_index(self, joint: str) -> int:
        """``qvel`` index of the named joint's first degree of freedom."""
        return int(self.model.jnt_dofadr[self.id("joint", joint)])

    # ------------------------------------------------------------------ observation
    def observe_parts(self, sim: Sim) -> dict[str, torch.Tensor]:
        """dm_control's observation: key -> [N, k] float64, in its order."""
        raise NotImplementedError

    @property
    def obs_dim(self) -> int:
        return sum(self.obs_shapes.values())

    def observe(self, sim: Sim) -> torch.Tensor:
        return torch.cat(list(self.observe_parts(sim).values()), dim=1)

    def observation_groups(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """dm_control's keys, each a group, and ``image``: [3, image_size, image_size] uint8 from
        ``camera`` (``robotrl.envs.camera.RayCamera``: geoms in their model colours, no
        textures or lights beyond one directional light)."""
        size = self.cfg.image_size
        return {**{k: ((n,), torch.float32) for k, n in self.obs_shapes.items()},
                "image": ((3, size, size), torch.uint8)}

    def observe_group(self, name: str, sim: Sim) -> torch.Tensor:
        if name not in self.obs_shapes:
            return super().observe_group(name, sim)
        return self.observe_parts(sim)[name].to(torch.float32)

    # ------------------------------------------------------------------ reward
    def reward(self, sim: Sim) -> torch.Tensor:
        """dm_control's reward, [N] float64 in [0, 1]."""
        raise NotImplementedError

    def rewards(self, sim: Sim, before: Any, action: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"reward": self.reward(sim)}

    # ------------------------------------------------------------------ reset
    def initialize(self, data: mujoco.MjData, random: np.random.RandomState) -> None:
        """dm_control's ``initialize_episode`` on one world, its draws from ``random``; ``data``
        was just reset (``mj_resetData``, then ``mj_forward`` without actuation). What
        dm_control draws into the model (a target's position) goes into ``data.userdata``
        (``num_userdata`` values), which the task's observation and reward read."""

    def userdata_of(self, model: mujoco.MjModel, data: mujoco.MjData) -> np.ndarray:
        """[num_userdata] what ``initialize`` keeps in ``userdata``, read from a dm_control
        physics' model and data (where dm_control keeps it; for the comparison tests)."""
        return np.zeros(self.num_userdata)

    def initial_state(self, random: np.random.RandomState, n: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``n`` initial states (qpos [n, nq], qvel [n, nv], userdata [n, num_userdata],
        act [n, na]) float64, world after world, each drawing from ``random`` as dm_control's
        reset draws from its task's ``RandomState``."""
        model, data = self.model, self.scratch
        qpos = np.empty((n, model.nq))
        qvel = np.empty((n, model.nv))
        userdata = np.empty((n, self.num_userdata))
        act = np.empty((n, model.na))
        for i in range(n):
            mujoco.mj_resetData(model, data)
            with unactuated(model):
                mujoco.mj_forward(model, data)
            self.initialize(data, random)
            qpos[i], qvel[i], userdata[i], act[i] = data.qpos, data.qvel, data.userdata, data.act
        return tuple(torch.from_numpy(x) for x in (qpos, qvel, userdata, act))

    def reset_state(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=gen))
        qpos, qvel, self._userdata, self._act = self.initial_state(np.random.RandomState(seed), n)
        return qpos, qvel

    def reset_userdata(self, n: int, gen: torch.Generator) -> torch.Tensor:
        # drawn with the state (the backends ask for it right after reset_state, same worlds)
        assert self._userdata.shape[0] == n, "reset_userdata follows reset_state"
        return self._userdata

    def reset_act(self, n: int, gen: torch.Generator) -> torch.Tensor:
        # drawn with the state, as the userdata
        assert self._act.shape[0] == n, "reset_act follows reset_state"
        return self._act
