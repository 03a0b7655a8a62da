"""MCEP (Xu et al. 2023, "Mildly Constrained Evaluation Policy for Offline RL", arXiv
2306.03680): a plug-in over TD3+BC and AWAC.

The constraint an offline method needs for stable value learning is stronger than the one
that is best for acting. MCEP keeps the algorithm as it is (its "target" policy, strongly
constrained, is the only one value learning sees) and trains a second, evaluation policy on the
same critic with a milder constraint; only the evaluation policy acts and is exported.
Defaults are the authors' (egg-west/MCEP ``configs/offline_config.py``): TD3+BC alpha 2.5 for
the target policy, 10 for the evaluation policy; AWAC lambda 1.0 and 0.6.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
from torch import nn

from robotrl.algos.offline.awac import AWAC, AWACConfig
from robotrl.algos.offline.td3bc import TD3BC, TD3BCConfig
from robotrl.optim import adam

EVAL_KEYS = ("loss/eval_actor", "train/grad_norm/eval_actor")


class _EvaluationPolicy:
    """The mixin: a copy of ``actor`` trained by ``_eval_actor_loss``, acting and exported."""

    actor: nn.Module
    modules: dict[str, nn.Module]
    optimizers: dict[str, torch.optim.Optimizer]

    def _init_evaluation_policy(self, lr: float) -> None:
        self.eval_policy = copy.deepcopy(self.actor)
        self.eval_opt = adam(self.eval_policy.parameters(), lr)
        self.eval_step = self.step("eval_actor", self.eval_opt)  # type: ignore[attr-defined]
        self.modules["eval_policy"], self.optimizers["eval_policy"] = self.eval_policy, self.eval_opt

    def eval_actor(self) -> nn.Module:
        return self.eval_policy

    def _train_evaluation_policy(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        loss = self._eval_actor_loss(batch)
        return {"loss/eval_actor": loss.detach(),
                "train/grad_norm/eval_actor": self.eval_step(loss, check=False)}

    def _eval_actor_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError


@dataclasses.dataclass
class TD3BCMCEPConfig(TD3BCConfig):
    """TD3+BC with an MCEP evaluation policy."""

    eval_alpha: float = 10.0
    """alpha of the evaluation policy's TD3+BC loss (milder than ``alpha``: less cloning)."""


class TD3BCMCEP(_EvaluationPolicy, TD3BC):
    """TD3+BC; on every actor update the evaluation policy takes its own step."""

    NAME = "TD3+BC-MCEP"
    METRIC_KEYS = TD3BC.METRIC_KEYS + EVAL_KEYS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_evaluation_policy(self.cfg.actor_lr)

    def _eval_actor_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._actor_loss(self.eval_policy, batch, self.cfg.eval_alpha)[0]

    def _update_actor(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        metrics = super()._update_actor(batch)
        metrics.update(self._train_evaluation_policy(batch))
        return metrics


@dataclasses.dataclass
class AWACMCEPConfig(AWACConfig):
    """AWAC with an MCEP evaluation policy; the authors' AWAC-MCEP settings."""

    temperature: float = 1.0
    """lambda of the target policy's advantage weights."""
    eval_lambda: float = 0.6
    """Weight of the evaluation policy's log-likelihood term (MCEP eq. 8)."""
    max_weight: float = 1000.0
    """Clip of the target policy's exponentiated advantages."""
    actor_lr: float = 3e-5
    """Adam learning rate of both policies."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of the networks."""


class AWACMCEP(_EvaluationPolicy, AWAC):
    """AWAC; the evaluation policy maximizes Q with a log-likelihood anchor to the data:
    mean(-min(mean_e Q_e(s, a~pi_e), 1e4) - lambda_e log pi_e(a_data | s)) (MCEP eq. 8)."""

    NAME = "AWAC-MCEP"
    METRIC_KEYS = AWAC.METRIC_KEYS + EVAL_KEYS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_evaluation_policy(self.cfg.actor_lr)

    def _eval_actor_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        obs = batch["obs"]
        action = self.eval_policy.sample(obs, self.generator)  # reparameterized
        q = self.critic(obs, action).mean(0).clamp(max=1e4)
        return (-q - self.cfg.eval_lambda * self.eval_policy.log_prob(obs, batch["action"])).mean()

    def _update_once(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        metrics = super()._update_once(batch)
        self.critic.requires_grad_(False)
        metrics.update(self._train_evaluation_policy(batch))
        self.critic.requires_grad_(True)
        return metrics
