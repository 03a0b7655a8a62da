"""Policy camera: one ray per pixel through a MuJoCo camera, cast in every world at once with
``mujoco.batch.Batch.ray`` (the batch's threads, all cores), shaded from per-pixel geom id and
hit normal.

Pixel geometry follows MuJoCo's OpenGL ``mujoco.Renderer`` for the same camera: vertical field
of view ``cam_fovy`` (an orthographic camera's ``fovy`` is the view's height in metres), aspect
``width / height``, rays through pixel centres, row 0 at the top. So ``segmentation`` agrees with
the Renderer's geom segmentation but for a pixel along edges (the Renderer draws tessellated
spheres and cylinders; a ray meets the exact surface).

A camera fixed in the world (body 0, mode ``fixed``) is posed once, at construction, and the
same rays serve every world and call. Any other camera (on a moving body, or tracking) is posed
per world from the batch's bound ``cam_xpos`` / ``cam_xmat``: derived fields, so the pose is the
one the batch's last call computed, current after ``reset()``, ``forward()`` or
``step(stage=mjSTAGE_POS or later)``, one substep behind the state after a plain ``step()``
(while ``ray`` places the geoms at the current state).

Not modelled: textures (a material's texture is ignored, its ``rgba`` is used), transparency
(a hit geom is opaque; MuJoCo's ray skips fully transparent geoms, as the Renderer hides them),
the Renderer's near and far clipping planes, sites and other decorations (only geoms are seen),
and cameras whose frustum comes from ``sensorsize`` / ``intrinsic``.
"""

from __future__ import annotations

import mujoco
import numpy as np
import torch
from mujoco.batch import Batch

BACKGROUND = (0.1, 0.1, 0.12)
"""Colour (RGB in [0, 1]) of pixels whose ray hits nothing."""
DEFAULT_GEOMGROUP: tuple[int, ...] = tuple(
    int(g) for g in np.flatnonzero(mujoco.MjvOption().geomgroup))
"""Geom groups the Renderer shows by default (0, 1, 2): collision-only geoms are often in 3."""
# MuJoCo's internal default geom rgba: a geom whose rgba differs from it takes its own colour
# over its material's (MJCF reference, geom/rgba); otherwise a material's rgba wins
_DEFAULT_RGBA = (0.5, 0.5, 0.5, 1.0)


class RayCamera:
    """Policy camera: one ray per pixel through a MuJoCo camera, cast in every world with
    ``Batch.ray``.

    ``render`` gives [n, C, H, W] uint8 images: C = 3 (RGB, Lambert-shaded under a fixed
    directional light), or 4 with ``depth`` (a fourth channel ``255 * clip(dist / far, 0, 1)``,
    ``dist`` the distance along the ray in metres; 255 for the background).
    """

    def __init__(self, model: mujoco.MjModel, camera: str | int, width: int = 32,
                 height: int = 32, depth: bool = False, far: float = 2.0,
                 geomgroup: tuple[int, ...] | None = None, ambient: float = 0.4,
                 light: tuple[float, float, float] = (0.3, -0.5, 1.0)) -> None:
        """``camera``: the camera's name or id in ``model``; ``width`` x ``height``: the image in
        pixels; ``geomgroup``: the geom groups the camera sees, e.g. ``(0, 1, 2)`` (None: the
        Renderer's default ``DEFAULT_GEOMGROUP``); ``ambient``: the light every surface gets,
        in [0, 1]; ``light``: direction towards the directional light, world frame."""
        if width < 1 or height < 1:
            raise ValueError(f"width and height must be >= 1, got {width}x{height}")
        if not far > 0:
            raise ValueError(f"far must be > 0 (metres), got {far}")
        if not 0 <= ambient <= 1:
            raise ValueError(f"ambient must be in [0, 1], got {ambient}")
        self.cam = _camera_id(model, camera)
        cam = self.cam
        if model.cam_sensorsize[cam].any():
            raise NotImplementedError(
                f"camera {camera!r} sets sensorsize/intrinsic; RayCamera supports fovy cameras")
        groups = DEFAULT_GEOMGROUP if geomgroup is None else tuple(geomgroup)
        bad = [g for g in groups if not (isinstance(g, (int, np.integer))
                                         and 0 <= g < mujoco.mjNGROUP)]
        if bad:
            raise ValueError(f"geomgroup entries must be group ids in [0, {mujoco.mjNGROUP}), "
                             f"got {bad}")
        self.geomgroup = np.zeros(mujoco.mjNGROUP, np.uint8)
        """[mjNGROUP] uint8 mask of the groups seen, as ``Batch.ray`` takes it."""
        self.geomgroup[list(groups)] = 1
        self.width, self.height, self.depth, self.far = width, height, depth, far
        self.channels = 4 if depth else 3
        """Channels of ``render``'s images: 3 (RGB) or 4 (RGB and depth)."""
        self.ngeom, self.ncam = model.ngeom, model.ncam
        self.ortho = model.cam_projection[cam] == mujoco.mjtProjection.mjPROJ_ORTHOGRAPHIC
        self.fovy = float(model.cam_fovy[cam])
        # image-plane coordinates of the pixel centres, [H*W] each, in units of the half height
        u = ((np.arange(width) + 0.5) / width * 2 - 1) * width / height
        v = 1 - (np.arange(height) + 0.5) / height * 2  # row 0 at the top
        gu, gv = np.meshgrid(u, v)
        self._uv = np.stack([gu.ravel(), gv.ravel()], -1)  # [nray, 2]
        origin, direction = self._local_rays(np.array([self.fovy]))
        self._origin, self._dir = origin[0], direction[0]  # [nray, 3] in the camera frame
        self.static = bool(model.cam_bodyid[cam] == 0
                           and model.cam_mode[cam] == mujoco.mjtCamLight.mjCAMLIGHT_FIXED)
        """Whether the camera is fixed in the world: one pose, computed here, for every world."""
        data = mujoco.MjData(model)
        mujoco.mj_forward(model, data)  # cam_xpos / cam_xmat come from mj_camlight
        self._pos = data.cam_xpos[cam].copy()
        self._mat = data.cam_xmat[cam].reshape(3, 3).copy()
        self.pnt = np.ascontiguousarray(self._pos + self._origin @ self._mat.T)
        """[nray, 3] world-frame ray origins of the static pose."""
        self.vec = np.ascontiguousarray(self._dir @ self._mat.T)
        """[nray, 3] world-frame unit ray directions of the static pose."""
        self._tiled: tuple[np.ndarray, np.ndarray] | None = None  # [n, nray, 3] pnt, vec
        self.default_colors = torch.from_numpy(
            material_colors(model.geom_rgba, model.mat_rgba, model.geom_matid))
        """[ngeom, 3] the model's geom colours (a material's where the geom's rgba is default)."""
        light_dir = np.asarray(light, np.float64)
        if light_dir.shape != (3,) or not np.linalg.norm(light_dir) > 0:
            raise ValueError(f"light must be a nonzero 3-vector, got {light}")
        self.light = light_dir / np.linalg.norm(light_dir)
        self.ambient = ambient

    # ------------------------------------------------------------------ rays
    def _local_rays(self, fovy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Camera-frame ray origins and unit directions [k, nray, 3] for ``fovy`` [k] (degrees;
        metres of view height for an orthographic camera). The camera looks along -z, x right,
        y up (MuJoCo's and OpenGL's convention)."""
        k, nray = len(fovy), len(self._uv)
        origin, direction = np.zeros((k, nray, 3)), np.zeros((k, nray, 3))
        if self.ortho:  # parallel rays from the image plane
            origin[..., :2] = self._uv * (fovy[:, None, None] / 2)
            direction[..., 2] = -1
        else:  # rays from the eye through the pixel centres on the plane z = -1
            direction[..., :2] = self._uv * np.tan(np.radians(fovy) / 2)[:, None, None]
            direction[..., 2] = -1
            direction /= np.linalg.norm(direction, axis=-1, keepdims=True)
        return origin, direction

    def _world_rays(self, batch: Batch, sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """World-frame ray origins and directions, [nray, 3] (the static pose, for every world)
        or [n, nray, 3] (per-world poses of the worlds ``sel``)."""
        fovy = batch.expanded("cam_fovy")
        per_world_pose = (not self.static or batch.models is not None
                          or batch.expanded("cam_pos") is not None
                          or batch.expanded("cam_quat") is not None)
        n = len(sel)
        if not per_world_pose and fovy is None:
            # Batch.ray copies (nray, 3) rays out to (n, nray, 3) on every call; rays already of
            # that shape pass through uncopied (measured: 51 -> 45 ms for 256 worlds at 64x64)
            if self._tiled is None or len(self._tiled[0]) != n:
                self._tiled = (_tile(self.pnt, n), _tile(self.vec, n))
            return self._tiled
        if batch.models is not None:
            models = batch.models
            models = [models] if isinstance(models, mujoco.MjModel) else models
            if any(float(m.cam_fovy[self.cam]) != self.fovy for m in models):
                raise NotImplementedError("caller models (set_models) with per-world camera fovy")
        if fovy is None:
            origin, direction = self._origin[None], self._dir[None]
        else:
            origin, direction = self._local_rays(fovy[sel, self.cam].astype(np.float64))
        if per_world_pose:
            xpos, xmat = batch.bind("cam_xpos"), batch.bind("cam_xmat")
            # a derived field bound since the batch's last call reads zero until its next call
            # (a rotation is never zero): compute those poses now, as reset() would have
            unposed = sel[~xmat[sel, self.cam].any(axis=1)]
            if len(unposed):
                batch.forward(unposed)
            pos, mat = xpos[sel, self.cam], xmat[sel, self.cam].reshape(-1, 3, 3)
        else:
            pos, mat = self._pos[None], self._mat[None]
        # x_world = pos + R x_local, for every world and ray at once
        rot = mat.transpose(0, 2, 1)
        pnt = pos[:, None, :] + origin @ rot
        vec = direction @ rot
        return (np.broadcast_to(pnt, (n, *pnt.shape[1:])),
                np.broadcast_to(vec, (n, *vec.shape[1:])))

    def _cast(self, batch: Batch, ids: np.ndarray | None, normal: bool
              ) -> tuple[np.ndarray, ...]:
        """``Batch.ray`` through every pixel of the worlds ``ids``: dist, geomid [n, nray] (and
        normals [n, nray, 3])."""
        if batch.model.ngeom != self.ngeom or batch.model.ncam != self.ncam:
            raise ValueError(f"the batch's model ({batch.model.ngeom} geoms, {batch.model.ncam} "
                             f"cameras) is not the camera's ({self.ngeom} geoms, {self.ncam})")
        sel = _selection(batch.nsim, ids)
        pnt, vec = self._world_rays(batch, sel)
        return batch.ray(pnt, vec, geomgroup=self.geomgroup, ids=ids, normal=normal)

    # ------------------------------------------------------------------ images
    def segmentation(self, batch: Batch, ids: np.ndarray | None = None) -> torch.Tensor:
        """[n, H, W] int32 geom id per pixel, -1 for the background, of the worlds ``ids``
        (sorted unique ids or a [nsim] bool mask, as ``Batch`` takes them; None: all)."""
        _, geom = self._cast(batch, ids, normal=False)
        return torch.from_numpy(geom).reshape(-1, self.height, self.width)

    def render(self, batch: Batch, colors: torch.Tensor | None = None,
               ids: np.ndarray | None = None) -> torch.Tensor:
        """[n, C, H, W] uint8 images of the worlds ``ids`` (None: all). ``colors`` [n, ngeom, 3]
        in [0, 1] are each world's geom colours (tasks recolour objects per world); None: the
        model's (per world where the batch expanded ``geom_rgba`` or ``mat_rgba``)."""
        n = _selection(batch.nsim, ids).size
        if colors is None:
            table = self._batch_colors(batch, ids)
        else:
            table = torch.as_tensor(colors, device="cpu")  # the rays' results are host arrays
            if tuple(table.shape) != (n, self.ngeom, 3):
                raise ValueError(f"colors must have shape [n, ngeom, 3] = ({n}, {self.ngeom}, 3)"
                                 f" for the {n} worlds rendered, got {tuple(table.shape)}")
            table = table.float()
        dist, geom, normal = self._cast(batch, ids, normal=True)
        nray = self.width * self.height
        hit = geom >= 0
        # Lambert: albedo * (ambient + (1 - ambient) * max(0, n.l)); background unshaded
        shade = np.where(hit, self.ambient + (1 - self.ambient)
                         * np.maximum(normal @ self.light, 0.0), 1.0)
        # the background is one more "geom" at index ngeom of the colour table
        table = torch.cat([table.expand(n, -1, -1),
                           torch.tensor(BACKGROUND).expand(n, 1, 3)], 1)  # [n, ngeom + 1, 3]
        index = torch.from_numpy(np.where(hit, geom, self.ngeom).astype(np.int64))
        out = torch.empty(n, self.channels, nray)
        torch.gather(table.transpose(1, 2), 2, index[:, None, :].expand(-1, 3, -1),
                     out=out[:, :3])
        out[:, :3] *= torch.from_numpy(shade).float()[:, None, :]
        if self.depth:
            out[:, 3] = torch.from_numpy(np.where(hit, np.clip(dist / self.far, 0, 1), 1.0))
        img = out.mul_(255).round_().clamp_(0, 255).to(torch.uint8)
        return img.reshape(n, self.channels, self.height, self.width)

    def _batch_colors(self, batch: Batch, ids: np.ndarray | None) -> torch.Tensor:
        """[ngeom, 3] or [n, ngeom, 3] float32 default colours of the worlds ``ids``."""
        geom_rgba, mat_rgba = batch.expanded("geom_rgba"), batch.expanded("mat_rgba")
        if geom_rgba is None and mat_rgba is None:
            return self.default_colors
        sel = _selection(batch.nsim, ids)
        model = batch.model
        geom_rgba = (model.geom_rgba if geom_rgba is None else geom_rgba[sel])
        mat_rgba = (model.mat_rgba if mat_rgba is None else mat_rgba[sel])
        n = len(sel)
        geom_rgba = np.broadcast_to(geom_rgba, (n, *model.geom_rgba.shape))
        mat_rgba = np.broadcast_to(mat_rgba, (n, *model.mat_rgba.shape))
        return torch.from_numpy(material_colors(geom_rgba, mat_rgba, model.geom_matid)).float()


def _camera_id(model: mujoco.MjModel, camera: str | int) -> int:
    """The id of ``camera`` (name or id) in ``model``; a ValueError lists the model's cameras."""
    names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(model.ncam)]
    if isinstance(camera, str):
        cam = names.index(camera) if camera in names else -1
    else:
        cam = int(camera)
    if not 0 <= cam < model.ncam:
        raise ValueError(f"unknown camera {camera!r}; the model's cameras: {names}")
    return cam


def _tile(rays: np.ndarray, n: int) -> np.ndarray:
    """[n, nray, 3] C-contiguous copies of rays [nray, 3]."""
    return np.ascontiguousarray(np.broadcast_to(rays, (n, *rays.shape)))


def _selection(nsim: int, ids: np.ndarray | None) -> np.ndarray:
    """[n] the worlds ``ids`` names (sorted unique ids, a [nsim] bool mask, or None: all);
    ``Batch`` validates them."""
    if ids is None:
        return np.arange(nsim)
    ids = np.asarray(ids)
    return np.flatnonzero(ids) if ids.dtype == bool else ids


def material_colors(geom_rgba: np.ndarray, mat_rgba: np.ndarray, matid: np.ndarray
                     ) -> np.ndarray:
    """[..., ngeom, 3] geom colours from geom_rgba [..., ngeom, 4] and mat_rgba [..., nmat, 4]:
    a geom with a material and the default rgba takes the material's colour."""
    own = np.asarray(geom_rgba[..., :3], np.float32)
    if mat_rgba.shape[-2] == 0:
        return own.copy()
    from_mat = mat_rgba[..., np.maximum(matid, 0), :3]
    use_mat = (matid >= 0) & np.all(geom_rgba == np.float32(_DEFAULT_RGBA), axis=-1)
    return np.where(use_mat[..., None], from_mat, own).astype(np.float32)
