"""Multi-layer perceptrons with named activations and optional orthogonal initialization."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from robotrl.nn.linear import Linear

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
        linear = Linear(width, size)
        if ortho_init:
            orthogonal_init(linear, math.sqrt(2.0))
        layers += [linear, make_activation(activation)]
        width = size
    if out_dim is not None:
        linear = Linear(width, out_dim)
        if ortho_init:
            orthogonal_init(linear, out_gain)
        layers.append(linear)
    elif not hidden:
        raise ValueError("mlp with out_dim=None needs at least one hidden layer")
    return nn.Sequential(*layers)


def as_mlp(network: nn.Module, out_dim: int) -> tuple[nn.Sequential, tuple[int, ...], str]:
    """A trainable copy of a plain MLP ``network`` as ``mlp`` builds it: ``(copy, hidden
    widths, activation name)``.

    ``network`` may nest ``nn.Sequential``s and hold ``nn.Identity`` (a shared trunk that is
    not used) and end with a module keeping the first ``out_dim`` outputs (a head that also
    predicts log stds: the copy's output layer keeps those rows). Anything else (layer norm,
    residual blocks, two activation kinds) raises, naming the layer: the copy must be rebuilt
    from its widths alone when a checkpoint is loaded.
    """
    layers: list[nn.Module] = []

    def walk(module: nn.Module) -> None:
        if isinstance(module, nn.Sequential):
            for child in module:
                walk(child)
        elif not isinstance(module, nn.Identity):
            layers.append(module)

    walk(network)
    # a trailing slicer (robotrl.nn.actor.FirstColumns) is dropped: the output layer is cut
    if layers and not isinstance(layers[-1], nn.Linear) and hasattr(layers[-1], "k"):
        layers.pop()
    names = {cls: name for name, cls in ACTIVATIONS.items()}
    linears = [m for m in layers if isinstance(m, nn.Linear)]
    acts = {names.get(type(m)) for m in layers if not isinstance(m, nn.Linear)}
    odd = [type(m).__name__ for m in layers
           if not isinstance(m, nn.Linear) and type(m) not in names]
    expected = [nn.Linear if i % 2 == 0 else None for i in range(len(layers))]
    shape_ok = all(isinstance(m, nn.Linear) == (e is nn.Linear)
                   for m, e in zip(layers, expected, strict=True)) and len(layers) % 2 == 1
    if odd or len(acts) > 1 or not shape_ok or linears[-1].out_features < out_dim:
        what = f"{odd[0]} layer" if odd else "layout " + " -> ".join(
            type(m).__name__ for m in layers)
        raise ValueError(f"the network is not a plain MLP ({what}); only Linear layers with "
                         f"one activation kind ({', '.join(ACTIVATIONS)}) can be copied")
    hidden = tuple(m.out_features for m in linears[:-1])
    activation = acts.pop() if acts else "tanh"
    copy = mlp(linears[0].in_features, hidden, out_dim, activation, ortho_init=False)
    targets = [m for m in copy if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for src, dst in zip(linears, targets, strict=True):
            dst.weight.copy_(src.weight[: dst.out_features])
            dst.bias.copy_(src.bias[: dst.out_features])
    return copy, hidden, activation
