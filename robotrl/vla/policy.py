"""The token-policy interface: observation groups in, a chunk of action tokens out, decoded
autoregressively; per-token log-probabilities at a sampling temperature for GRPO, token
cross-entropy for behaviour cloning.

A subclass supplies three model calls over action tokens ``t_0 .. t_{D-1}`` (D = chunk x action
size), each in ``range(bins)``:

* ``start(obs) -> (cache, logits [N, bins])``: read the observation (and a begin-of-action
  token), return the model's state and the logits of ``t_0``;
* ``extend(cache, token [N], i) -> (cache, logits [N, bins])``: append ``t_i``, return the
  logits of ``t_{i+1}`` (a KV cache makes this one position's work);
* ``forced(obs, tokens [N, D]) -> logits [N, D, bins]``: all positions at once (teacher forcing),
  equal to what ``start``/``extend`` give step by step (tested).

``sample`` draws from ``softmax(logits / temperature)`` and returns the log-probabilities of that
distribution; ``evaluate`` recomputes them (and the entropies) with gradients; the GRPO ratio is
taken per token between the two (Kim et al. 2025 and Li et al. 2025, "SimpleVLA-RL", sample and
score at the same temperature). ``reference`` freezes the policy as it is now for GRPO's KL term.
"""

from __future__ import annotations

import copy
import dataclasses
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from robotrl.types import Obs
from robotrl.vla.tokenizer import ActionTokenizer


class TokenPolicy(nn.Module, ABC):
    """Observation -> D action tokens; see the module docstring.

    Attributes:
        cfg: the policy family's config.
        tokenizer: actions <-> tokens.
        num_tokens: D, tokens per decision (chunk x action size).
        temperature: the sampling temperature (log-probabilities are those of the tempered
            distribution).
        arch: what rebuilds the policy from a checkpoint (``kind`` and its config).
    """

    observations: ClassVar[tuple[str, ...]] = ("policy", "tokens", "image")
    """Observation groups the policy reads."""
    normalizer = None  # read by learners that fold observations into a normalizer

    feature_dim: int = 0
    """Width of ``forced_features``' features (0: the policy has none)."""

    kind: ClassVar[str]
    """Registry name (``robotrl.registry.POLICIES``), stored in ``arch``."""
    config_cls: ClassVar[type]
    """The config dataclass (fields ``chunk``, ``bins``, ``temperature``, ``patch`` at least)."""

    def __init__(self, cfg: Any, image_shape: tuple[int, ...], words: int, proprio_dim: int,
                 action_low: torch.Tensor, action_high: torch.Tensor) -> None:
        """Args: ``image_shape`` (C, H, W), ``words`` instruction length, ``proprio_dim`` P,
        ``action_low``/``action_high`` [A] the bounds of one action (a chunk repeats them).
        Sets ``prefix_len``: image patches + words + proprioception + BOS."""
        super().__init__()
        if cfg.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {cfg.temperature}")
        c, h, w = image_shape
        if h % cfg.patch or w % cfg.patch:
            raise ValueError(f"image {h}x{w} is not a multiple of policy.patch={cfg.patch}")
        self.cfg = cfg
        self.tokenizer = tokenizer = ActionTokenizer(action_low, action_high, cfg.bins)
        self.num_tokens = cfg.chunk * tokenizer.low.numel()
        self.temperature = float(cfg.temperature)
        self.register_buffer("low", tokenizer.low.repeat(cfg.chunk))
        self.register_buffer("high", tokenizer.high.repeat(cfg.chunk))
        self.prefix_len = (h // cfg.patch) * (w // cfg.patch) + words + 1 + 1
        self.arch: dict[str, Any] = {
            "kind": self.kind, "config": dataclasses.asdict(cfg), "image_shape": list(image_shape),
            "words": int(words), "proprio_dim": int(proprio_dim),
            "action_low": tokenizer.low.tolist(), "action_high": tokenizer.high.tolist()}

    @classmethod
    def from_arch(cls, arch: dict[str, Any]) -> TokenPolicy:
        """Rebuild (untrained) from ``arch``."""
        return cls(cls.config_cls(**arch["config"]), tuple(arch["image_shape"]), arch["words"],
                   arch["proprio_dim"], torch.tensor(arch["action_low"]),
                   torch.tensor(arch["action_high"]))

    # ------------------------------------------------------------------ model calls
    @abstractmethod
    def start(self, obs: Obs) -> tuple[Any, torch.Tensor]:
        """(cache, logits of the first token [N, bins]) after reading ``obs``."""

    @abstractmethod
    def extend(self, cache: Any, token: torch.Tensor, index: int) -> tuple[Any, torch.Tensor]:
        """(cache, logits of token ``index + 1`` [N, bins]) after appending ``token`` [N]."""

    @abstractmethod
    def forced(self, obs: Obs, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [N, D, bins] of every token given the ones before it (``tokens`` [N, D])."""

    def forced_features(self, obs: Obs, tokens: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """(``forced``'s logits [N, D, bins], features [N, feature_dim]: what the policy computes
        for the first action token (``policy=vla``: the hidden state of the position that
        predicts it and the image keypoints' positions)), for training-time auxiliary heads
        (issue 47)."""
        raise NotImplementedError(f"policy {self.kind!r} exposes no features for auxiliary "
                                  "losses; policy=vla does")

    # ------------------------------------------------------------------ decoding
    def _decode(self, obs: Obs, generator: torch.Generator | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens [N, D] (sampled with ``generator``, greedy when None) and their tempered
        log-probabilities [N, D]."""
        cache, logits = self.start(obs)
        tokens, logps = [], []
        for i in range(self.num_tokens):
            logp = F.log_softmax(logits.float() / self.temperature, dim=-1)
            if generator is None:
                token = logp.argmax(-1)
            else:
                token = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
            tokens.append(token)
            logps.append(logp.gather(-1, token[:, None]).squeeze(-1))
            if i + 1 < self.num_tokens:
                cache, logits = self.extend(cache, token, i)
        return torch.stack(tokens, 1), torch.stack(logps, 1)

    def sample(self, obs: Obs, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(action [N, D] bin centres, per-token log-probabilities [N, D]) drawn at the
        sampling temperature with ``generator``."""
        tokens, logp = self._decode(obs, generator)
        return self.tokenizer.decode(tokens), logp

    def deterministic(self, obs: Obs) -> torch.Tensor:
        """Greedy decoding: action [N, D]."""
        return self.tokenizer.decode(self._decode(obs, None)[0])

    def evaluate(self, obs: Obs, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probabilities, entropies), each [N, D], of ``action`` [N, D]'s tokens under the
        tempered distribution, with gradients."""
        tokens = self.tokenizer.encode(action)
        return self.score(self.forced(obs, tokens), tokens)

    def score(self, logits: torch.Tensor, tokens: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probabilities of ``tokens`` [N, D], entropies [N, D]) under the tempered
        distribution of ``logits`` [N, D, bins]."""
        logp = F.log_softmax(logits.float() / self.temperature, dim=-1)
        entropy = -(logp.exp() * logp).sum(-1)
        return logp.gather(-1, tokens[..., None]).squeeze(-1), entropy

    def reference(self) -> nn.Module:
        """A frozen module whose ``evaluate(obs, action)`` gives this policy's present
        log-probabilities from now on, however the policy is trained after (GRPO's KL
        reference). Here a frozen deep copy; a subclass may share the weights it never trains
        (``HFTokenPolicy`` with LoRA adapters). Call it before building the optimizer: a
        subclass may restructure its parameters."""
        return copy.deepcopy(self).requires_grad_(False)

    def log_prob(self, obs: Obs, action: torch.Tensor) -> torch.Tensor:
        """[N, D] per-token log-probabilities of ``action`` at the sampling temperature."""
        return self.evaluate(obs, action)[0]

    def bc_loss(self, obs: Obs, action: torch.Tensor
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Token cross-entropy of the demonstrated ``action`` [N, D] (temperature 1):
        ``(loss [], {"loss/bc", "train/token_accuracy"})``."""
        tokens = self.tokenizer.encode(action)
        return token_cross_entropy(self.forced(obs, tokens), tokens)


def token_cross_entropy(logits: torch.Tensor, tokens: torch.Tensor
                        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean cross-entropy of ``tokens`` [N, D] under ``logits`` [N, D, bins] (temperature 1):
    ``(loss [], {"loss/bc", "train/token_accuracy"})``."""
    logits = logits.float()
    loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    accuracy = (logits.argmax(-1) == tokens).float().mean()
    return loss, {"loss/bc": loss.detach(), "train/token_accuracy": accuracy.detach()}
