"""CrossQ (Bhatt et al., ICLR 2024, "CrossQ: Batch Normalization in Deep Reinforcement Learning
for Greater Sample Efficiency and Simplicity").

SAC without target networks: Batch Renormalization before every linear layer of the critics
and the actor, and the current and next state-actions go through the critics as **one** batch,
so the normalization statistics are those of their mixture and the TD target comes from the
live critics (``robotrl.nn.batch_renorm``). Wider critics, Adam with beta1 = 0.5, the actor
every third critic update, learning rates 1e-3; one update per environment step. The rest
(replay, squashed Gaussian actor, automatic temperature, the off-policy runner, checkpoints,
export) is SAC's:

    action = crossq.act(obs)                       # actor in eval mode: running statistics
    out = env.step(action)
    crossq.process_env_step(out.reward, out.terminated, out.truncated, out.info["final_obs"])
    metrics = crossq.update(progress)

Networks stay in eval mode outside the update; inside, the critics normalize with batch
statistics for the TD loss (the joint batch) and with running ones for the actor loss, and the
actor with batch statistics for its own loss (as the paper's and sb3-contrib's CrossQ).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from robotrl.algos.sac import SAC, SACConfig, soft_td_target
from robotrl.nn.batch_renorm import RENORM_VARIANTS, BatchRenorm, training
from robotrl.nn.ensemble import EnsembleQ
from robotrl.nn.linear import Linear
from robotrl.nn.mlp import make_activation
from robotrl.nn.squashed_gaussian import SquashedGaussianActor
from robotrl.optim import GradientStep, adam


@dataclass
class CrossQConfig(SACConfig):
    """CrossQ hyperparameters: SAC's fields (``tau`` excepted: there are no target networks)
    with the paper's defaults, plus the Batch Renormalization settings.

    Defaults follow the paper and sb3-contrib where they agree (lr 1e-3, actor every 3rd
    update, beta1 0.5, momentum 0.01, eps 1e-3); the critics are 256 wide where the paper uses
    2048 and sb3-contrib 1024: on a 2-core CPU a 512-wide critic halves the updates per second
    (benchmarks/README.md); on a GPU, widen them (``algo.critic_hidden=[1024,1024]``).
    """

    actor_lr: float = 1e-3
    critic_lr: float = 1e-3
    alpha_lr: float = 1e-3
    actor_update_interval: int = 3
    learning_starts: int = 5_000
    critic_hidden: tuple[int, ...] = (256, 256)
    adam_beta1: float = 0.5
    """Adam's first-moment rate for every optimizer (the paper's 0.5; Adam's default 0.9)."""
    alpha_adam_beta1: float | None = None
    """Adam's first-moment rate for the temperature; None: ``adam_beta1`` (sb3-contrib: 0.9,
    its temperature optimizer is torch's default Adam)."""
    renorm_momentum: float = 0.01
    """Rate of the running statistics of every Batch Renormalization layer."""
    renorm_eps: float = 1e-3
    """Added to variances before the square root."""
    renorm_warmup: int = 100_000
    """Training forwards of a layer with plain batch normalization before the
    renormalization corrections start (sb3-contrib's renorm_warmup_steps W gives W + 1
    plain forwards: W + 1 here)."""
    renorm_variant: str = "ioffe"
    """Batch Renormalization arithmetic (``robotrl.nn.batch_renorm.RENORM_VARIANTS``): ioffe
    (the paper's) or sb3_contrib (its unbiased batch variance and shifted-mean correction)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tau != SACConfig.tau:
            raise ValueError("CrossQ has no target networks, so tau does not apply; remove "
                             f"algo.tau (got {self.tau})")
        if not 0.0 <= self.adam_beta1 < 1.0:
            raise ValueError(f"adam_beta1 must be in [0, 1), got {self.adam_beta1}")
        if self.alpha_adam_beta1 is not None and not 0.0 <= self.alpha_adam_beta1 < 1.0:
            raise ValueError(f"alpha_adam_beta1 must be in [0, 1) or null, got "
                             f"{self.alpha_adam_beta1}")
        if self.renorm_warmup < 0:
            raise ValueError(f"renorm_warmup must be >= 0, got {self.renorm_warmup}")
        if self.renorm_variant not in RENORM_VARIANTS:
            raise ValueError(f"unknown renorm_variant {self.renorm_variant!r}; known: "
                             f"{', '.join(RENORM_VARIANTS)}")

    def renorm(self) -> dict[str, Any]:
        """``BatchRenorm`` arguments."""
        return {"momentum": self.renorm_momentum, "eps": self.renorm_eps,
                "warmup_steps": self.renorm_warmup, "variant": self.renorm_variant}


class CrossQ(SAC):
    """SAC with batch-renormalized networks and no target critics; see the module docstring."""

    name = "CrossQ"
    target_critics = False
    cfg: CrossQConfig

    @property
    def betas(self) -> tuple[float, float]:  # type: ignore[override]
        return (self.cfg.adam_beta1, 0.999)

    def _networks(self, state_dim: int, act_dim: int) -> tuple[SquashedGaussianActor, EnsembleQ]:
        cfg = self.cfg
        layers: list[nn.Module] = []
        width = self.obs_dim
        for size in cfg.actor_hidden:
            layers += [BatchRenorm(width, **cfg.renorm()), Linear(width, size),
                       make_activation(cfg.activation)]
            width = size
        layers += [BatchRenorm(width, **cfg.renorm()), Linear(width, 2 * act_dim)]
        actor = SquashedGaussianActor(self.obs_dim, act_dim, net=nn.Sequential(*layers),
                                      squash_epsilon=cfg.squash_epsilon)
        critic = EnsembleQ(state_dim, act_dim, cfg.critic_hidden, cfg.num_critics,
                           cfg.activation, batch_renorm=cfg.renorm())
        return actor.eval(), critic.eval()

    def _learning_state(self, act_dim: int) -> None:
        super()._learning_state(act_dim)
        beta1 = self.cfg.alpha_adam_beta1
        if beta1 is not None and beta1 != self.cfg.adam_beta1:
            self.alpha_opt = adam([self.log_alpha], self.cfg.alpha_lr, (beta1, 0.999))
            self.alpha_step = GradientStep(self.name, "alpha", self.alpha_opt)

    def _critic_update(self, batch: dict[str, torch.Tensor], alpha: torch.Tensor
                       ) -> dict[str, torch.Tensor]:
        """One step of the critics on the joint batch: (s, a) and (s', a') normalized together,
        the TD target from the same forward (no target critics)."""
        b = batch["reward"].shape[0]
        with torch.no_grad():  # the actor in eval mode: running statistics
            next_action, next_log_prob = self.actor.sample(self._actor_input(batch["next_obs"]),
                                                           self.generator)
        with training(self.critic):
            q_all = self.critic(torch.cat([batch["obs"], batch["next_obs"]]),
                                torch.cat([batch["action"], next_action]))
        q, next_q = q_all.split(b, dim=1)
        target = soft_td_target(batch["reward"], batch["terminated"], next_q.detach(),
                                next_log_prob, alpha, self.cfg.gamma)
        return self._critic_step(q, target)

    def _actor_update(self, batch: dict[str, torch.Tensor], alpha: torch.Tensor
                      ) -> dict[str, torch.Tensor]:
        """SAC's actor step with the actor on batch statistics (the critics on running ones)."""
        with training(self.actor):
            return super()._actor_update(batch, alpha)
