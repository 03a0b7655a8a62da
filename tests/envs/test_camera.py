"""RayCamera (robotrl.envs.camera): geom ids against MuJoCo's OpenGL Renderer, shading, per-world
colours, depth, shapes and bad input.

The Renderer's references are drawn in a child process: MuJoCo picks its OpenGL backend from
``MUJOCO_GL`` when it is first imported, which in a full test run happened long before this
module (without it a headless machine has no GL; ``tests/conftest.py`` sets ``MUJOCO_GL=egl``
where an EGL library is installed), and the child imports nothing but MuJoCo.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mujoco
import numpy as np
import pytest
import torch
from mujoco.batch import Batch

from robotrl.envs.camera import BACKGROUND, RayCamera

SCENE_XML = """
<mujoco model="camera_test">
  <visual><global offwidth="128" offheight="128"/></visual>
  <asset><material name="red" rgba="0.85 0.1 0.1 1"/></asset>
  <default><joint type="slide" range="-0.25 0.25" limited="true"/></default>
  <worldbody>
    <light pos="0 0 1.5" dir="0 0 -1" directional="true"/>
    <geom name="floor" type="plane" size="0.3 0.3 0.01" rgba="0.6 0.6 0.55 1"/>
    <geom name="hidden" type="sphere" size="0.06" pos="0.2 0.2 0.06" group="3"/>
    <camera name="top" pos="0 -0.45 0.45" xyaxes="1 0 0 0 0.71 0.71" fovy="55"/>
    <camera name="ortho" pos="0 0 1" projection="orthographic" fovy="0.7"/>
    <body name="box" pos="0 0 0.04">
      <joint name="box_x" axis="1 0 0"/><joint name="box_y" axis="0 1 0"/>
      <geom name="box" type="box" size="0.04 0.04 0.04" material="red"/>
    </body>
    <body name="sphere" pos="0 0 0.04">
      <joint name="sphere_x" axis="1 0 0"/><joint name="sphere_y" axis="0 1 0"/>
      <geom name="sphere" type="sphere" size="0.04" rgba="0.1 0.8 0.1 1"/>
    </body>
    <body name="cylinder" pos="0 0 0.04">
      <joint name="cylinder_x" axis="1 0 0"/><joint name="cylinder_y" axis="0 1 0"/>
      <geom name="cylinder" type="cylinder" size="0.035 0.04" rgba="0.1 0.2 0.9 1"/>
    </body>
    <body name="rig" pos="0 0 0.5">
      <joint name="rig_x" axis="1 0 0"/>
      <inertial pos="0 0 0" mass="0.1" diaginertia="1e-3 1e-3 1e-3"/>
      <camera name="onboard" pos="0 -0.2 0" xyaxes="1 0 0 0 0.8 0.6" fovy="60"/>
    </body>
  </worldbody>
</mujoco>
"""
"""A floor, three coloured objects on (x, y) slide joints (the red box through a material), a
group-3 sphere the Renderer hides by default, a fixed perspective camera ``top``, an
orthographic ``ortho`` and ``onboard`` on a sliding rig."""
QPOS = np.array([  # box xy, sphere xy, cylinder xy, rig x: one row per world
    [-0.15, 0.05, 0.0, -0.1, 0.15, 0.1, 0.0],
    [0.1, -0.1, -0.12, 0.12, 0.0, 0.0, 0.1],
    [0.0, 0.15, 0.15, -0.15, -0.15, -0.05, -0.15],
    [0.2, 0.2, -0.2, 0.0, 0.05, -0.2, 0.2],
])
CASES = [("top", 32, 32), ("top", 64, 64), ("top", 48, 32), ("ortho", 32, 32),
         ("onboard", 32, 32)]
"""(camera, width, height) compared with the Renderer."""

_REFERENCE = """
import sys
import numpy as np
xml, qpos, out = sys.argv[1:4]
try:  # MuJoCo's OpenGL backend loads on import: a missing or broken one can fail either
    import mujoco
    model = (mujoco.MjModel.from_binary_path(xml) if xml.endswith(".mjb")
             else mujoco.MjModel.from_xml_path(xml))
    renderer = mujoco.Renderer(model, 128, 128)
except Exception as err:
    print(f"{type(err).__name__}: {err}", file=sys.stderr)
    sys.exit(3)
refs, data = {}, mujoco.MjData(model)
for case in sys.argv[4:]:
    cam, w, h = case.split(":")
    renderer.close()
    renderer = mujoco.Renderer(model, int(h), int(w))
    renderer.enable_segmentation_rendering()
    images = []
    for q in np.load(qpos):
        data.qpos[:] = q
        mujoco.mj_forward(model, data)
        renderer.update_scene(data, camera=cam)
        seg = renderer.render()
        images.append(np.where(seg[..., 1] == int(mujoco.mjtObj.mjOBJ_GEOM), seg[..., 0], -1))
    refs[case] = np.stack(images)
np.savez(out, **refs)
"""


def scene() -> mujoco.MjModel:
    """The test scene (also the camera benchmark's fallback scene)."""
    return mujoco.MjModel.from_xml_string(SCENE_XML)


def _batch(model: mujoco.MjModel, qpos: np.ndarray = QPOS) -> Batch:
    batch = Batch(model, len(qpos), nthread=1)
    batch.qpos[:] = qpos
    batch.forward()
    return batch


def _geom(model: mujoco.MjModel, name: str) -> int:
    return mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, name)


@pytest.fixture(scope="module")
def model() -> mujoco.MjModel:
    return scene()


def renderer_segmentation(model_file: Path, qpos: np.ndarray, cases: list[str], tmp: Path
                          ) -> dict[str, np.ndarray]:
    """MuJoCo Renderer's geom ids [worlds, H, W] (-1: no geom) of the model in ``model_file``
    (.xml or .mjb) at each ``qpos`` row, per case "camera:W:H", drawn in a child process;
    skips the test where the Renderer is unavailable."""
    np.save(tmp / "qpos.npy", qpos)
    run = subprocess.run([sys.executable, "-c", _REFERENCE, str(model_file),
                          str(tmp / "qpos.npy"), str(tmp / "ref.npz"), *cases],
                         capture_output=True, text=True, timeout=120)
    if run.returncode == 3:
        pytest.skip(f"MuJoCo's Renderer is unavailable here (MUJOCO_GL="
                    f"{os.environ.get('MUJOCO_GL')}): {run.stderr.strip().splitlines()[-1]}")
    assert run.returncode == 0, run.stderr
    with np.load(tmp / "ref.npz") as refs:
        return {k: refs[k] for k in refs.files}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """Renderer segmentation [worlds, H, W] of every case, keyed "camera:W:H"."""
    tmp = tmp_path_factory.mktemp("camera")
    (tmp / "scene.xml").write_text(SCENE_XML)
    return renderer_segmentation(tmp / "scene.xml", QPOS, [f"{c}:{w}:{h}" for c, w, h in CASES],
                                 tmp)


@pytest.mark.parametrize(("camera", "width", "height"), CASES)
def test_segmentation_matches_mujoco_renderer(model: mujoco.MjModel,
                                              reference: dict[str, np.ndarray], camera: str,
                                              width: int, height: int) -> None:
    """>= 97% of pixels carry the Renderer's geom id (or both background), in every world;
    ``onboard`` rides a body, posed per world (first render: the batch's poses are computed)."""
    seg = RayCamera(model, camera, width, height).segmentation(_batch(model)).numpy()
    ref = reference[f"{camera}:{width}:{height}"]
    assert seg.shape == ref.shape == (len(QPOS), height, width)
    agreement = (seg == ref).mean(axis=(1, 2))
    assert agreement.min() >= 0.97, agreement
    if camera == "top":  # every object in view, and the hidden group-3 sphere not drawn
        for name in ("box", "sphere", "cylinder"):
            assert all((s == _geom(model, name)).any() for s in seg), name
        assert not (seg == _geom(model, "hidden")).any()


def test_geomgroup_selects_the_groups_seen(model: mujoco.MjModel) -> None:
    batch, hidden = _batch(model), _geom(model, "hidden")
    assert not (RayCamera(model, "ortho").segmentation(batch) == hidden).any()
    seg = RayCamera(model, "ortho", geomgroup=(0, 1, 2, 3)).segmentation(batch)
    assert (seg == hidden).any()
    only_floor = RayCamera(model, "ortho", geomgroup=()).segmentation(batch)
    assert set(only_floor.unique().tolist()) == {-1}  # no group at all: nothing


def test_rgb_background_hues_and_lambert_shading(model: mujoco.MjModel) -> None:
    batch, cam = _batch(model), RayCamera(model, "top", 48, 48)
    img, seg = cam.render(batch), cam.segmentation(batch)
    assert img.shape == (4, 3, 48, 48) and img.dtype == torch.uint8
    pixels = img.permute(0, 2, 3, 1)  # [n, H, W, 3]
    background = torch.tensor([round(255 * c) for c in BACKGROUND], dtype=torch.uint8)
    assert (seg == -1).any() and bool((pixels[seg == -1] == background).all())
    for name, channel in (("box", 0), ("sphere", 1), ("cylinder", 2)):  # red, green, blue
        rgb = pixels[seg == _geom(model, name)].float()
        others = [c for c in range(3) if c != channel]
        assert bool((rgb[:, channel:channel + 1] > rgb[:, others]).all()), name
    # the floor's normal is +z: albedo * (ambient + (1 - ambient) * l_z), by hand
    shade = cam.ambient + (1 - cam.ambient) * cam.light[2]
    want = torch.tensor(np.round(255 * model.geom_rgba[_geom(model, "floor"), :3] * shade))
    floor = pixels[seg == _geom(model, "floor")].float()
    assert bool(((floor - want).abs() <= 1).all())


def test_per_world_colors_recolour_objects(model: mujoco.MjModel) -> None:
    batch = _batch(model, QPOS[[0, 0]])  # two worlds, one state
    cam, box = RayCamera(model, "top"), _geom(model, "box")
    colors = cam.default_colors.repeat(2, 1, 1)
    colors[1, box] = torch.tensor([0.1, 0.1, 0.9])
    img, seg = cam.render(batch, colors), cam.segmentation(batch)
    mask = seg[0] == box
    red, blue = img[0][:, mask].float(), img[1][:, mask].float()
    assert bool((red[0] > red[2]).all()) and bool((blue[2] > blue[0]).all())
    rest = seg[0] != box  # everything else is unchanged
    assert torch.equal(img[0][:, rest], img[1][:, rest])
    assert torch.equal(cam.render(batch, cam.default_colors.repeat(2, 1, 1)), cam.render(batch))


def test_depth_channel_grows_with_distance(model: mujoco.MjModel) -> None:
    batch, cam = _batch(model), RayCamera(model, "top", 32, 32, depth=True, far=1.5)
    img, seg = cam.render(batch), cam.segmentation(batch)
    assert img.shape == (4, 4, 32, 32) and cam.channels == 4
    assert torch.equal(img[:, :3], RayCamera(model, "top", 32, 32).render(batch))
    depth = img[:, 3].float()
    assert bool((depth[seg == -1] == 255).all())
    # the camera looks down and forward: a floor column is farther up the image
    floor = seg == _geom(model, "floor")
    for w in range(len(QPOS)):
        for c in range(32):
            column = depth[w, floor[w, :, c], c]
            assert bool((column[:-1] >= column[1:]).all()), (w, c)
    assert depth[floor].max() > depth[floor].min() + 50
    # an object moved away from the camera (+y) reads deeper
    near, far = QPOS[[0]].copy(), QPOS[[0]].copy()
    far[0, 1] += 0.15
    box = _geom(model, "box")
    d = [cam.render(b)[0, 3][cam.segmentation(b)[0] == box].float().min()
         for b in (_batch(model, near), _batch(model, far))]
    assert d[1] > d[0]


def test_per_world_model_fields(model: mujoco.MjModel) -> None:
    """Per-world camera pose, field of view and geom colours (expanded fields, e.g. domain
    randomization) image each world as a model with those values would."""
    batch, top, box = _batch(model, QPOS[[0, 0]]), model.camera("top").id, _geom(model, "box")
    batch.expand("cam_pos")[1, top] += (0.05, 0.0, 0.02)
    batch.expand("cam_fovy")[1, top] = 40.0
    batch.expand("geom_rgba")[1, box] = (0.1, 0.1, 0.9, 1.0)  # overrides the box's material
    batch.forward()
    moved = scene()
    moved.cam_pos[top] += (0.05, 0.0, 0.02)
    moved.cam_fovy[top] = 40.0
    moved.geom_rgba[box] = (0.1, 0.1, 0.9, 1.0)
    img = RayCamera(model, "top").render(batch)
    want = RayCamera(moved, "top").render(_batch(moved, QPOS[[0]]))
    # the same rays by two routes (bound per-world poses, the static pose): equal up to rounding
    assert (img[1].int() - want[0].int()).abs().max() <= 1
    assert (img[0].int() - img[1].int()).abs().max() > 100
    assert torch.equal(img[0], RayCamera(model, "top").render(_batch(model, QPOS[[0]]))[0])


def test_shapes_and_world_subsets(model: mujoco.MjModel) -> None:
    batch, cam = _batch(model), RayCamera(model, "top", 24, 16)
    assert cam.segmentation(batch).shape == (4, 16, 24)
    assert cam.segmentation(batch).dtype == torch.int32
    full = cam.render(batch)
    sub = cam.render(batch, ids=np.array([1, 3]))
    assert sub.shape == (2, 3, 16, 24) and torch.equal(sub, full[[1, 3]])
    mask = np.array([True, False, True, False])
    assert torch.equal(cam.segmentation(batch, mask), cam.segmentation(batch)[[0, 2]])
    assert cam.render(batch, cam.default_colors.repeat(2, 1, 1), ids=mask).shape[0] == 2


def test_bad_input_errors(model: mujoco.MjModel) -> None:
    with pytest.raises(ValueError, match=r"unknown camera 'side'.*'top', 'ortho', 'onboard'"):
        RayCamera(model, "side")
    with pytest.raises(ValueError, match="unknown camera 7"):
        RayCamera(model, 7)
    with pytest.raises(ValueError, match="width and height must be >= 1"):
        RayCamera(model, "top", 0, 32)
    with pytest.raises(ValueError, match="geomgroup"):
        RayCamera(model, "top", geomgroup=(6,))
    cam, batch = RayCamera(model, "top"), _batch(model)
    with pytest.raises(ValueError, match=rf"colors must have shape .*\(4, {model.ngeom}, 3\)"):
        cam.render(batch, torch.zeros(4, model.ngeom, 4))
    other = Batch(mujoco.MjModel.from_xml_string(
        "<mujoco><worldbody><geom size='1'/></worldbody></mujoco>"), 2, nthread=1)
    with pytest.raises(ValueError, match="is not the camera's"):
        cam.segmentation(other)



@pytest.mark.parametrize("task", ["dmc/cheetah-run", "dmc/walker-walk", "dmc/quadruped-run"])
def test_dmc_image_group_is_the_pixel_benchmarks_view(task: str, tmp_path: Path) -> None:
    """A DMC task's ``image`` group: [N, 3, 84, 84] uint8 from the pixel benchmarks' camera
    (the domain's first; quadruped's third, "y"), its tracking pose per world; its geom ids
    match MuJoCo's Renderer on >= 97% of pixels of worlds in different states, and a geom
    whose colour comes from its material is drawn in it (cheetah's torso: the "self" material,
    not the default grey)."""
    pytest.importorskip("dm_control")
    from robotrl.envs import make

    env = make(task, 3, seed=1, num_threads=1, observations=("policy", "image"))
    for _ in range(30):  # the worlds move apart
        env.step(torch.rand(3, env.spec.action_dim, generator=torch.Generator().manual_seed(_))
                 * 2 - 1)
    image = env.observe()["image"]
    assert image.shape == (3, 3, 84, 84) and image.dtype == torch.uint8
    model, camera = env.model, env.task.camera
    name = model.camera(camera).name
    assert (task, name) in {("dmc/cheetah-run", "side"), ("dmc/walker-walk", "side"),
                            ("dmc/quadruped-run", "y")}
    qpos = env.batch.qpos.copy()
    cam = RayCamera(model, camera, 84, 84)
    seg = cam.segmentation(_batch(model, qpos)).numpy()
    mujoco.mj_saveModel(model, str(tmp_path / "task.mjb"))
    ref = renderer_segmentation(tmp_path / "task.mjb", qpos, [f"{name}:84:84"], tmp_path)
    agreement = (seg == ref[f"{name}:84:84"]).mean(axis=(1, 2))
    assert agreement.min() >= 0.97, agreement
    assert (seg >= 0).mean() > 0.05  # the body is in view, not only background
    if task == "dmc/cheetah-run":
        torso = _geom(model, "torso")
        rgb = image.permute(0, 2, 3, 1)[cam.segmentation(env.batch) == torso]
        r, g, b = rgb.float().mean(0).tolist()
        assert r > g > b, (r, g, b)  # "self" is (0.7, 0.5, 0.3); the default grey is r = g = b
