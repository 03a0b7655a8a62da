"""Multi-layer perceptrons with named activations and optional orthogonal initialization."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from torch import nn

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "elu": nn.ELU,
    "silu": nn.SiLU,
    "gelu": nn.GELU,
}
"""Activation name -> module constructor."""


def make_activation(name: str) -> nn.Module:
    """A fresh activation module for ``name`` (a key of ``ACTIVATIONS``)."""
    if name not in ACTIVATIONS:
        raise ValueError(
            f"unknown activation {name!r}; known activations: {', '.join(ACTIVATIONS)}"
        )
    return ACTIVATIONS[name]()


def orthogonal_init(layer: nn.Linear, gain: float) -> nn.Linear:
    """Orthogonal weights scaled by ``gain`` and zero bias (Saxe et al. 2014); returns ``layer``.

    Andrychowicz et al. 2021 ("What matters in on-policy RL") find this, with a small gain on the
    policy's output layer, among the choices that matter for PPO.
    """
    nn.init.orthogonal_(layer.weight, gain=gain)
    nn.init.zeros_(layer.bias)
    return layer


def mlp(
    in_dim: int,
    hidden: Sequence[int],
    out_dim: int | None,
    activation: str = "tanh",
    ortho_init: bool = True,
    out_gain: float = 1.0,
) -> nn.Sequential:
    """Linear layers of widths ``hidden`` with ``activation`` between them.

    Maps [..., in_dim] to [..., out_dim]. With ``out_dim=None`` there is no output layer and the
    network ends with the last hidden activation ([..., hidden[-1]]; a trunk for several heads).

    Args:
        in_dim: input width.
        hidden: hidden widths, possibly empty (then a single linear layer).
        out_dim: output width, or None for a trunk.
        activation: a key of ``ACTIVATIONS``.
        ortho_init: orthogonal init with gain sqrt(2) on hidden layers and ``out_gain`` on the
            output layer, zero biases; False keeps PyTorch's default init.
        out_gain: gain of the output layer under ``ortho_init``.
    """
    make_activation(activation)  # validate before building anything
    layers: list[nn.Module] = []
    width = in_dim
    for size in hidden:
        linear = nn.Linear(width, size)
        if ortho_init:
            orthogonal_init(linear, math.sqrt(2.0))
        layers += [linear, make_activation(activation)]
        width = size
    if out_dim is not None:
        linear = nn.Linear(width, out_dim)
        if ortho_init:
            orthogonal_init(linear, out_gain)
        layers.append(linear)
    elif not hidden:
        raise ValueError("mlp with out_dim=None needs at least one hidden layer")
    return nn.Sequential(*layers)
