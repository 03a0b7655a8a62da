"""Behaviour cloning: regress the dataset's actions (the baseline every offline method must
beat; CORL's ``any_percent_bc`` on 100% of the data)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from robotrl.algos.offline.base import OfflineConfig, OfflineLearner, TanhActor
from robotrl.algos.offline.losses import bc_loss
from robotrl.data.dataset import Dataset, DatasetError
from robotrl.optim import GradientStep, adam
from robotrl.types import Obs

if TYPE_CHECKING:
    from robotrl.types import BuildContext, EnvSpec
    from robotrl.vla.policy import TokenPolicy


@dataclasses.dataclass
class BCConfig(OfflineConfig):
    """BC: a deterministic tanh actor trained by mean squared error."""


class BC(OfflineLearner):
    """a = tanh(net(obs)) fitted to the dataset's actions (scaled to [-1, 1])."""

    NAME = "BC"
    METRIC_KEYS = ("loss/actor", "train/grad_norm/actor")
    token_policies = True
    """``policy=vla`` trains a token policy (``TokenBC``) instead of the MLP actor."""

    @classmethod
    def build(cls, spec: EnvSpec, cfg: Any, ctx: BuildContext) -> Any:
        if ctx.policy is not None:
            from robotrl.registry import build_policy

            return TokenBC(build_policy(ctx.policy, spec), spec, cfg, ctx.device)
        return super().build(spec, cfg, ctx)

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


class TokenBC:
    """Behaviour cloning of a token policy (``policy=vla``): token cross-entropy of
    demonstrated action chunks (``TokenPolicy.bc_loss``).

    A dataset row holds one step's observation groups (flattened, ``card.observations``) and
    action; the label of a row is the chunk of the K actions from it on, within its episode
    (the last action repeats past the episode's end), as action-chunking policies are trained
    (Zhao et al. 2023). The policy acts on a chunked env (``ActionChunks``): one decision
    per K steps.
    """

    NAME = "BC"

    def __init__(self, policy: TokenPolicy, spec: EnvSpec, cfg: BCConfig,
                 device: str | torch.device = "cpu", seed: int | None = None) -> None:
        self.cfg, self.spec, self.device = cfg, spec, torch.device(device)
        self.policy = policy.to(self.device)
        self.groups = tuple(policy.observations)
        self.chunk = spec.action_dim // policy.tokenizer.low.numel()
        # the trainable parameters only: a LoRA policy's LM weights are frozen
        self.optimizer = adam([p for p in self.policy.parameters() if p.requires_grad],
                              cfg.actor_lr)
        self.grad_step = GradientStep(self.NAME, "actor", self.optimizer)
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.obs: torch.Tensor | None = None
        self.labels: torch.Tensor | None = None
        self.num_updates = 0

    def attach(self, data: Dataset) -> None:
        """Keep the observations and each row's action-chunk label on the learner's device."""
        where = data.card.source or data.card.dataset_id or "dataset"
        if list(data.card.observations) != list(self.groups):
            raise DatasetError(f"{where} records observation groups {data.card.observations}; "
                               f"the token policy reads {list(self.groups)}: collect it with "
                               "robotrl dataset collect kind=scripted")
        data.check_spec(self.spec.flat_width(self.groups), self.policy.tokenizer.low.numel())
        data = data.to(self.device)
        rows = torch.arange(len(data), device=self.device)
        last = data.episode_ends()[data.episode_ids()] - 1
        steps = torch.minimum(rows[:, None] + torch.arange(self.chunk, device=self.device),
                              last[:, None])
        self.obs, self.labels = data.observations, data.actions[steps].flatten(1)

    def update(self, progress: float = 0.0) -> dict[str, float]:
        """``cfg.updates_per_iteration`` gradient steps on batches of ``cfg.batch_size`` rows."""
        if self.obs is None or self.labels is None:
            raise RuntimeError("BC.update() before attach(dataset)")
        rows = []
        for _ in range(self.cfg.updates_per_iteration):
            idx = torch.randint(len(self.obs), (self.cfg.batch_size,), device=self.device,
                                generator=self.generator)
            obs = self.spec.unflatten(self.obs[idx], self.groups)
            loss, metrics = self.policy.bc_loss(obs, self.labels[idx])
            metrics[self.grad_step.metric] = self.grad_step(loss, f"update {self.num_updates}")
            self.num_updates += 1
            rows.append(torch.stack(list(metrics.values())))
        means = torch.stack(rows).mean(0).tolist()
        return {**dict(zip(metrics, means, strict=True)), "train/updates": float(self.num_updates)}

    @torch.no_grad()
    def act_deterministic(self, obs: Obs) -> torch.Tensor:
        """Greedy action chunk [N, K * A]."""
        x = {g: obs[g].to(self.device) for g in self.groups}
        return self.policy.deterministic(x)

    act = act_deterministic

    def export_actor(self) -> Any:
        raise NotImplementedError("token policies decode autoregressively; ONNX/TorchScript "
                                  "export covers MLP actors only")

    def state_dict(self) -> dict[str, Any]:
        return {"arch": dict(self.policy.arch), "policy": self.policy.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state(), "num_updates": self.num_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["arch"] != self.policy.arch:
            raise ValueError(f"checkpoint policy {state['arch']} differs from this run's "
                             f"{self.policy.arch}")
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"].cpu())
        self.num_updates = int(state["num_updates"])
