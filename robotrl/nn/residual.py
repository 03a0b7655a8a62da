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

from robotrl.nn.linear import Linear
from robotrl.nn.mlp import make_activation


class ResidualBlock(nn.Module):
    """``x + Linear(act(Linear(LayerNorm(x))))`` on ``x [..., width]``."""

    def __init__(self, width: int, activation: str, out_scale: float) -> None:
        """Args: ``out_scale`` multiplies the default init of the block's last linear layer."""
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = Linear(width, width)
        self.act = make_activation(activation)
        self.fc2 = Linear(width, width)
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
        self.input = Linear(in_dim, width)
        scale = 1.0 / math.sqrt(max(num_blocks, 1))
        self.blocks = nn.Sequential(
            *(ResidualBlock(width, activation, scale) for _ in range(num_blocks))
        )
        self.out_norm = nn.LayerNorm(width)
        self.out_act = make_activation(activation)
        self.output = Linear(width, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [..., in_dim] -> [..., out_dim]."""
        h = self.blocks(self.input(x))
        return self.output(self.out_act(self.out_norm(h)))


# ---------------------------------------------------------------------------- the CRL paper's
def _dense_unit(in_dim: int, width: int) -> list[nn.Module]:
    """Linear -> LayerNorm -> swish: the unit Wang et al. 2025 stack."""
    return [Linear(in_dim, width), nn.LayerNorm(width), nn.SiLU()]


class DenseResBlock(nn.Module):
    """``x + 4 x [Linear, LayerNorm, swish](x)`` on ``x [..., width]``: the residual block of
    Wang et al. 2025 ("1000 Layer Networks for Self-Supervised RL", fig. 1), whose skip is added
    after the last activation (post-norm inside the block, unlike ``ResidualBlock``)."""

    layers_per_block: int = 4

    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*(m for _ in range(self.layers_per_block)
                                    for m in _dense_unit(width, width)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class DeepResNet(nn.Module):
    """``[..., in_dim] -> [..., out_dim]`` as in Wang et al. 2025: one Linear-LayerNorm-swish
    unit, ``depth / 4`` ``DenseResBlock``s, then a Linear head. ``depth`` counts the dense layers
    inside the blocks, the paper's depth axis (4, 8, ..., 1024).

    Options for deep stacks: ``checkpoint`` recomputes each block's activations in the backward
    pass instead of keeping them (``torch.utils.checkpoint``: memory ~ one block instead of
    ``depth``, at about one extra forward); callers wrap the forward in
    ``torch.autocast(..., dtype=torch.bfloat16)`` for bf16 (LayerNorm stays float32 there).
    """

    def __init__(self, in_dim: int, width: int, depth: int, out_dim: int,
                 checkpoint: bool = False) -> None:
        super().__init__()
        for name, value in (("in_dim", in_dim), ("width", width), ("out_dim", out_dim)):
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        per = DenseResBlock.layers_per_block
        if depth < per or depth % per:
            raise ValueError(f"depth must be a positive multiple of {per} (dense layers in "
                             f"residual blocks of {per}), got {depth}")
        self.in_dim, self.width, self.depth, self.out_dim = in_dim, width, depth, out_dim
        self.checkpoint = checkpoint
        self.input = nn.Sequential(*_dense_unit(in_dim, width))
        self.blocks = nn.ModuleList(DenseResBlock(width) for _ in range(depth // per))
        self.output = Linear(width, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [..., in_dim] -> [..., out_dim]."""
        h = self.input(x)
        recompute = self.checkpoint and torch.is_grad_enabled()
        for block in self.blocks:
            if recompute:
                h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False)
            else:
                h = block(h)
        return self.output(h)

    def cost(self, batch: int) -> dict[str, float]:
        """What one forward + backward of ``batch`` rows costs: ``params``, ``flops`` (2 per
        multiply-add, backward twice the forward, the dense layers only) and
        ``activation_bytes`` (float32 tensors autograd keeps: per dense unit its input, the
        LayerNorm input and the swish input; one block's worth with ``checkpoint``)."""
        params = sum(p.numel() for p in self.parameters())
        macs = sum(m.in_features * m.out_features for m in self.modules()
                   if isinstance(m, nn.Linear))
        units = 1 + self.depth
        kept = (1 + DenseResBlock.layers_per_block + len(self.blocks)) if self.checkpoint \
            else units
        return {"params": float(params), "flops": 3.0 * 2.0 * macs * batch,
                "activation_bytes": float(3 * kept * self.width * batch * 4)}
