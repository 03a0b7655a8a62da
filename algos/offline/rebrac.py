"""ReBRAC (Tarasov et al. 2023, "Revisiting the Minimalist Approach to Offline RL").

TD3+BC with the design choices that made it strong: behaviour-cloning penalties in both the
actor loss and the critic's bootstrap (||a' - a'_data||^2 at s'), LayerNorm in the critics,
deeper networks, larger batches and learning rates.

The authors' code (tinkoff-ai/CORL ``algorithms/offline/rebrac.py``, JAX) differs from this
class in details that are switches here, set to the authors' values by the reference test
(``tests/reference/test_rederived.py``): ``edac_init``, ``layer_norm_eps``,
``actor_on_first_update``, ``lagged_actor_target`` and ``drop_truncated``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from robotrl.algos.offline.losses import (
    rebrac_actor_loss,
    rebrac_next_value,
)
from robotrl.algos.offline.td3bc import TD3BC, TD3BCConfig
from robotrl.data.dataset import Dataset
from robotrl.nn.ensemble import EnsembleLayerNorm, EnsembleLinear


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
    edac_init: bool = False
    """The authors' initialization (from EDAC, An et al. 2021): hidden biases 0.1, output
    layers uniform in +-1e-3 (actor) and +-3e-3 (critics); False: PyTorch's default."""
    layer_norm_eps: float = 1e-5
    """Epsilon of the critics' LayerNorm (PyTorch's 1e-5; the authors' Flax LayerNorm: 1e-6)."""
    drop_truncated: bool = False
    """Train only on rows that did not end by truncation (the authors' ``qlearning_dataset``
    skips timeout rows); False: truncated rows bootstrap from their next observation, with
    the row's own action standing in for a'_data there."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layer_norm_eps <= 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps}")


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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.cfg
        for module in (*self.critic.modules(), *self.critic_target.modules()):
            if isinstance(module, EnsembleLayerNorm):
                module.eps = cfg.layer_norm_eps
        if cfg.edac_init:
            with torch.no_grad():
                _edac_init([m for m in self.actor.modules() if isinstance(m, nn.Linear)], 1e-3)
                _edac_init([m for m in self.critic.modules() if isinstance(m, EnsembleLinear)],
                           3e-3)
            self.actor_target.load_state_dict(self.actor.state_dict())
            self.critic_target.load_state_dict(self.critic.state_dict())

    def attach(self, data: Dataset) -> None:
        """Attach, and resolve unset BC coefficients from the dataset's card."""
        super().attach(data)
        if self.cfg.drop_truncated:
            self._drop_truncated()
        paper = PAPER_BC_COEFS.get((task_family(data.card.task), data.card.kind), (1.0, 1.0))
        self.actor_bc = self.cfg.actor_bc_coef if self.cfg.actor_bc_coef is not None else paper[0]
        self.critic_bc = (self.cfg.critic_bc_coef if self.cfg.critic_bc_coef is not None
                          else paper[1])

    def _drop_truncated(self) -> None:
        """Keep the rows that did not end by truncation (each is its episode's last row, so
        only one-row episodes vanish)."""
        assert self.data is not None and self.next_actions is not None
        keep = ~self.data.truncations
        starts = self.data.episode_starts
        starts = starts[keep[starts]]
        new_starts = keep.long().cumsum(0)[starts] - 1
        self.data = Dataset.from_table(self.data.table[keep], new_starts, self.obs_dim,
                                       self.act_dim, self.data.card)
        self.next_actions = self.next_actions[keep]

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


def _edac_init(layers: list[nn.Module], out_bound: float) -> None:
    """Hidden biases 0.1 (weights keep PyTorch's uniform +-1/sqrt(fan_in), as the authors'
    ``pytorch_init``); the last layer's weight and bias uniform in +-``out_bound``."""
    *hidden, out = layers
    for layer in hidden:
        layer.bias.fill_(0.1)
    out.weight.uniform_(-out_bound, out_bound)
    out.bias.uniform_(-out_bound, out_bound)
