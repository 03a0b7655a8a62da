"""Ensembles of MLPs evaluated in one batched matmul per layer (e.g. SAC's twin critics)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from robotrl.nn.batch_renorm import BatchRenorm
from robotrl.nn.linear import ensemble_linear
from robotrl.nn.mlp import make_activation


class EnsembleLinear(nn.Module):
    """E independent linear layers: [E, B, in] (or a shared [B, in]) -> [E, B, out].

    One ``baddbmm`` replaces E separate matmuls and their E kernel launches; with twin critics
    this halves the layer calls of an update (with one torch thread, large float32 CPU layers
    take one oneDNN product per member instead, twice as fast as the BLAS on AMD CPUs:
    ``robotrl.nn.linear.ensemble_linear``). Initialized as ``nn.Linear`` (uniform in
    +-1/sqrt(in)), independently per member.
    """

    def __init__(self, num_members: int, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.num_members, self.in_dim, self.out_dim = num_members, in_dim, out_dim
        bound = 1.0 / math.sqrt(in_dim)
        self.weight = nn.Parameter(torch.empty(num_members, in_dim, out_dim).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(num_members, 1, out_dim).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ensemble_linear(x, self.weight, self.bias)

    def member(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """Member ``i`` alone: [B, in] -> [B, out]."""
        return torch.addmm(self.bias[i], x, self.weight[i])

    def extra_repr(self) -> str:
        return f"members={self.num_members}, in={self.in_dim}, out={self.out_dim}"


class EnsembleLayerNorm(nn.Module):
    """LayerNorm over the last dim of [E, B, H] with per-member gain and bias [E, 1, H]."""

    def __init__(self, num_members: int, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_members, 1, dim))
        self.bias = nn.Parameter(torch.zeros(num_members, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = nn.functional.layer_norm(x, x.shape[-1:], eps=self.eps)
        return torch.addcmul(self.bias, normed, self.weight)

    def member(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """Member ``i`` alone: [B, H] -> [B, H]."""
        return nn.functional.layer_norm(x, x.shape[-1:], self.weight[i, 0], self.bias[i, 0],
                                        self.eps)


class EnsembleQ(nn.Module):
    """E state-action value MLPs: Q_e(obs, action) for every member e.

    Args:
        obs_dim, act_dim: input widths (the input is ``cat(obs, action)``).
        hidden: hidden widths shared by all members.
        num_members: ensemble size E (2 for SAC's clipped double Q).
        activation: a key of ``robotrl.nn.mlp.ACTIVATIONS``.
        layer_norm: LayerNorm after every hidden activation (ReBRAC's critic, Tarasov et al.
            2023: Dense, ReLU, LayerNorm).
        batch_renorm: arguments of ``BatchRenorm`` placed before every linear layer, the
            input's included (CrossQ's critic, Bhatt et al. 2024); None: none.
        out_dim: outputs per member: 1 (a value, squeezed away) or K (e.g. the logits of a
            categorical return distribution over K atoms, FastTD3's critic).
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int] = (256, 256),
        num_members: int = 2,
        activation: str = "relu",
        layer_norm: bool = False,
        batch_renorm: dict[str, Any] | None = None,
        out_dim: int = 1,
    ) -> None:
        super().__init__()
        if num_members < 1:
            raise ValueError(f"an ensemble needs >= 1 member, got {num_members}")

        def linear(width: int, size: int) -> list[nn.Module]:
            norm = ([] if batch_renorm is None else
                    [BatchRenorm(width, num_members, **batch_renorm)])
            return [*norm, EnsembleLinear(num_members, width, size)]

        layers: list[nn.Module] = []
        width = obs_dim + act_dim
        for size in hidden:
            layers += [*linear(width, size), make_activation(activation)]
            if layer_norm:
                layers.append(EnsembleLayerNorm(num_members, size))
            width = size
        layers += linear(width, out_dim)
        self.net = nn.Sequential(*layers)
        self.num_members, self.out_dim = num_members, out_dim

    def _output(self, x: torch.Tensor) -> torch.Tensor:
        return x.squeeze(-1) if self.out_dim == 1 else x

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Q values [E, B] (or [E, B, out_dim]) of ``obs`` [B, obs_dim] and ``action``
        [B, act_dim]."""
        return self._output(self.net(torch.cat([obs, action], dim=-1)))

    def sampled(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q values [E, B, K] of K actions per state, ``actions`` [B, K, act_dim] at ``obs``
        [B, obs_dim]: ``forward`` on every (state, action) row, with the first layer's state
        columns multiplied once per state rather than once per action (CQL's sampled actions).
        A network that starts with batch renormalization (statistics over the rows) takes
        the rows as they are."""
        b, k, act_dim = actions.shape
        first = self.net[0]
        if not isinstance(first, EnsembleLinear):
            flat = self.forward(obs.repeat_interleave(k, 0), actions.reshape(b * k, act_dim))
            return flat.view(self.num_members, b, k, *flat.shape[2:])
        obs_dim = first.in_dim - act_dim
        per_state = ensemble_linear(obs, first.weight[:, :obs_dim], first.bias)  # [E, B, H]
        per_action = torch.matmul(actions.reshape(b * k, act_dim),
                                  first.weight[:, obs_dim:])  # [E, B K, H]
        hidden = per_action.view(self.num_members, b, k, -1) + per_state[:, :, None]
        out = self._output(self.net[1:](hidden.view(self.num_members, b * k, -1)))
        return out.view(self.num_members, b, k, *out.shape[2:])

    def member(self, obs: torch.Tensor, action: torch.Tensor, i: int = 0) -> torch.Tensor:
        """Q values [B] (or [B, out_dim]) of member ``i`` alone (TD3's actor reads only the
        first critic: half the arithmetic of evaluating the ensemble and dropping the rest)."""
        x = torch.cat([obs, action], dim=-1)
        for layer in self.net:
            x = layer.member(x, i) if hasattr(layer, "member") else layer(x)
        return self._output(x)
