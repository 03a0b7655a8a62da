"""Seed-batched PPO (issue 46): every seed of a batch is that seed's PPO alone, minibatch for
minibatch (each seed's shuffle, advantage standardization, gradient clip and KL-adaptive
learning rate its own), in float64; a diverging seed is stopped without stopping the others."""

from __future__ import annotations

import pytest
import torch

from robotrl.algos.ppo import PPO, PPOConfig
from robotrl.algos.ppo_seed_batch import SeedBatchPPO
from robotrl.seeding import seed_everything

SEEDS = (3, 7, 11)
OBS, ACT, WORLDS, STEPS = 5, 2, 4, 16
TOL = 1e-10


pytestmark = pytest.mark.usefixtures("float64_one_thread")


def config(**over: object) -> PPOConfig:
    return PPOConfig(**{"rollout_steps": STEPS, "num_minibatches": 4, "num_epochs": 3,
                        "actor_hidden": (16, 16), "critic_hidden": (16, 16), **over})


def ppo(seed: int, cfg: PPOConfig) -> PPO:
    seed_everything(seed)
    return PPO(OBS, -torch.ones(ACT), torch.ones(ACT), WORLDS, cfg, seed=seed)


def rollout(learners: list[PPO], data: torch.Generator) -> None:
    """One rollout of one seed's data into every learner of that seed alike (each acts with
    its own policy and generator, which are equal)."""
    for _ in range(STEPS):
        obs = torch.randn(WORLDS, OBS, generator=data) * 2
        reward, nxt = torch.randn(WORLDS, generator=data), torch.randn(WORLDS, OBS, generator=data)
        term = torch.rand(WORLDS, generator=data) < 0.1
        trunc = ~term & (torch.rand(WORLDS, generator=data) < 0.1)
        for learner in learners:
            learner.act(obs)
            learner.process_env_step(reward, term, trunc, nxt)
    last = torch.randn(WORLDS, OBS, generator=data)
    for learner in learners:
        learner.compute_returns(last)


def state(learner: PPO) -> dict[str, torch.Tensor]:
    out = {f"policy.{k}": v.clone().double() for k, v in learner.policy.state_dict().items()}
    for key, value in learner.optimizer.state[learner.flat.flat].items():
        out[f"adam.{key}"] = value.clone().double()
    out["lr"] = torch.tensor(learner.lr)
    out["generator"] = learner.generator.get_state().double()
    return out


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def run(cfg: PPOConfig, updates: int, poison: tuple[int, int] | None = None
        ) -> tuple[SeedBatchPPO, list[PPO]]:
    batch = SeedBatchPPO([ppo(s, cfg) for s in SEEDS])
    alone = [ppo(s, cfg) for s in SEEDS]
    data = [torch.Generator().manual_seed(100 + s) for s in SEEDS]
    for u in range(updates):
        for i in batch.active:
            rollout([batch.learners[i], alone[i]], data[i])
        if poison is not None and poison[1] == u:
            with torch.no_grad():
                batch.learners[poison[0]].flat.flat[-1] = float("nan")  # a critic bias
        metrics = batch.update(progress=u / updates)
        for i, m in metrics.items():
            solo = alone[i].update(progress=u / updates)
            assert m.keys() == solo.keys(), (u, i)
            for key, value in m.items():
                assert value == pytest.approx(solo[key], rel=1e-6, abs=1e-9), (u, i, key)
    return batch, alone


@pytest.mark.parametrize("over", [
    {},  # KL-adaptive learning rate, joint gradient clip
    {"lr_schedule": "linear", "clip_grad_per_network": True, "value_clip": 0.2,
     "normalize_advantages_per_minibatch": True, "min_action_std": 0.2},
    {"lr_schedule": "fixed", "clipfrac_outside_range": True, "max_grad_norm": 0.0},
], ids=["adaptive", "linear-per-network", "fixed"])
def test_every_ppo_seed_is_its_solo_run(over: dict[str, object]) -> None:
    """Three rollouts and updates (3 epochs of 4 minibatches): every parameter, Adam moment,
    learning rate and generator state of every seed equals that seed's PPO alone, and so do
    the metrics."""
    batch, alone = run(config(**over), updates=3)
    worst = max(max_diff(state(b), state(a)) for b, a in zip(batch.learners, alone, strict=True))
    assert worst < TOL, worst
    assert not batch.stopped
    lrs = {round(b.lr, 12) for b in batch.learners}
    print(f"PPO: max |batched - solo| = {worst:.3e}; learning rates {sorted(lrs)}")


def test_a_diverging_ppo_seed_is_stopped_alone() -> None:
    batch, alone = run(config(), updates=3, poison=(1, 1))
    stop = batch.stopped[1]
    assert (stop.seed, stop.update, stop.last_good) == (1, 13, 12)  # 12 steps a call
    assert stop.metric == "loss/value"
    for i in (0, 2):
        assert max_diff(state(batch.learners[i]), state(alone[i])) < TOL


def test_what_ppo_cannot_batch_is_refused() -> None:
    with pytest.raises(ValueError, match=r"this config has \[.shared_backbone.\]"):
        SeedBatchPPO([ppo(0, config(shared_backbone=True))])
