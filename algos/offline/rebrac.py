"""ReBRAC (Tarasov et al. 2023, "Revisiting the Minimalist Approach to Offline RL").

TD3+BC with the design choices that made it strong: behaviour-cloning penalties in both the
actor loss and the critic's bootstrap (||a' - a'_data||^2 at s'), LayerNorm in the critics,
deeper networks, larger batches and learning rates.
"""

from __future__ import annotations

import dataclasses

import torch

from robotrl.algos.offline.losses import rebrac_actor_loss, rebrac_next_value
from robotrl.algos.offline.td3bc import TD3BC, TD3BCConfig
from robotrl.data.dataset import Dataset


@dataclasses.dataclass
class ReBRACConfig(TD3BCConfig):
    """ReBRAC; defaults are the paper's and CORL's ``rebrac.py`` for D4RL locomotion."""

    actor_bc_coef: float | None = None
    """beta of the actor's BC penalty; None: the paper's value for the dataset's task and
    kind (``PAPER_BC_COEFS``), else 1.0."""
    critic_bc_coef: float | None = None
    """beta of the bootstrap's BC penalty; None: as ``actor_bc_coef``."""
    normalize_q: bool = True
    """Divide the actor's Q term by mean|Q| (detached)."""
    batch_size: int = 1024
    """Transitions per gradient update."""
    actor_lr: float = 1e-3
    """Adam learning rate of the actor."""
    critic_lr: float = 1e-3
    """Adam learning rate of the critics."""
    hidden: tuple[int, ...] = (256, 256, 256)
    """Hidden widths of actor and critics."""
    normalize_obs: bool = False
    """ReBRAC does not standardize observations (LayerNorm handles scale)."""


PAPER_BC_COEFS: dict[tuple[str, str], tuple[float, float]] = {
    ("halfcheetah", "random"): (0.001, 0.1), ("halfcheetah", "medium"): (0.001, 0.01),
    ("halfcheetah", "medium-replay"): (0.01, 0.001), ("halfcheetah", "medium-expert"): (0.01, 0.1),
    ("halfcheetah", "expert"): (0.01, 0.01),
    ("hopper", "random"): (0.001, 0.01), ("hopper", "medium"): (0.01, 0.01),
    ("hopper", "medium-replay"): (0.05, 0.5), ("hopper", "medium-expert"): (0.1, 0.01),
    ("hopper", "expert"): (0.1, 0.1),
    ("walker2d", "random"): (0.01, 0.0), ("walker2d", "medium"): (0.05, 0.1),
    ("walker2d", "medium-replay"): (0.05, 0.01), ("walker2d", "medium-expert"): (0.01, 0.01),
    ("walker2d", "expert"): (0.01, 0.5),
}
"""(actor, critic) BC coefficients per (task, D4RL dataset kind), from the ReBRAC authors'
configs (tinkoff-ai/ReBRAC ``configs/rebrac/``, the same in CORL)."""


def task_family(gym_id: str) -> str:
    """``Hopper-v5`` -> ``hopper``."""
    return gym_id.split("-v")[0].lower()


class ReBRAC(TD3BC):
    """TD3+BC's loop with ReBRAC's actor objective, penalized bootstrap and LayerNorm critics."""

    NAME = "ReBRAC"
    CRITIC_LAYER_NORM = True
    NEEDS_NEXT_ACTION = True

    def attach(self, data: Dataset) -> None:
        """Attach, and resolve unset BC coefficients from the dataset's card."""
        super().attach(data)
        paper = PAPER_BC_COEFS.get((task_family(data.card.task), data.card.kind), (1.0, 1.0))
        self.actor_bc = self.cfg.actor_bc_coef if self.cfg.actor_bc_coef is not None else paper[0]
        self.critic_bc = (self.cfg.critic_bc_coef if self.cfg.critic_bc_coef is not None
                          else paper[1])

    def _next_value(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        next_action = self._smoothed_next_action(batch["next_obs"])
        next_q = self.critic_target(batch["next_obs"], next_action)
        return rebrac_next_value(next_q, next_action, batch["next_action"], self.critic_bc)

    def _actor_loss(self, actor: torch.nn.Module, batch: dict[str, torch.Tensor],
                    alpha: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``alpha`` is the BC coefficient beta here (MCEP passes a milder one)."""
        action = actor(batch["obs"])
        q = self.critic(batch["obs"], action).min(0).values
        return rebrac_actor_loss(q, action, batch["action"], alpha, self.cfg.normalize_q)

    def _update_actor(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        loss, metrics = self._actor_loss(self.actor, batch, self.actor_bc)
        metrics[self.actor_step.metric] = self.actor_step(loss, check=False)
        return metrics
