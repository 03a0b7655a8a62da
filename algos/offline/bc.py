"""Behaviour cloning: regress the dataset's actions (the baseline every offline method must
beat; CORL's ``any_percent_bc`` on 100% of the data)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from robotrl.algos.offline.base import OfflineConfig, OfflineLearner, TanhActor
from robotrl.algos.offline.losses import bc_loss
from robotrl.algos.optim import adam


@dataclasses.dataclass
class BCConfig(OfflineConfig):
    """BC: a deterministic tanh actor trained by mean squared error."""


class BC(OfflineLearner):
    """a = tanh(net(obs)) fitted to the dataset's actions (scaled to [-1, 1])."""

    NAME = "BC"
    METRIC_KEYS = ("loss/actor", "train/grad_norm/actor")

    def __init__(self, obs_dim: int, action_low: torch.Tensor, action_high: torch.Tensor,
                 cfg: BCConfig, device: str | torch.device = "cpu", seed: int | None = None) -> None:
        super().__init__(obs_dim, action_low, action_high, cfg, device, seed)
        self.actor = TanhActor(obs_dim, self.act_dim, cfg.hidden, cfg.activation).to(self.device)
        self.actor_opt = adam(self.actor.parameters(), cfg.actor_lr)
        self.actor_step = self.step("actor", self.actor_opt)
        self.modules["actor"], self.optimizers["actor"] = self.actor, self.actor_opt

    def _update_once(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        loss, metrics = bc_loss(self.actor(batch["obs"]), batch["action"])
        metrics[self.actor_step.metric] = self.actor_step(loss, check=False)
        return metrics
