"""Language-conditioned tabletop: a planar pusher, three coloured objects, templated instructions.

A gripper disc moves in the table plane (two slide joints driven by velocity actuators: an
action in [-1, 1] per axis is a target velocity of 0.4 m/s times it). Three objects, a
cube, a ball and a cylinder, slide on the table (damped slide joints, so a pushed object stops
soon after the gripper leaves it). Each episode recolours the objects (three distinct colours of
``COLOURS``) and draws an instruction from a template over the target's colour and shape:

    reach the {colour} {shape}                       gripper within ``reach_distance`` of it
    push the {colour} {shape} to the left edge       the object's x below -``edge``
    push the {colour} {shape} to the right edge      the object's x above ``edge``

The reward is binary: 1 while the instruction's success predicate holds (``info["success"]`` at
the episode's last step is the outcome GRPO scores). Held-out compositions: the colour-shape
pairs ``HELD_OUT`` are never an instruction's target under ``split="train"``, and always are
under ``split="heldout"``, so generalization to new compositions is measured, not assumed.

The episode's instruction and colours live in MjData's ``userdata`` (template, target object,
colour of each object): they are part of the simulator state, so snapshots (``get_state``) and
GRPO's groups carry them. Observation groups: ``policy`` (gripper position: no velocity, as
demonstrations move at a steady speed and a cloned policy would copy its own velocity instead of
reading the image, the causal confusion of de Haan et al. 2019),
``tokens`` (the instruction's word ids, ``VOCAB``), ``image`` (the ``top`` camera, rendered by
``robotrl.envs.camera.RayCamera`` in the backend), and ``target`` (privileged: the instructed
object's (x, y), which ``robotrl dataset collect`` records for auxiliary losses during
behaviour cloning, issue 47; no policy reads it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import mujoco
import torch

from robotrl.envs.tasks.base import MujocoTask, Sim, TaskConfig, View

COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.85, 0.15, 0.15), "green": (0.15, 0.75, 0.2), "blue": (0.15, 0.3, 0.9),
    "yellow": (0.9, 0.8, 0.1),
}
"""Object colours (RGB in [0, 1])."""
SHAPES: tuple[str, ...] = ("cube", "ball", "cylinder")
"""Object shapes; object i has shape SHAPES[i]."""
TEMPLATES: tuple[str, ...] = ("reach the {} {}", "push the {} {} to the left edge",
                              "push the {} {} to the right edge")
"""Instruction templates over (colour, shape)."""
TEMPLATE_NAMES: tuple[str, ...] = ("reach", "push_left", "push_right")
"""Names of TEMPLATES, for the ``templates`` option."""
HELD_OUT: frozenset[tuple[str, str]] = frozenset({("red", "ball"), ("green", "cylinder"),
                                                  ("blue", "cube")})
"""Colour-shape pairs that are never a target in training (each colour and shape still is)."""
SPLITS: tuple[str, ...] = ("train", "heldout")
"""Instruction splits: train compositions, held-out compositions."""
VOCAB: tuple[str, ...] = ("<pad>", "reach", "push", "the", "to", "left", "right", "edge",
                          *COLOURS, *SHAPES)
"""Instruction words; a word's id is its index (0 pads)."""
MAX_WORDS = 8
"""Length of the ``tokens`` group (the longest instruction has 8 words)."""

_HALF = 0.025  # object half-size (m)
_SPEED = 0.4  # gripper speed (m/s) at action 1: the actuators' gear is its inverse


def _planar_body(name: str, damping: float, geom: str) -> str:
    """MJCF of a body sliding in the table plane (joints ``<name>_x``, ``<name>_y``) with one
    geom named ``name`` of attributes ``geom``."""
    return f"""    <body name="{name}" pos="0 0 {_HALF}">
      <joint name="{name}_x" axis="1 0 0" damping="{damping}"/>
      <joint name="{name}_y" axis="0 1 0" damping="{damping}"/>
      <geom name="{name}" {geom}/>
    </body>"""


_XML = f"""
<mujoco model="tabletop">
  <option timestep="0.005" integrator="implicitfast"/>
  <size nuserdata="5"/>
  <visual><global offwidth="480" offheight="480"/></visual>
  <default>
    <joint type="slide" limited="true" range="-0.28 0.28"/>
    <geom contype="1" conaffinity="1" friction="0.5 0.005 0.0001"/>
  </default>
  <worldbody>
    <light pos="0 0 1.5" dir="0 0 -1" directional="true"/>
    <geom name="table" type="box" size="0.32 0.32 0.01" pos="0 0 -0.01" rgba="0.6 0.5 0.4 1"
          contype="0" conaffinity="0"/>
    <camera name="top" pos="0 0 0.6" xyaxes="1 0 0 0 1 0" fovy="48"/>
{_planar_body("gripper", 0.5, f'type="cylinder" size="0.02 {_HALF}" mass="0.5" rgba="0.9 0.9 0.9 1"')}
{_planar_body("cube", 3, f'type="box" size="{_HALF} {_HALF} {_HALF}" mass="0.1"')}
{_planar_body("ball", 3, f'type="sphere" size="{_HALF}" mass="0.1"')}
{_planar_body("cylinder", 3, f'type="cylinder" size="{_HALF} {_HALF}" mass="0.1"')}
  </worldbody>
  <actuator>
    <velocity name="x" joint="gripper_x" kv="8" gear="{1 / _SPEED}" ctrlrange="-1 1"/>
    <velocity name="y" joint="gripper_y" kv="8" gear="{1 / _SPEED}" ctrlrange="-1 1"/>
  </actuator>
</mujoco>
"""
# userdata columns
_TEMPLATE, _TARGET, _COLOUR = 0, 1, 2  # colour of object i at column _COLOUR + i


@dataclasses.dataclass
class TabletopConfig(TaskConfig):
    max_episode_steps: int = 40
    """Control steps per episode (0.05 s each)."""
    templates: tuple[str, ...] = TEMPLATE_NAMES
    """Instruction templates drawn from (TEMPLATE_NAMES): e.g. ``[reach]`` for the easy task."""
    split: str = "train"
    """Instruction split the resets draw from: "train" or "heldout" (``HELD_OUT`` targets)."""
    reach_distance: float = 0.06
    """Reach succeeds with the gripper centre within this planar distance of the target's."""
    edge: float = 0.18
    """Push succeeds with the target's centre beyond this |x| on the instructed side."""
    spawn: float = 0.15
    """Objects and gripper start uniformly in [-spawn, spawn]^2 (objects at least 0.08 apart)."""
    image_size: int = 32
    """Side of the square ``image`` observation (pixels)."""
    reset_noise_scale: float = 0.0
    """Unused (the reset distribution is the spawn box)."""

    def __post_init__(self) -> None:
        self.templates = tuple(self.templates)
        bad = [t for t in self.templates if t not in TEMPLATE_NAMES]
        if bad or not self.templates:
            raise ValueError(f"unknown templates {bad or '(none)'}; known: {list(TEMPLATE_NAMES)}")
        if self.split not in SPLITS:
            raise ValueError(f"unknown split {self.split!r}; known: {list(SPLITS)}")
        if self.image_size < 4:
            raise ValueError(f"image_size must be >= 4, got {self.image_size}")


def instruction(template: int, colour: int, shape: int) -> str:
    """The instruction text of template index ``template`` for a (colour, shape) index pair."""
    return TEMPLATES[template].format(list(COLOURS)[colour], SHAPES[shape])


def encode_words(text: str) -> list[int]:
    """Word ids of ``text`` (``VOCAB``), padded with 0 to ``MAX_WORDS``; an unknown word fails
    naming the vocabulary."""
    words = text.split()
    unknown = [w for w in words if w not in VOCAB]
    if unknown or len(words) > MAX_WORDS:
        raise ValueError(f"instruction {text!r} has unknown words {unknown} or more than "
                         f"{MAX_WORDS} words; vocabulary: {list(VOCAB)}")
    return [VOCAB.index(w) for w in words] + [0] * (MAX_WORDS - len(words))


def _word_table() -> torch.Tensor:
    """[len(TEMPLATES), colours, shapes, MAX_WORDS] long: every instruction's word ids."""
    return torch.tensor([[[encode_words(instruction(t, c, s)) for s in range(len(SHAPES))]
                          for c in range(len(COLOURS))] for t in range(len(TEMPLATES))])


class Tabletop(MujocoTask):
    name = "tabletop"
    gym_id = "robotrl/Tabletop"
    xml_file = ""
    frame_skip = 10
    config_cls = TabletopConfig
    cfg: TabletopConfig
    has_success = True
    camera: ClassVar[str] = "top"
    """The policy camera (``image`` group)."""
    view = View(distance=0.9, elevation=-55.0, lookat=(0.0, 0.0, 0.0))
    num_userdata: ClassVar[int] = 5
    heldout_options: ClassVar[dict[str, Any]] = {"split": "heldout"}

    def __init__(self, cfg: TabletopConfig, model: mujoco.MjModel) -> None:
        super().__init__(cfg, model)
        body = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, s) for s in SHAPES]
        self.object_qpos = torch.tensor([[int(model.jnt_qposadr[model.body_jntadr[b]]) + k
                                          for k in range(2)] for b in body])
        """[3, 2] qpos indices of each object's (x, y)."""
        self.object_geoms = torch.tensor([mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, s)
                                          for s in SHAPES])
        self.palette = torch.tensor(list(COLOURS.values()), dtype=torch.float32)
        self.words = _word_table()
        self.template_ids = torch.tensor([TEMPLATE_NAMES.index(t) for t in cfg.templates])
        held = torch.zeros(len(COLOURS), len(SHAPES), dtype=torch.bool)
        for c, s in HELD_OUT:
            held[list(COLOURS).index(c), SHAPES.index(s)] = True
        self.held_out = held
        """[colours, shapes] bool: the held-out target compositions."""

    @classmethod
    def load_model(cls) -> mujoco.MjModel:
        return mujoco.MjModel.from_xml_string(_XML)

    @property
    def obs_dim(self) -> int:
        return 2  # gripper (x, y)

    @property
    def reward_terms(self) -> tuple[str, ...]:
        return ("success",)

    def action_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        return -torch.ones(2), torch.ones(2)

    # ------------------------------------------------------------------ reset
    def _positions(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """[n, 4, 2] gripper then object positions, objects pairwise >= 0.08 apart and the
        gripper >= 0.06 from every object (rejection sampling per row)."""
        pos = self.uniform(gen, n * 4, 2, self.cfg.spawn).reshape(n, 4, 2)
        for _ in range(1000):
            d = torch.cdist(pos, pos) + torch.eye(4, dtype=pos.dtype) * 9
            bad = ((d[:, 1:, 1:] < 0.08).flatten(1).any(1) | (d[:, 0, 1:] < 0.06).any(1))
            rows = bad.nonzero().flatten()
            if rows.numel() == 0:
                return pos
            pos[rows] = self.uniform(gen, rows.numel() * 4, 2, self.cfg.spawn).reshape(-1, 4, 2)
        raise RuntimeError("could not place the objects apart; lower spawn density")

    def reset_state(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        pos = self._positions(n, gen)
        qpos = torch.zeros(n, self.model.nq, dtype=torch.float64)
        qpos[:, :2] = pos[:, 0]
        for i in range(len(SHAPES)):
            qpos[:, self.object_qpos[i]] = pos[:, 1 + i]
        return qpos, torch.zeros(n, self.model.nv, dtype=torch.float64)

    def reset_userdata(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """[n, 5] float64 episode variables: template, target object, colour of each object.
        The target's (colour, shape) is in the config's split (rejection per row)."""
        want_held = self.cfg.split == "heldout"
        out = torch.zeros(n, self.num_userdata, dtype=torch.float64)
        todo = torch.arange(n)
        for _ in range(1000):
            k = todo.numel()
            colours = torch.rand(k, len(COLOURS), generator=gen).argsort(1)[:, : len(SHAPES)]
            target = torch.randint(len(SHAPES), (k,), generator=gen)
            template = self.template_ids[torch.randint(len(self.template_ids), (k,),
                                                       generator=gen)]
            held = self.held_out[colours[torch.arange(k), target], target]
            ok = held == want_held
            rows = todo[ok]
            out[rows, _TEMPLATE] = template[ok].double()
            out[rows, _TARGET] = target[ok].double()
            out[rows, _COLOUR:] = colours[ok].double()
            todo = todo[~ok]
            if todo.numel() == 0:
                return out
        raise RuntimeError("could not draw instructions of the requested split")

    # ------------------------------------------------------------------ episode variables
    def episode(self, sim: Sim) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(template [N], target object [N], colour of each object [N, 3]) long, from userdata."""
        u = sim.userdata.long()
        return u[:, _TEMPLATE], u[:, _TARGET], u[:, _COLOUR:]

    def tokens(self, sim: Sim) -> torch.Tensor:
        """[N, MAX_WORDS] long: the instruction's word ids (0 pads)."""
        template, target, colours = self.episode(sim)
        colour = colours.gather(1, target[:, None]).squeeze(1)
        return self.words[template, colour, target]

    def instructions(self, sim: Sim) -> list[str]:
        """The instruction of every world, as text."""
        return [" ".join(VOCAB[w] for w in row if w) for row in self.tokens(sim).tolist()]

    def observation_groups(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        size = self.cfg.image_size
        return {"tokens": ((MAX_WORDS,), torch.long), "image": ((3, size, size), torch.uint8),
                "target": ((2,), torch.float32)}

    def observe_group(self, name: str, sim: Sim) -> torch.Tensor:
        if name == "tokens":
            return self.tokens(sim)
        if name == "target":  # privileged: for training-time auxiliary losses only
            return self.target_xy(sim).float()
        return super().observe_group(name, sim)

    def geom_colors(self, sim: Sim) -> torch.Tensor:
        """[N, ngeom, 3] float32: every geom's colour, objects recoloured per world."""
        n = sim.num_envs
        base = torch.as_tensor(self.model.geom_rgba[:, :3].copy()).expand(n, -1, -1).clone()
        _, _, colours = self.episode(sim)
        base[:, self.object_geoms] = self.palette[colours]
        return base

    def object_xy(self, sim: Sim) -> torch.Tensor:
        """[N, 3, 2] float64 object positions."""
        return sim.qpos[:, self.object_qpos]

    def target_xy(self, sim: Sim) -> torch.Tensor:
        """[N, 2] float64 position of the instruction's object."""
        _, target, _ = self.episode(sim)
        return self.object_xy(sim)[torch.arange(sim.num_envs), target]

    # ------------------------------------------------------------------ task
    def observe(self, sim: Sim) -> torch.Tensor:
        return sim.qpos[:, :2].clone()

    def success(self, sim: Sim) -> torch.Tensor:
        template, _, _ = self.episode(sim)
        target = self.target_xy(sim)
        reach = (sim.qpos[:, :2] - target).norm(dim=1) < self.cfg.reach_distance
        left, right = target[:, 0] < -self.cfg.edge, target[:, 0] > self.cfg.edge
        return torch.stack([reach, left, right], dim=1).gather(1, template[:, None]).squeeze(1)

    def rewards(self, sim: Sim, before: None, action: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"success": self.success(sim).double()}

    # ------------------------------------------------------------------ scripted expert
    def expert(self, sim: Sim, gen: torch.Generator, noise: float = 0.0) -> torch.Tensor:
        """[N, 2] scripted actions: reach moves straight to the target; push goes behind the
        object (on the side away from the instructed edge), then pushes it toward the edge.
        ``noise`` adds Gaussian noise (std, in action units) for diverse demonstrations."""
        template, _, _ = self.episode(sim)
        grip, target = sim.qpos[:, :2], self.target_xy(sim)
        side = torch.where(template == 1, -1.0, 1.0).double()  # push direction along x
        behind = target - torch.stack([side * 0.06, torch.zeros_like(side)], dim=1)
        offset = grip - target
        # behind the object when the gripper is on the far side and roughly level with it
        aligned = (offset[:, 0] * side < -0.03) & (offset[:, 1].abs() < 0.015)
        push_goal = torch.where(aligned[:, None], target + torch.stack(
            [side * 0.3, torch.zeros_like(side)], dim=1), behind)
        # while not aligned, go around the object: first to its row height, away from it
        detour = (offset[:, 0] * side > -0.04) & ~aligned
        around = torch.stack([grip[:, 0], target[:, 1] + torch.where(
            offset[:, 1] >= 0, 0.06, -0.06)], dim=1)
        push_goal = torch.where((detour & (offset[:, 1].abs() < 0.05))[:, None], around,
                                push_goal)
        goal = torch.where((template == 0)[:, None], target, push_goal)
        action = ((goal - grip) * 12.0).clamp(-1, 1)
        if noise:
            action = action + torch.randn(action.shape, generator=gen, dtype=action.dtype) * noise
        return action.clamp(-1, 1).float()
