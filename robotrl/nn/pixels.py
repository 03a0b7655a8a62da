"""Pixel observations: DrQ's convolutional encoder and random-shift augmentation.

Facts from Kostrikov et al. 2020 ("Image Augmentation Is All You Need", DrQ) and Yarats et al.
2021 (DrQ-v2): 84 x 84 frames, 3 stacked; four 3 x 3 convolutions of 32 filters (the first with
stride 2) with ReLUs, a linear layer to 50 features, layer norm and tanh (DrQ's trunk); pixels
scaled to [-0.5, 0.5]; the augmentation pads 4 pixels by repeating the border and crops back at
a random offset per image.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class PixelEncoder(nn.Module):
    """uint8 images [B, C, H, W] -> features [B, feature_dim] in (-1, 1)."""

    def __init__(self, shape: tuple[int, ...], feature_dim: int = 50, filters: int = 32,
                 layers: int = 4) -> None:
        super().__init__()
        if len(shape) != 3 or layers < 1 or feature_dim < 1 or filters < 1:
            raise ValueError(f"a pixel encoder takes [C, H, W] images and positive sizes, got "
                             f"shape {shape}, layers {layers}, features {feature_dim}, "
                             f"filters {filters}")
        convs: list[nn.Module] = []
        channels = shape[0]
        for i in range(layers):
            convs += [nn.Conv2d(channels, filters, 3, stride=2 if i == 0 else 1), nn.ReLU()]
            channels = filters
        self.convs = nn.Sequential(*convs, nn.Flatten())
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, *shape)).shape[1]
        self.trunk = nn.Sequential(nn.Linear(flat, feature_dim), nn.LayerNorm(feature_dim),
                                   nn.Tanh())
        self.shape, self.feature_dim = tuple(shape), feature_dim

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(self.trunk[0].weight.dtype) / 255.0 - 0.5
        return self.trunk(self.convs(x))


def random_shift(images: torch.Tensor, pad: int, generator: torch.Generator) -> torch.Tensor:
    """``images`` [B, C, H, W] (any dtype, returned as float32) padded by ``pad`` pixels that
    repeat the border, then cropped back to [H, W] at an offset in [0, 2 pad]^2 drawn per image
    from ``generator``: each image shifted by up to ``pad`` pixels."""
    if pad < 0:
        raise ValueError(f"the shift's padding must be >= 0, got {pad}")
    x = images.float()
    if pad == 0:
        return x
    b, c, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad), mode="replicate")
    shift = torch.randint(0, 2 * pad + 1, (2, b), generator=generator, device=x.device)
    rows = (shift[0, :, None] + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (shift[1, :, None] + torch.arange(w, device=x.device))[:, None, None, :]
    out = padded.gather(2, rows.expand(b, c, h, w + 2 * pad))
    return out.gather(3, cols.expand(b, c, h, w))
