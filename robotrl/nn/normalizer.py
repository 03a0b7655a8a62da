"""Running mean/variance normalizer, shared by env wrappers, algorithms and exporters."""

from __future__ import annotations

import torch
from torch import nn

from robotrl import distributed


class RunningNormalizer(nn.Module):
    """Normalizes ``x [..., dim]`` by a running mean and variance (parallel Welford update).

    Statistics are buffers, so they travel with ``state_dict`` and ``.to(device)``.
    """

    def __init__(self, dim: int, eps: float = 1e-8, clip: float = 10.0) -> None:
        super().__init__()
        self.eps = eps
        self.clip = clip
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(eps, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Fold a batch ``x [B, dim]`` into the statistics (Chan et al. 1979); in a
        data-parallel run, the batches of every rank (``robotrl.distributed``)."""
        x = x.reshape(-1, self.mean.shape[0]).to(torch.float64)
        if distributed.active():  # a data-parallel run folds every rank's batch in alike
            sums = distributed.total(torch.cat([x.new_tensor([x.shape[0]]), x.sum(0),
                                                x.square().sum(0)]))
            n = int(sums[0].item())
            if n == 0:
                return
            batch_mean = sums[1:1 + x.shape[1]] / n
            batch_var = (sums[1 + x.shape[1]:] / n - batch_mean.square()).clamp_min(0.0)
        else:
            n = x.shape[0]
            if n == 0:
                return
            batch_mean = x.mean(dim=0)
            batch_var = x.var(dim=0, unbiased=False)
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta.square() * self.count * n / total
        self.mean.add_(delta * n / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalized and clipped ``x``, same shape and dtype."""
        mean = self.mean.to(x.dtype)
        std = torch.sqrt(self.var + self.eps).to(x.dtype)
        return torch.clamp((x - mean) / std, -self.clip, self.clip)
