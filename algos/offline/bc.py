"""Behaviour cloning: regress the dataset's actions (the baseline every offline method must
beat; CORL's ``any_percent_bc`` on 100% of the data)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from robotrl.algos.offline.base import OfflineConfig, OfflineLearner, TanhActor
from robotrl.algos.offline.losses import auxiliary_mse, bc_loss
from robotrl.data.dataset import Dataset, DatasetError
from robotrl.optim import GradientStep, adam
from robotrl.types import Obs
from robotrl.vla.policy import token_cross_entropy

if TYPE_CHECKING:
    from robotrl.types import BuildContext, EnvSpec
    from robotrl.vla.policy import TokenPolicy


@dataclasses.dataclass
class BCConfig(OfflineConfig):
    """BC: a deterministic tanh actor trained by mean squared error; with ``policy=vla``, token
    cross-entropy (``TokenBC``), optionally with an auxiliary loss on privileged labels
    (issue 47)."""

    aux_weight: float = 0.0
    """Token policies: weight of an auxiliary loss, the mean squared error of a linear head on
    the policy's features for the first action token (``policy=vla``: that position's hidden
    state and the image keypoints' positions, so the loss pulls a keypoint onto the named
    object) regressing the privileged group ``aux_group`` of the dataset (standardized by its
    mean and std); the policy never reads the group and acting never uses the head. 0: off."""
    aux_group: str = "target"
    """Token policies: the observation group the auxiliary head regresses (tabletop's
    ``target``, the instructed object's (x, y), recorded by ``robotrl dataset collect``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.aux_weight < 0:
            raise ValueError(f"aux_weight must be >= 0, got {self.aux_weight}")


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

    @classmethod
    def token_observations(cls, cfg: BCConfig) -> tuple[str, ...]:
        """Groups beside the token policy's that ``TokenBC`` reads: ``aux_group`` when the
        auxiliary loss is on."""
        return (cfg.aux_group,) if cfg.aux_weight > 0 else ()

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
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.aux_head: torch.nn.Linear | None = None
        """The auxiliary head (``cfg.aux_weight`` > 0): features -> ``cfg.aux_group``; never
        used to act, not part of the policy (GRPO starts from the policy alone)."""
        if cfg.aux_weight > 0:
            if not policy.feature_dim:
                raise ValueError(f"algo.aux_weight > 0: policy {policy.kind!r} exposes no "
                                 "features for an auxiliary head; policy=vla does")
            if cfg.aux_group in spec.observations:  # else built by load_state_dict
                self._aux(spec.flat_width([cfg.aux_group]))
        self._optimizer()
        self.obs: torch.Tensor | None = None
        self.labels: torch.Tensor | None = None
        self.aux_target: torch.Tensor | None = None
        self.num_updates = 0

    def _aux(self, width: int) -> None:
        self.aux_head = torch.nn.Linear(self.policy.feature_dim, width).to(self.device)
        self.aux_stats = torch.zeros(2, width, device=self.device)  # dataset mean, std

    def _optimizer(self) -> None:
        # the trainable parameters only: a LoRA policy's LM weights are frozen
        params = [p for p in self.policy.parameters() if p.requires_grad]
        if self.aux_head is not None:
            params += list(self.aux_head.parameters())
        self.optimizer = adam(params, self.cfg.actor_lr)
        self.grad_step = GradientStep(self.NAME, "actor", self.optimizer)

    def attach(self, data: Dataset) -> None:
        """Keep the observations and each row's action-chunk label on the learner's device."""
        where = data.card.source or data.card.dataset_id or "dataset"
        recorded = list(data.card.observations)
        aux = () if self.aux_head is None else (self.cfg.aux_group,)
        if recorded[: len(self.groups)] != list(self.groups) or not set(aux) <= set(recorded):
            raise DatasetError(f"{where} records observation groups {recorded}; the token "
                               f"policy reads {list(self.groups)} (first, in this order)"
                               f"{f' and algo.aux_weight needs {aux[0]!r}' if aux else ''}: "
                               "collect it with robotrl dataset collect kind=scripted")
        # groups past the policy's (privileged ones) are read only by auxiliary losses
        columns, at = {}, 0
        for group in recorded:
            if group not in self.spec.observations:  # the learner's worlds lack it: unread
                break
            columns[group] = slice(at, at + self.spec.flat_width([group]))
            at = columns[group].stop
        width = self.spec.flat_width(self.groups)
        # every group known: the exact width; else at least up to the last group read
        data.check_spec(at if len(columns) == len(recorded) else max(data.obs_dim, at),
                        self.policy.tokenizer.low.numel())
        data = data.to(self.device)
        rows = torch.arange(len(data), device=self.device)
        last = data.episode_ends()[data.episode_ids()] - 1
        steps = torch.minimum(rows[:, None] + torch.arange(self.chunk, device=self.device),
                              last[:, None])
        obs = data.observations
        self.obs = obs if obs.shape[1] == width else obs[:, :width]
        self.labels = data.actions[steps].flatten(1)
        if aux:
            self.aux_target = obs[:, columns[aux[0]]].clone()
            std = self.aux_target.std(0).clamp_min(1e-6)
            self.aux_stats = torch.stack([self.aux_target.mean(0), std])

    def update(self, progress: float = 0.0) -> dict[str, float]:
        """``cfg.updates_per_iteration`` gradient steps on batches of ``cfg.batch_size`` rows."""
        if self.obs is None or self.labels is None:
            raise RuntimeError("BC.update() before attach(dataset)")
        rows = []
        for _ in range(self.cfg.updates_per_iteration):
            idx = torch.randint(len(self.obs), (self.cfg.batch_size,), device=self.device,
                                generator=self.generator)
            obs = self.spec.unflatten(self.obs[idx], self.groups)
            if self.aux_head is None:
                loss, metrics = self.policy.bc_loss(obs, self.labels[idx])
            else:
                loss, metrics = self._aux_loss(obs, idx)
            metrics[self.grad_step.metric] = self.grad_step(loss, f"update {self.num_updates}")
            self.num_updates += 1
            rows.append(torch.stack(list(metrics.values())))
        means = torch.stack(rows).mean(0).tolist()
        return {**dict(zip(metrics, means, strict=True)), "train/updates": float(self.num_updates)}

    def _aux_loss(self, obs: Obs, idx: torch.Tensor
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Token cross-entropy plus ``aux_weight`` x the auxiliary head's squared error on the
        standardized ``aux_group`` of rows ``idx``."""
        assert self.aux_head is not None and self.aux_target is not None
        tokens = self.policy.tokenizer.encode(self.labels[idx])  # type: ignore[index]
        logits, features = self.policy.forced_features(obs, tokens)
        loss, metrics = token_cross_entropy(logits, tokens)
        target = (self.aux_target[idx] - self.aux_stats[0]) / self.aux_stats[1]
        aux, aux_metrics = auxiliary_mse(self.aux_head(features.float()), target)
        return loss + self.cfg.aux_weight * aux, {**metrics, **aux_metrics}

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
        state = {"arch": dict(self.policy.arch), "policy": self.policy.state_dict(),
                 "optimizer": self.optimizer.state_dict(),
                 "generator": self.generator.get_state(), "num_updates": self.num_updates}
        if self.aux_head is not None:
            state["aux_head"] = {**self.aux_head.state_dict(), "stats": self.aux_stats}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["arch"] != self.policy.arch:
            raise ValueError(f"checkpoint policy {state['arch']} differs from this run's "
                             f"{self.policy.arch}")
        self.policy.load_state_dict(state["policy"])
        if ("aux_head" in state) != (self.cfg.aux_weight > 0):
            raise ValueError("the checkpoint's and this run's algo.aux_weight disagree on an "
                             "auxiliary head")
        if "aux_head" in state:
            head = dict(state["aux_head"])
            stats = head.pop("stats")
            if self.aux_head is None:  # acting worlds without the group (GRPO's init)
                self._aux(stats.shape[1])
                self._optimizer()
            assert self.aux_head is not None
            self.aux_head.load_state_dict(head)
            self.aux_stats = stats.to(self.device)
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"].cpu())
        self.num_updates = int(state["num_updates"])
