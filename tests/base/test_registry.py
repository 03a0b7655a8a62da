"""One algorithm entry: a tiny algorithm defined here, registered, trained through the same build
path as ``robotrl train``, checkpointed and exported."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from robotrl import registry
from robotrl.checkpoint import load_checkpoint
from robotrl.config import TrainConfig, from_dict, to_dict
from robotrl.envs.base import EnvSpec
from robotrl.experiment.build import build_algo, build_runner
from robotrl.nn.actor import DeterministicActor
from robotrl.registry import AlgorithmEntry, register_algorithm
from robotrl.seeding import seed_everything
from robotrl.types import BuildContext, Obs, policy_obs


@dataclasses.dataclass
class TinyConfig:
    """A linear Gaussian policy trained by REINFORCE on immediate rewards."""

    rollout_steps: int = 8
    """Steps per world per update."""
    learning_rate: float = 1e-2
    """Adam learning rate."""
    std: float = 0.5
    """Fixed exploration std."""


class Tiny:
    """Linear policy; ``update`` ascends sum(log pi(a|s) * (r - mean r)) over the rollout."""

    def __init__(self, spec: EnvSpec, cfg: TinyConfig, ctx: BuildContext) -> None:
        self.cfg, self.spec = cfg, spec
        self.policy = nn.Linear(spec.obs_dim, spec.action_dim).to(ctx.device)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=cfg.learning_rate)
        self.obs: list[torch.Tensor] = []
        self.actions: list[torch.Tensor] = []
        self.rewards: list[torch.Tensor] = []
        self.updates = 0

    @classmethod
    def build(cls, spec: EnvSpec, cfg: TinyConfig, ctx: BuildContext) -> Tiny:
        return cls(spec, cfg, ctx)

    @classmethod
    def observations(cls, cfg: TinyConfig) -> tuple[str, ...]:
        return ("policy",)

    def act(self, obs: Obs) -> torch.Tensor:
        obs = obs["policy"]
        mean = self.policy(obs)
        action = mean + self.cfg.std * torch.randn_like(mean)
        self.obs.append(obs.clone())
        self.actions.append(action)
        return action.clamp(self.spec.action_low, self.spec.action_high)

    def act_deterministic(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        return self.policy(policy_obs(obs)).clamp(self.spec.action_low, self.spec.action_high)

    def process_env_step(self, reward: torch.Tensor, terminated: torch.Tensor,
                         truncated: torch.Tensor, final_obs: Obs) -> None:
        self.rewards.append(reward)

    def compute_returns(self, last_obs: Obs) -> None:
        pass

    def update(self, progress: float) -> dict[str, float]:
        obs, action = torch.cat(self.obs), torch.cat(self.actions)
        reward = torch.cat(self.rewards)
        log_prob = -((action - self.policy(obs)) ** 2).sum(-1) / (2 * self.cfg.std**2)
        loss = -(log_prob * (reward - reward.mean())).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.obs, self.actions, self.rewards = [], [], []
        self.updates += 1
        return {"loss/policy": loss.item()}

    def export_actor(self) -> DeterministicActor:
        return DeterministicActor(self.policy, self.spec.obs_dim, self.spec.action_low,
                                  self.spec.action_high)

    def state_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.updates = state["updates"]


@pytest.fixture
def tiny() -> Iterator[str]:
    register_algorithm("tiny", AlgorithmEntry(TinyConfig, Tiny, "on_policy"))
    yield "tiny"
    registry.ALGORITHMS.pop("tiny")


def test_tiny_algorithm_trains_through_the_build_path(tiny: str, tmp_path: Path) -> None:
    cfg = from_dict(TrainConfig, {
        "algo": {"name": tiny, "rollout_steps": 8}, "env": {"task": "inverted_pendulum"},
        "logger": {"tensorboard": False, "progress": False}, "num_envs": 4,
        "total_steps": 4 * 8 * 3, "run_dir": str(tmp_path), "eval_episodes": 2,
    })
    assert to_dict(cfg)["algo"] == {"name": "tiny", "rollout_steps": 8, "learning_rate": 1e-2,
                                    "std": 0.5}
    seed_everything(0)
    runner = build_runner(cfg)
    assert type(runner).__name__ == "OnPolicyRunner" and isinstance(runner.alg, Tiny)
    final = runner.train()
    assert runner.alg.updates == 3 and "loss/policy" in runner.history[-1]
    assert final is not None and final["episodes"] == 2
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    restored = build_algo(cfg, runner.env.spec, ckpt["algo"])
    assert restored.updates == 3
    obs = torch.randn(5, 4)
    torch.testing.assert_close(restored.export_actor()(obs), runner.alg.act_deterministic(obs))


def test_unknown_names_list_the_registered_ones() -> None:
    with pytest.raises(ValueError, match="unknown algo 'ppo2'; available: ppo, trpo, sac"):
        from_dict(TrainConfig, {"algo": {"name": "ppo2"}})
    with pytest.raises(ValueError, match="runner kind 'goal'; registered kinds: on_policy"):
        register_algorithm("myalgo", AlgorithmEntry(TinyConfig, Tiny, "goal"))
    with pytest.raises(ValueError, match="unknown runner kind 'x'; available: on_policy, "
                                         "off_policy"):
        registry.runner_class("x")
    assert "myalgo" not in registry.ALGORITHMS
