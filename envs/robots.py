"""Robots from MuJoCo Menagerie, described by data: which model, which joints, at what gains.

A robot is a ``RobotDescription`` read from ``configs/robot/<name>.yaml``: the Menagerie model
and entry point, the actuated joints in action order with their default pose, PD gains, torque
limits, rotor inertias (armature) and action scales, the feet, and the root body. Nothing here
assumes where the model file lives: ``robot_spec`` asks the ``mujoco-menagerie`` package
(``pip install 'robotrl[robots]'``), which downloads a model on first use and caches it, or reads
a local checkout named by ``MENAGERIE_ROOT`` (machines without GitHub access: see the README).

``build_model`` turns the description into the simulated model, whatever the source's own
actuators, sensors and contact settings were (Menagerie's Go1 ships stiff ``kp=100`` servos and
elliptic cones; mjlab's copy of the same robot ships none): the source's actuators, sensors and
keyframes are removed; one position servo per joint at the description's gains takes the
joint's target angle in ``ctrl``; collisions are robot-with-ground only (no self-collision), the
feet with priority so that randomizing their friction changes the contact; a touch sensor around
each foot measures its normal force, and a contact sensor on every other collision geom says
whether it touches the ground (``<geom>_ground``: a quadruped that rests on its shins is
penalized for it); a flat floor and a light complete the scene.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from robotrl.config import from_dict

EXTRA = "robots"
"""The optional-dependency extra that installs ``mujoco-menagerie``."""


@dataclasses.dataclass(frozen=True)
class RobotDescription:
    """One robot: a Menagerie model and what a controller needs to know about it."""

    name: str
    """Short name (``go1``); also the file name ``configs/robot/<name>.yaml``."""
    menagerie: str
    """Menagerie model directory (``unitree_go1``)."""
    entry: str
    """Entry point of the robot alone, without a scene (``go1``)."""
    root_body: str
    """The floating base body (``trunk``, ``pelvis``)."""
    joints: tuple[str, ...]
    """Actuated joints, in action order."""
    default_pose: tuple[float, ...]
    """Joint angles (rad) of the standing pose: actions are offsets from it."""
    kp: tuple[float, ...]
    """Position gain per joint (N m / rad)."""
    kd: tuple[float, ...]
    """Velocity gain per joint (N m s / rad)."""
    effort_limit: tuple[float, ...]
    """Torque limit per joint (N m)."""
    armature: tuple[float, ...]
    """Reflected rotor inertia per joint (kg m^2)."""
    action_scale: tuple[float, ...]
    """Radians of target offset per unit of action, per joint."""
    feet: tuple[str, ...]
    """Sites at the feet (touch sensors and foot velocities are taken there)."""
    foot_radius: float
    """Radius (m) around each foot site that holds the foot's collision geoms; the touch sensor
    covers it."""
    base_height: float
    """Height (m) of the root body standing on flat ground in the default pose."""
    min_base_height: float
    """An episode ends when the root body falls below this height (m): the trunk is down."""
    joint_frictionloss: float = 0.0
    """Dry friction (N m) of every actuated joint."""
    foot_friction: float = 0.8
    """Sliding friction of the foot geoms (they take priority over the floor's)."""
    source: str = ""
    """Where the numbers come from (kept with the description, shown in docs)."""

    def __post_init__(self) -> None:
        n = len(self.joints)
        for key in ("default_pose", "kp", "kd", "effort_limit", "armature", "action_scale"):
            value = getattr(self, key)
            if len(value) != n:
                raise ValueError(f"robot {self.name!r}: {key} has {len(value)} entries, one per "
                                 f"joint ({n}) expected")
            object.__setattr__(self, key, tuple(float(v) for v in value))
        object.__setattr__(self, "joints", tuple(self.joints))
        object.__setattr__(self, "feet", tuple(self.feet))
        if not self.feet:
            raise ValueError(f"robot {self.name!r}: feet must name at least one site")


def robot_dir() -> Path:
    """The folder of robot descriptions (``configs/robot``)."""
    import robotrl.configs

    return Path(robotrl.configs.__file__).parent / "robot"


def list_robots() -> list[str]:
    """Names of the robot descriptions."""
    return sorted(p.stem for p in robot_dir().glob("*.yaml"))


@functools.cache
def robot_description(name: str) -> RobotDescription:
    """The description ``configs/robot/<name>.yaml`` (data only: read with ``yaml.safe_load``)."""
    import yaml

    names = list_robots()
    if name not in names:
        raise ValueError(f"unknown robot {name!r}; available: {names}")
    data = yaml.safe_load((robot_dir() / f"{name}.yaml").read_text()) or {}
    return from_dict(RobotDescription, data, f"configs/robot/{name}.yaml")


class RobotUnavailable(RuntimeError):
    """The robot's model cannot be had here: the ``robots`` extra is missing, or Menagerie's
    model could not be downloaded or found under ``MENAGERIE_ROOT`` (the CLI says so in one line
    and exits 2)."""


def robot_spec(desc: RobotDescription) -> mujoco.MjSpec:
    """The robot's MJCF as an editable spec, from MuJoCo Menagerie (downloaded and cached on
    first use, or read from ``MENAGERIE_ROOT``)."""
    try:
        import mujoco_menagerie
    except ImportError:
        raise RobotUnavailable(
            f"robot {desc.name!r} comes from MuJoCo Menagerie: pip install 'robotrl[{EXTRA}]' "
            "(the mujoco-menagerie package; it downloads the model on first use, or reads a local "
            "checkout named by MENAGERIE_ROOT)") from None
    try:
        return mujoco_menagerie.get(desc.menagerie).spec(desc.entry)
    except mujoco_menagerie.MenagerieError as err:
        root = os.environ.get("MENAGERIE_ROOT")
        where = (f"MENAGERIE_ROOT={root} has no {desc.menagerie}/ folder" if root else
                 "it could not be downloaded; on a machine without GitHub access set "
                 "MENAGERIE_ROOT to a folder holding it (README: 'Robots offline')")
        raise RobotUnavailable(f"robot {desc.name!r}: Menagerie model {desc.menagerie!r} not "
                               f"available: {where} ({err})") from None


def _collision(geom: Any) -> bool:
    return bool(geom.contype or geom.conaffinity)


def edit_spec(spec: mujoco.MjSpec, desc: RobotDescription, timestep: float) -> mujoco.MjSpec:
    """Make a Menagerie robot spec the simulated robot (see the module docstring); returns
    ``spec``, edited in place."""
    for kind in ("actuators", "sensors", "keys"):
        for item in list(getattr(spec, kind)):
            spec.delete(item)
    spec.option.timestep = timestep
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    spec.option.cone = mujoco.mjtCone.mjCONE_PYRAMIDAL
    spec.option.impratio = 1.0
    names = {j.name for j in spec.joints}
    missing = [j for j in desc.joints if j not in names]
    if missing:
        raise ValueError(f"robot {desc.name!r}: joints {missing} are not in Menagerie's "
                         f"{desc.menagerie}/{desc.entry}; it has {sorted(n for n in names if n)}")
    for i, name in enumerate(desc.joints):
        joint = spec.joint(name)
        joint.armature = desc.armature[i]
        joint.damping = [0.0, 0.0, 0.0]  # the servo's kd is the damping
        joint.frictionloss = desc.joint_frictionloss
        act = spec.add_actuator(name=name, target=name, trntype=mujoco.mjtTrn.mjTRN_JOINT)
        act.set_to_position(kp=desc.kp[i], kv=desc.kd[i])
        act.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE
        act.forcerange = [-desc.effort_limit[i], desc.effort_limit[i]]
        act.ctrllimited = mujoco.mjtLimited.mjLIMITED_FALSE
    sites = {s.name: s for s in spec.sites}
    feet = [sites.get(f) for f in desc.feet]
    if any(s is None for s in feet):
        raise ValueError(f"robot {desc.name!r}: foot sites {list(desc.feet)} not all in the "
                         f"model; it has {sorted(n for n in sites if n)}")
    model = spec.compile()  # where the foot geoms are relative to the foot sites
    data = mujoco.MjData(model)
    mujoco.mj_kinematics(model, data)
    foot_geoms: set[int] = set()
    for site in feet:
        sid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, site.name)
        body = model.site_bodyid[sid]
        near = np.linalg.norm(data.geom_xpos - data.site_xpos[sid], axis=1) <= desc.foot_radius
        found = [g for g in np.flatnonzero(near & (model.geom_bodyid == body))
                 if model.geom_contype[g] or model.geom_conaffinity[g]]
        if not found:
            raise ValueError(f"robot {desc.name!r}: no collision geom within foot_radius "
                             f"{desc.foot_radius} of foot site {site.name!r}")
        foot_geoms.update(int(g) for g in found)
    for g, geom in enumerate(spec.geoms):
        if not _collision(geom):
            continue
        # robot-with-ground only: the ground has conaffinity 1, the robot's geoms none
        geom.contype, geom.conaffinity = 1, 0
        if g in foot_geoms:
            geom.priority, geom.condim = 1, 3
            geom.friction = [desc.foot_friction, 0.005, 0.0001]
        else:  # frictional against the floor all the same: at equal priority the larger condim wins
            geom.priority, geom.condim = 0, 1
            geom.name = geom.name or f"collision{g}"
            spec.add_sensor(name=f"{geom.name}_ground", type=mujoco.mjtSensor.mjSENS_CONTACT,
                            objtype=mujoco.mjtObj.mjOBJ_GEOM, objname=geom.name,
                            intprm=[1, 0, 1])  # found, no reduction, one slot (MJX's subset)
    for site in feet:
        touch = spec.body(model.body(model.site_bodyid[mujoco.mj_name2id(
            model, mujoco.mjtObj.mjOBJ_SITE, site.name)]).name).add_site(
            name=f"{site.name}_touch", pos=site.pos, size=[desc.foot_radius * 1.5, 0, 0],
            type=mujoco.mjtGeom.mjGEOM_SPHERE, group=5)
        spec.add_sensor(name=f"{site.name}_touch", type=mujoco.mjtSensor.mjSENS_TOUCH,
                        objtype=mujoco.mjtObj.mjOBJ_SITE, objname=touch.name)
    spec.body(desc.root_body).pos = [0, 0, desc.base_height]
    _add_scene(spec)
    return spec


def _add_scene(spec: mujoco.MjSpec) -> None:
    """A checkered floor (collides with the robot: conaffinity 1), a light and a sky."""
    spec.add_texture(name="grid", type=mujoco.mjtTexture.mjTEXTURE_2D,
                     builtin=mujoco.mjtBuiltin.mjBUILTIN_CHECKER, width=300, height=300,
                     rgb1=[0.2, 0.3, 0.4], rgb2=[0.1, 0.2, 0.3], mark=mujoco.mjtMark.mjMARK_EDGE,
                     markrgb=[0.8, 0.8, 0.8])
    spec.add_material(name="grid", texrepeat=[1, 1], texuniform=True, reflectance=0.0,
                      textures=["", "grid"])
    spec.worldbody.add_geom(name="floor", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[0, 0, 0.05],
                            material="grid", contype=0, conaffinity=1, condim=3)
    spec.worldbody.add_light(pos=[0, 0, 4], dir=[0, 0, -1], type=mujoco.mjtLightType.mjLIGHT_DIRECTIONAL)
    for light in spec.lights:  # shadows made a software-rendered (EGL on CPU) frame 5x slower
        light.castshadow = False
    spec.visual.headlight.ambient = [0.3, 0.3, 0.3]
    spec.visual.global_.offwidth, spec.visual.global_.offheight = 640, 480


def build_model(desc: RobotDescription, timestep: float) -> mujoco.MjModel:
    """The simulated model of ``desc``: its Menagerie spec edited by ``edit_spec``."""
    return edit_spec(robot_spec(desc), desc, timestep).compile()


MJLAB_WHEEL = "mjlab==1.6.0"
"""The PyPI wheel whose asset_zoo ships Menagerie's unitree_go1 and unitree_g1 (MJCF and
meshes): the offline source of the robot models on machines that reach PyPI but not GitHub."""


def download_mjlab_wheel(dest: str | Path) -> Path:
    """``pip download --no-deps`` of ``MJLAB_WHEEL`` into the folder ``dest``; the wheel's path,
    or a RuntimeError with pip's last words."""
    import subprocess
    import sys

    try:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                               MJLAB_WHEEL, "-d", str(dest)], capture_output=True, text=True,
                              timeout=600)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"pip download of {MJLAB_WHEEL} took over 10 minutes") from None
    wheels = sorted(Path(dest).glob("mjlab-*.whl"))
    if done.returncode or not wheels:
        raise RuntimeError(f"pip could not download {MJLAB_WHEEL}: "
                           f"{done.stderr.strip()[-400:]}")
    return wheels[0]


def menagerie_root_from_wheel(wheel: str | Path, dest: str | Path,
                              robots: tuple[str, ...] = ("unitree_go1", "unitree_g1")) -> Path:
    """Lay out the robot models that mjlab's wheel ships (``mjlab/asset_zoo/robots/<name>/
    xmls``: the Menagerie MJCF and meshes) as a Menagerie-shaped folder ``dest/<name>/`` with
    mjlab's licence file, for ``MENAGERIE_ROOT`` on machines that reach PyPI but not GitHub
    (``pip download --no-deps mjlab==1.6.0``). Written to a temporary folder, then renamed."""
    dest = Path(dest)
    with zipfile.ZipFile(wheel) as zf:
        members = zf.namelist()
        licence = next((m for m in members if m.endswith("licenses/LICENSE")), None)
        for name in robots:
            prefix = f"mjlab/asset_zoo/robots/{name}/xmls/"
            files = [m for m in members if m.startswith(prefix) and not m.endswith("/")]
            if not files:
                raise ValueError(f"{wheel} has no {prefix}: not an mjlab wheel with {name}")
            tmp = dest / f".{name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            for member in files:
                out = tmp / member[len(prefix):]
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(zf.read(member))
            if licence is not None:
                (tmp / "LICENSE").write_bytes(zf.read(licence))
            shutil.rmtree(dest / name, ignore_errors=True)
            tmp.rename(dest / name)
    return dest
