"""The export contract: a frozen, deterministic actor from raw observations to bounded actions.

Every algorithm exposes ``export_actor() -> DeterministicActor``; ``robotrl.sim2real`` turns it
into an ONNX or TorchScript file. The module holds everything between the sensor reading and
the actuator command, so a controller needs no robotrl code (RSL-RL's exporter bakes the
normalizer in the same way):

    obs [B, obs_dim] float32 (raw, as the env returns it)
      -> (obs - mean) / sqrt(var + eps), clipped to [-clip, clip]   (RunningNormalizer)
      -> network                                                      [B, act_dim]
      -> "clip": clamp to [low, high]                                 (PPO, TRPO)
         "tanh": center + half_range * tanh(x)                        (SAC)
      -> action [B, act_dim] float32
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from robotrl.nn.normalizer import RunningNormalizer

OUTPUT_TRANSFORMS: tuple[str, ...] = ("clip", "tanh")
"""How the network output becomes an action inside the bounds."""


class FirstColumns(nn.Module):
    """Keeps the first ``k`` features: ``x [..., m] -> [..., k]`` (a mean head that also
    predicts log stds)."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., : self.k]


class DeterministicActor(nn.Module):
    """Raw observation [B, obs_dim] -> action [B, act_dim], float32, with frozen parameters.

    The module copies ``network`` and the normalizer statistics at construction: later training
    does not change an exported actor.

    Attributes:
        obs_dim, act_dim: input and output widths.
        output: one of ``OUTPUT_TRANSFORMS``.
        mean, std: [obs_dim] float32 buffers; ``std = sqrt(var + eps)`` is evaluated in float64
            and then cast, exactly as ``RunningNormalizer.forward`` does on float32 input, so
            the actor reproduces the algorithm's ``act_deterministic`` bit for bit.
        clip: observation clip (``inf`` without a normalizer).
        low, high: [act_dim] action bounds.
    """

    def __init__(
        self,
        network: nn.Module,
        obs_dim: int,
        action_low: torch.Tensor,
        action_high: torch.Tensor,
        output: str = "clip",
        normalizer: RunningNormalizer | None = None,
    ) -> None:
        """Args:
        network: normalized obs [B, obs_dim] -> [B, act_dim] (pre-clip or pre-tanh).
        obs_dim: observation width.
        action_low, action_high: [act_dim] bounds.
        output: "clip" or "tanh".
        normalizer: the algorithm's observation normalizer, or None (observations pass as is).
        """
        super().__init__()
        if output not in OUTPUT_TRANSFORMS:
            raise ValueError(
                f"unknown output transform {output!r}; known: {', '.join(OUTPUT_TRANSFORMS)}"
            )
        low = torch.as_tensor(action_low, dtype=torch.float32).detach().cpu().flatten()
        high = torch.as_tensor(action_high, dtype=torch.float32).detach().cpu().flatten()
        if low.shape != high.shape or not bool((low <= high).all()):
            raise ValueError(f"action bounds must have one shape and low <= high: {low}, {high}")
        self.obs_dim = int(obs_dim)
        self.act_dim = int(low.numel())
        self.output = output
        self.network = copy.deepcopy(network).cpu().float().eval().requires_grad_(False)
        if normalizer is not None:
            if normalizer.mean.shape != (self.obs_dim,):
                raise ValueError(
                    f"normalizer has {tuple(normalizer.mean.shape)} statistics, obs_dim is "
                    f"{self.obs_dim}"
                )
            mean = normalizer.mean.detach().cpu().to(torch.float32)
            std = torch.sqrt(normalizer.var.detach().cpu() + normalizer.eps).to(torch.float32)
            self.eps = float(normalizer.eps)
            self.clip = float(normalizer.clip)
        else:
            mean, std = torch.zeros(self.obs_dim), torch.ones(self.obs_dim)
            self.eps, self.clip = 0.0, float("inf")
        self.normalize = normalizer is not None
        self.register_buffer("mean", mean.clone())
        self.register_buffer("std", std.clone())
        self.register_buffer("low", low.clone())
        self.register_buffer("high", high.clone())
        self.register_buffer("center", (high + low) / 2)
        self.register_buffer("half_range", (high - low) / 2)
        self.eval()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``obs`` [B, obs_dim] float32 -> action [B, act_dim] float32."""
        x = obs
        if self.normalize:  # a Python constant: traced and exported as a fixed graph
            x = torch.clamp((x - self.mean) / self.std, -self.clip, self.clip)
        y = self.network(x)
        if self.output == "tanh":
            return self.center + self.half_range * torch.tanh(y)
        # min/max rather than clamp: ONNX Clip takes only scalar bounds
        return torch.maximum(torch.minimum(y, self.high), self.low)

    def example_input(self, batch: int = 2) -> torch.Tensor:
        """A [batch, obs_dim] float32 input for tracing (the normalizer mean, or zeros)."""
        return self.mean.expand(batch, self.obs_dim).clone()
