"""Policy camera: one ray per pixel through a fixed MuJoCo camera, cast in every world at once
with ``mujoco.batch.Batch.ray`` (all cores), shaded from per-pixel geom id and normal.

Pixel geometry follows MuJoCo's OpenGL ``Renderer`` (``cam_fovy``, rays through pixel centres,
row 0 at the top), so its segmentation agrees with the ray camera's geom ids.
"""

from __future__ import annotations

import math

import mujoco
import numpy as np
import torch
from mujoco.batch import Batch

BACKGROUND = (0.1, 0.1, 0.12)
"""Colour of pixels that hit nothing."""


class RayCamera:
    """A camera fixed in the world; ``render`` gives [n, C, H, W] uint8 (C = 3, or 4 with a
    depth channel ``255 * clip(dist / far, 0, 1)``)."""

    def __init__(self, model: mujoco.MjModel, camera: str | int, width: int = 32,
                 height: int = 32, depth: bool = False, far: float = 2.0,
                 ambient: float = 0.4, light: tuple[float, float, float] = (0.3, -0.5, 1.0)
                 ) -> None:
        if width < 1 or height < 1:
            raise ValueError(f"width and height must be >= 1, got {width}x{height}")
        names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i)
                 for i in range(model.ncam)]
        cam = camera if isinstance(camera, int) else (
            names.index(camera) if camera in names else -1)
        if not 0 <= cam < model.ncam:
            raise ValueError(f"unknown camera {camera!r}; the model's cameras: {names}")
        if model.cam_bodyid[cam] != 0 or model.cam_mode[cam] != 0:
            raise NotImplementedError("RayCamera supports cameras fixed in the world")
        data = mujoco.MjData(model)
        mujoco.mj_forward(model, data)  # camera poses come from mj_camlight
        pos, mat = data.cam_xpos[cam].copy(), data.cam_xmat[cam].reshape(3, 3).copy()
        half = math.tan(math.radians(float(model.cam_fovy[cam])) / 2)
        x = ((np.arange(width) + 0.5) / width * 2 - 1) * half * width / height
        y = -((np.arange(height) + 0.5) / height * 2 - 1) * half
        gx, gy = np.meshgrid(x, y)  # [H, W]
        local = np.stack([gx, gy, -np.ones_like(gx)], -1).reshape(-1, 3)
        vec = local @ mat.T
        self.vec = vec / np.linalg.norm(vec, axis=1, keepdims=True)
        self.pnt = np.broadcast_to(pos, self.vec.shape).copy()
        self.width, self.height, self.depth, self.far = width, height, depth, far
        self.channels = 4 if depth else 3
        self.ngeom = model.ngeom
        rgba = model.geom_rgba[:, :3].copy()
        mat_id = model.geom_matid
        rgba[mat_id >= 0] = model.mat_rgba[mat_id[mat_id >= 0], :3]
        self.default_colors = torch.as_tensor(rgba, dtype=torch.float32)
        light_dir = torch.tensor(light, dtype=torch.float64)
        self.light = light_dir / light_dir.norm()
        self.ambient = ambient

    def _cast(self, batch: Batch, ids: np.ndarray | None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dist, geom, normal = batch.ray(self.pnt, self.vec, ids=ids, normal=True)
        return torch.from_numpy(dist), torch.from_numpy(geom), torch.from_numpy(normal)

    def segmentation(self, batch: Batch, ids: np.ndarray | None = None) -> torch.Tensor:
        """[n, H, W] int32 geom id per pixel, -1 for the background."""
        _, geom, _ = self._cast(batch, ids)
        return geom.reshape(-1, self.height, self.width)

    def render(self, batch: Batch, colors: torch.Tensor | None = None,
               ids: np.ndarray | None = None) -> torch.Tensor:
        """[n, C, H, W] uint8 images of the worlds ``ids`` (all when None); ``colors``
        [n, ngeom, 3] in [0, 1] recolours geoms per world (default: the model's colours)."""
        dist, geom, normal = self._cast(batch, ids)
        n = len(dist)
        if colors is None:
            colors = self.default_colors.expand(n, -1, -1)
        if tuple(colors.shape) != (n, self.ngeom, 3):
            raise ValueError(f"colors must have shape ({n}, {self.ngeom}, 3), got "
                             f"{tuple(colors.shape)}")
        hit = geom >= 0
        albedo = colors.float().gather(1, geom.clamp(min=0).long()[..., None].expand(-1, -1, 3))
        shade = self.ambient + (1 - self.ambient) * (normal @ self.light).clamp(min=0).float()
        rgb = torch.where(hit[..., None], albedo * shade[..., None],
                          torch.tensor(BACKGROUND))
        out = [rgb]
        if self.depth:
            d = torch.where(hit, (dist / self.far).clamp(0, 1), torch.ones_like(dist))
            out.append(d.float()[..., None])
        img = (torch.cat(out, -1) * 255).round().to(torch.uint8)
        return img.reshape(n, self.height, self.width, self.channels).permute(0, 3, 1, 2)
