"""A small vision-language-action transformer, written here: image patches, instruction words and
proprioception form a prefix; action tokens follow, decoded autoregressively with a KV cache,
batched over worlds (one decoder, pre-LayerNorm blocks). Attention is a prefix-LM's
(PaliGemma's): the prefix attends both ways, so an image patch can already read the instruction
in the first layer, and action tokens attend causally."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from robotrl.types import Obs
from robotrl.vla.policy import TokenPolicy


@dataclasses.dataclass
class VLAConfig:
    """The small VLA transformer (``policy=vla``)."""

    chunk: int = 2
    """K: actions per decision (an action chunk; the env steps K times per decision)."""
    bins: int = 256
    """Tokens per action dimension (OpenVLA's 256)."""
    temperature: float = 1.0
    """Sampling temperature; GRPO's log-probabilities are those of the tempered distribution."""
    dim: int = 64
    """Model width."""
    layers: int = 2
    """Transformer blocks."""
    heads: int = 4
    """Attention heads."""
    patch: int = 8
    """Image patch side (pixels); the image side must be a multiple."""
    vocab_size: int = 32
    """Instruction word ids must be below this."""
    keypoints: int = 16
    """Spatial-softmax keypoint tokens beside the patches (Levine et al. 2016): each is the
    expected image position of one learned per-pixel feature; 0: patches only."""
    film: bool = False
    """FiLM-condition the per-pixel features of the patches and keypoints on the instruction
    (Perez et al. 2018): a scale and shift from the mean of its word embeddings, zero at
    initialization, so a keypoint can find the named object (issue 47). False: the image is
    read without the words, which only the transformer blocks combine with it."""

    def __post_init__(self) -> None:
        if self.keypoints < 0:
            raise ValueError(f"policy.keypoints must be >= 0, got {self.keypoints}")
        for name in ("chunk", "bins", "dim", "layers", "heads", "patch", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"policy.{name} must be >= 1, got {getattr(self, name)}")
        if self.dim % self.heads:
            raise ValueError(f"policy.dim ({self.dim}) must be a multiple of policy.heads "
                             f"({self.heads})")
        if self.temperature <= 0:
            raise ValueError(f"policy.temperature must be > 0, got {self.temperature}")


class Block(nn.Module):
    """Pre-LN transformer block; ``forward`` takes and returns the layer's (k, v) cache."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None,
                mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``x`` [N, S, dim] new positions after the ``cache`` ([N, heads, S', dim / heads]
        keys and values of the earlier ones); without a cache, ``mask`` [S, S] bool says which
        positions each one attends to (None: all)."""
        n, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(n, s, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        if cache is not None and s > 1:
            raise ValueError("several new positions after a cache are not supported")
        # one new position after a cache sees everything before it
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=None if cache is not None
                                             else mask)
        x = x + self.out(att.transpose(1, 2).reshape(n, s, d))
        return x + self.mlp(self.ln2(x)), (k, v)


class VLATransformer(TokenPolicy):
    """Prefix [image patches, image keypoints, instruction words, proprioception, BOS] then
    action tokens.

    Observation groups: ``image`` [N, 3, H, W] uint8, ``tokens`` [N, W] long (0 pads),
    ``policy`` [N, P] float (proprioception).
    """

    kind = "vla"
    config_cls = VLAConfig

    def __init__(self, cfg: VLAConfig, image_shape: tuple[int, ...], words: int,
                 proprio_dim: int, action_low: torch.Tensor, action_high: torch.Tensor) -> None:
        super().__init__(cfg, image_shape, words, proprio_dim, action_low, action_high)
        c = image_shape[0]
        d = cfg.dim
        # a per-pixel layer sees each pixel's colour with its (x, y) in [-1, 1] (CoordConv, Liu
        # et al. 2018) before the patches are embedded: a linear patch embedding alone sums
        # colours over the patch and cannot say where in it an object is, and a patch is wider
        # than what a policy must resolve (objects are a few pixels)
        h, w = image_shape[1:]
        grid = torch.stack(torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w),
                                          indexing="ij")[::-1])
        self.register_buffer("coords", grid[None], persistent=False)
        self.pixels = nn.Sequential(nn.Linear(c + 2, d // 4), nn.GELU())
        self.patches = nn.Linear(cfg.patch**2 * (d // 4), d)
        self.prefix_len += cfg.keypoints
        if cfg.keypoints:
            self.heat = nn.Sequential(nn.Linear(c + 2, d // 2), nn.GELU(),
                                      nn.Linear(d // 2, cfg.keypoints))
            self.keypoint = nn.Linear(2, d)
            self.keypoint_id = nn.Parameter(torch.randn(cfg.keypoints, d) * 0.02)
        self.words = nn.Embedding(cfg.vocab_size, d)
        self.proprio = nn.Sequential(nn.Linear(proprio_dim, d), nn.LayerNorm(d))
        self.actions = nn.Embedding(cfg.bins + 1, d)  # the last id is BOS
        self.pos = nn.Parameter(torch.randn(self.prefix_len + self.num_tokens, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, cfg.heads) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(d)
        self.feature_dim = d + 2 * cfg.keypoints  # forced_features: hidden state, keypoints
        self.head = nn.Linear(d, cfg.bins)
        nn.init.zeros_(self.head.weight)  # uniform initial action distribution
        nn.init.zeros_(self.head.bias)
        if cfg.film:  # built last: the other parameters are initialized as without it
            self.film = nn.Linear(d, 2 * (d // 4 + (d // 2 if cfg.keypoints else 0)))
            nn.init.zeros_(self.film.weight)
            nn.init.zeros_(self.film.bias)

    def _prefix(self, obs: Obs) -> torch.Tensor:
        """[N, prefix_len, dim] embeddings of the observation and BOS."""
        return self._prefix_keypoints(obs)[0]

    def _prefix_keypoints(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """(``_prefix``, [N, 2 keypoints] the keypoints' image positions in [-1, 1])."""
        image = obs["image"].float() / 255.0 - 0.5
        image = torch.cat([image, self.coords.expand(len(image), -1, -1, -1)], 1)
        image = image.permute(0, 2, 3, 1)  # [N, H, W, C + 2], channels last
        words = self.words(obs["tokens"].long())
        pixels = self.pixels(image)
        if self.cfg.film:  # [N, 1, 1, F] scales and shifts from the instruction's words
            real = (obs["tokens"] != 0).float()[..., None]
            bag = (words * real).sum(1) / real.sum(1).clamp_min(1)
            film = self.film(bag)[:, None, None]
            f = pixels.shape[-1]
            pixels = pixels * (1 + film[..., :f]) + film[..., f:2 * f]
        n, h, w, f = pixels.shape
        p = self.cfg.patch
        patches = self.patches(pixels.reshape(n, h // p, p, w // p, p, f).transpose(2, 3)
                               .reshape(n, (h // p) * (w // p), p * p * f))
        if self.cfg.keypoints:  # spatial softmax: where each feature's heat map peaks
            hidden = self.heat[1](self.heat[0](image))
            if self.cfg.film:  # the heat maps' hidden features too: a keypoint per meaning
                g = hidden.shape[-1]
                hidden = hidden * (1 + film[..., 2 * f:2 * f + g]) + film[..., 2 * f + g:]
            # logits x10: near-uniform heat maps at initialization put every keypoint at the
            # image centre and give the features almost no gradient
            heat = (10 * self.heat[2](hidden)).reshape(n, h * w, -1).softmax(1)  # [N, HW, K]
            where = heat.transpose(1, 2) @ self.coords.flatten(2)[0].T  # [N, K, 2]
            patches = torch.cat([patches, self.keypoint(where) + self.keypoint_id], 1)
        else:
            where = patches.new_zeros(n, 0, 2)
        proprio = self.proprio(obs["policy"].float())[:, None]
        bos = self.actions.weight[-1].expand(len(image), 1, -1)
        return torch.cat([patches, words, proprio, bos], 1), where.flatten(1)

    def _run(self, x: torch.Tensor, caches: list[Any] | None
             ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        hidden, new = self._trunk(x, caches)
        return self.head(hidden), new

    def _trunk(self, x: torch.Tensor, caches: list[Any] | None
               ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """The blocks and final LayerNorm: ([N, S, dim] hidden states, the caches)."""
        mask = None
        if caches is None and x.shape[1] > self.prefix_len:  # teacher forcing: prefix-LM mask
            s = x.shape[1]
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
            mask[: self.prefix_len, : self.prefix_len] = True
        new = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, None if caches is None else caches[i], mask)
            new.append(kv)
        return self.ln(x), new

    def start(self, obs: Obs) -> tuple[Any, torch.Tensor]:
        x = self._prefix(obs) + self.pos[: self.prefix_len]
        logits, cache = self._run(x, None)
        return cache, logits[:, -1]

    def extend(self, cache: Any, token: torch.Tensor, index: int) -> tuple[Any, torch.Tensor]:
        x = self.actions(token)[:, None] + self.pos[self.prefix_len + index]
        logits, cache = self._run(x, cache)
        return cache, logits[:, -1]

    def forced(self, obs: Obs, tokens: torch.Tensor) -> torch.Tensor:
        return self.forced_features(obs, tokens)[0]

    def forced_features(self, obs: Obs, tokens: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        prefix, where = self._prefix_keypoints(obs)
        x = torch.cat([prefix, self.actions(tokens[:, :-1])], 1)
        hidden, _ = self._trunk(x + self.pos[: x.shape[1]], None)
        features = torch.cat([hidden[:, self.prefix_len - 1], where], 1)
        return self.head(hidden)[:, self.prefix_len - 1:], features

