"""Action tokenizer (OpenVLA's scheme, Kim et al. 2024, sec. 3.2): every action dimension,
scaled to [-1, 1] by the action bounds and clipped, falls into one of ``bins`` uniform bins;
a token decodes to its bin's centre, so the round trip is off by at most half a bin."""

from __future__ import annotations

import torch


class ActionTokenizer:
    """Continuous actions [..., D] <-> tokens [..., D] in ``range(bins)``.

    Args:
        low, high: [A] action bounds; a chunk of K actions (D = K * A) repeats them.
        bins: tokens per dimension (256, as OpenVLA).
    """

    def __init__(self, low: torch.Tensor, high: torch.Tensor, bins: int = 256) -> None:
        if bins < 2:
            raise ValueError(f"bins must be >= 2, got {bins}")
        self.low = torch.as_tensor(low, dtype=torch.float32).flatten()
        self.high = torch.as_tensor(high, dtype=torch.float32).flatten()
        if self.low.shape != self.high.shape or not bool((self.high > self.low).all()):
            raise ValueError(f"action bounds must have equal shapes and high > low, got "
                             f"{self.low.tolist()} and {self.high.tolist()}")
        self.bins = int(bins)

    def _bounds(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Bounds [D] for a last dimension D (a multiple of the action size: a chunk)."""
        a, d = self.low.numel(), x.shape[-1]
        if d % a:
            raise ValueError(f"last dimension {d} is not a multiple of the action size {a}")
        return (self.low.to(x.device).repeat(d // a), self.high.to(x.device).repeat(d // a))

    def encode(self, action: torch.Tensor) -> torch.Tensor:
        """Tokens [..., D] long of ``action`` [..., D] (clipped to the bounds first)."""
        low, high = self._bounds(action)
        unit = ((action.float() - low) / (high - low)).clamp(0.0, 1.0)
        return (unit * self.bins).long().clamp(max=self.bins - 1)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Actions [..., D] float32: the bin centres of ``tokens`` [..., D]."""
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.bins):
            raise ValueError(f"tokens must be in [0, {self.bins}), got "
                             f"[{int(tokens.min())}, {int(tokens.max())}]")
        low, high = self._bounds(tokens)
        return low + (tokens.float() + 0.5) / self.bins * (high - low)

    def half_bin(self) -> torch.Tensor:
        """[A] half a bin's width per action dimension: the round trip's error bound."""
        return (self.high - self.low) / (2 * self.bins)
