"""Deep residual MLPs with pre-norm blocks, trainable at hundreds of layers.

Wang et al. 2025 ("1000 Layer Networks for Self-Supervised RL") scale contrastive RL to 1024
layers with residual blocks of dense + LayerNorm + swish layers and a skip connection around
each block. We use the pre-norm form (He et al. 2016, "Identity mappings in deep residual
networks"; Xiong et al. 2020): the skip path is a pure identity, so the signal and its gradient
reach every block unchanged, whatever the depth:

    h = Linear(in_dim, width)(x)
    h = h + Linear(act(Linear(LayerNorm(h))))          (num_blocks times)
    y = Linear(width, out_dim)(act(LayerNorm(h)))
"""

from __future__ import annotations

import math

import torch
from torch import nn

from robotrl.nn.mlp import make_activation


class ResidualBlock(nn.Module):
    """``x + Linear(act(Linear(LayerNorm(x))))`` on ``x [..., width]``."""

    def __init__(self, width: int, activation: str, out_scale: float) -> None:
        """Args: ``out_scale`` multiplies the default init of the block's last linear layer."""
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, width)
        self.act = make_activation(activation)
        self.fc2 = nn.Linear(width, width)
        with torch.no_grad():
            self.fc2.weight.mul_(out_scale)
            self.fc2.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class ResidualMLP(nn.Module):
    """``[..., in_dim] -> [..., out_dim]`` through ``num_blocks`` pre-norm residual blocks.

    Each block holds two linear layers, so the network has ``2 * num_blocks + 2`` of them.
    The last linear layer of every block starts scaled by ``1 / sqrt(num_blocks)`` (GPT-2's
    scaled residual init, Radford et al. 2019), which keeps the variance of the residual stream
    bounded (about doubling over the whole stack) instead of growing with depth.
    """

    def __init__(
        self,
        in_dim: int,
        width: int,
        num_blocks: int,
        out_dim: int,
        activation: str = "silu",
    ) -> None:
        """Args:
        in_dim: input width.
        width: width of the residual stream and of every hidden layer.
        num_blocks: residual blocks (>= 0; 0 gives Linear -> LayerNorm -> act -> Linear).
        out_dim: output width.
        activation: a key of ``robotrl.nn.mlp.ACTIVATIONS`` ("silu" is swish).
        """
        super().__init__()
        make_activation(activation)  # validate before building anything
        for name, value, low in (("in_dim", in_dim, 1), ("width", width, 1),
                                 ("num_blocks", num_blocks, 0), ("out_dim", out_dim, 1)):
            if int(value) < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        self.in_dim, self.width, self.num_blocks, self.out_dim = in_dim, width, num_blocks, out_dim
        self.input = nn.Linear(in_dim, width)
        scale = 1.0 / math.sqrt(max(num_blocks, 1))
        self.blocks = nn.Sequential(
            *(ResidualBlock(width, activation, scale) for _ in range(num_blocks))
        )
        self.out_norm = nn.LayerNorm(width)
        self.out_act = make_activation(activation)
        self.output = nn.Linear(width, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [..., in_dim] -> [..., out_dim]."""
        h = self.blocks(self.input(x))
        return self.output(self.out_act(self.out_norm(h)))
