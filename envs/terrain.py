"""Rough ground for the legged tasks: one heightfield of tiles, harder along x, and the
terrain curriculum of legged_gym (Rudin et al. 2022) that moves each world between them.

The field is ``LEVELS`` rows of tiles along x (difficulty 0 at x = 0 up to 1 at the far end)
by ``COLUMNS`` tiles along y, each ``TILE`` metres square: even columns are random rough
ground (heights uniform in [0, level x ``MAX_ROUGHNESS``], drawn every 0.2 m and interpolated
to the 0.1 m grid), odd columns pyramids whose faces slope at level x ``MAX_SLOPE`` (the robot
starts on the summit). One field serves every world (worlds are separate simulations; many
may stand on one tile); it is drawn from a fixed seed, so the ground is the same in every run.

The curriculum (``Curriculum``): each world has a level; when its episode ends it moves up a
level if it walked farther than half a tile, down if it walked less than half of what its
command asked for, and starts its next episode at the centre of a tile of its level.
"""

from __future__ import annotations

import functools

import mujoco
import numpy as np
import torch

TILE = 6.0
"""Side of a tile (m)."""
LEVELS = 10
"""Difficulty levels (rows of tiles along x)."""
COLUMNS = 4
"""Tiles per level (along y): rough, slope, rough, slope."""
RESOLUTION = 0.1
"""Heightfield grid (m)."""
MAX_ROUGHNESS = 0.08
"""Height range (m) of the roughest tiles."""
MAX_SLOPE = 0.35
"""Slope (rise over run) of the steepest pyramids (about 19 degrees)."""


@functools.cache
def heights(seed: int = 0) -> np.ndarray:
    """[rows (y), cols (x)] float64 ground heights (m) of the whole field (read-only: one array
    serves the model's heightfield and every task's ``Ground``)."""
    from scipy.ndimage import zoom

    rng = np.random.default_rng(seed)
    n = int(round(TILE / RESOLUTION))
    out = np.zeros((COLUMNS * n, LEVELS * n))
    centre = (np.arange(n) + 0.5) * RESOLUTION - TILE / 2
    dx, dy = np.meshgrid(centre, centre)
    for level in range(LEVELS):
        difficulty = level / (LEVELS - 1)
        for col in range(COLUMNS):
            if col % 2 == 0:
                coarse = rng.uniform(0.0, difficulty * MAX_ROUGHNESS, (n // 2 + 1, n // 2 + 1))
                tile = zoom(coarse, n / coarse.shape[0], order=1)[:n, :n]
            else:
                tile = difficulty * MAX_SLOPE * (TILE / 2 - np.maximum(abs(dx), abs(dy)))
            out[col * n:(col + 1) * n, level * n:(level + 1) * n] = tile
    out.setflags(write=False)
    return out


def add_terrain(spec: mujoco.MjSpec, seed: int = 0) -> None:
    """Add the field to ``spec`` as a heightfield geom spanning x in [0, LEVELS x TILE], y in
    [0, COLUMNS x TILE] (it collides with the robot as the floor does)."""
    h = heights(seed)
    top = float(h.max()) or 1.0
    nrow, ncol = h.shape
    spec.add_hfield(name="terrain", nrow=nrow, ncol=ncol,
                    size=[LEVELS * TILE / 2, COLUMNS * TILE / 2, top, 0.1],
                    userdata=(h / top).astype(np.float32).flatten().tolist())
    spec.worldbody.add_geom(name="terrain", type=mujoco.mjtGeom.mjGEOM_HFIELD, hfieldname="terrain",
                            pos=[LEVELS * TILE / 2, COLUMNS * TILE / 2, 0], material="grid",
                            contype=0, conaffinity=1, condim=3)


class Ground:
    """Ground height under planar points, read from the field by bilinear interpolation
    (MuJoCo's surface splits each grid cell into two triangles: within a few millimetres)."""

    def __init__(self, seed: int = 0) -> None:
        self.h = torch.tensor(heights(seed), dtype=torch.float64)

    def __call__(self, xy: torch.Tensor) -> torch.Tensor:
        """[N] heights (m) under ``xy`` [N, 2] (0 off the field)."""
        rows, cols = self.h.shape
        # MuJoCo spreads the grid's points evenly over the field, edge to edge
        u = xy[:, 0] / (LEVELS * TILE) * (cols - 1)  # column coordinate (x)
        v = xy[:, 1] / (COLUMNS * TILE) * (rows - 1)  # row coordinate (y)
        inside = (u >= 0) & (u <= cols - 1) & (v >= 0) & (v <= rows - 1)
        u, v = u.clamp(0, cols - 1), v.clamp(0, rows - 1)
        u0, v0 = u.floor().long().clamp_max(cols - 2), v.floor().long().clamp_max(rows - 2)
        fu, fv = u - u0, v - v0
        h = self.h
        z = ((1 - fu) * (1 - fv) * h[v0, u0] + fu * (1 - fv) * h[v0, u0 + 1]
             + (1 - fu) * fv * h[v0 + 1, u0] + fu * fv * h[v0 + 1, u0 + 1])
        return torch.where(inside, z, torch.zeros_like(z))


class Curriculum:
    """Per-world terrain levels (legged_gym's ``terrain_levels``), kept by the task across
    episodes (not in the simulator state: a resumed run restarts them)."""

    def __init__(self, init_level: int, gen: torch.Generator) -> None:
        self.init_level, self.gen = init_level, gen
        self.levels: torch.Tensor | None = None
        self.pending: torch.Tensor | None = None
        """World ids being reset (set by ``update``, read by the task's ``reset_state``)."""

    def ensure(self, num_envs: int) -> torch.Tensor:
        if self.levels is None or len(self.levels) != num_envs:
            self.levels = torch.randint(0, self.init_level + 1, (num_envs,), generator=self.gen)
        return self.levels

    def update(self, ids: torch.Tensor, walked: torch.Tensor, asked: torch.Tensor,
               num_envs: int, started: torch.Tensor) -> None:
        """Worlds ``ids`` end their episodes having ``walked`` [K] metres of the ``asked`` [K]
        their commands wanted; worlds not ``started`` (the first reset) keep their level."""
        levels = self.ensure(num_envs)
        up = walked > TILE / 2
        down = (walked < 0.5 * asked) & ~up
        step = (up.long() - down.long()) * started.long()
        levels[ids] = (levels[ids] + step).clamp(0, LEVELS - 1)
        self.pending = ids

    def spawn(self, n: int) -> torch.Tensor:
        """[n, 2] tile centres (x, y) of the pending worlds' levels, in a random column."""
        assert self.levels is not None and self.pending is not None and len(self.pending) == n
        level = self.levels[self.pending].double()
        col = torch.randint(0, COLUMNS, (n,), generator=self.gen).double()
        return torch.stack([(level + 0.5) * TILE, (col + 0.5) * TILE], dim=1)
