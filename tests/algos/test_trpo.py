"""TRPO: conjugate gradient, Fisher-vector products, the trust region on a real env, learning
(conftest's PointEnv; InvertedPendulum in the slow run), resume through the runner, NaN guard
and config validation."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from robotrl.algos.trpo import TRPO, TRPOConfig, conjugate_gradient, fisher_vector_product
from robotrl.config import TrainConfig
from robotrl.envs import make
from robotrl.experiment import run_training
from robotrl.nn.policy import GaussianActorCritic

METRIC_KEYS = {
    "loss/policy",
    "loss/value",
    "train/kl",
    "train/step_fraction",
    "train/line_search_accepted",
    "train/improvement",
    "train/entropy",
    "train/action_std",
    "train/explained_variance",
    "train/cg_residual",
    "train/grad_norm/critic",
}

MakeConfig = Callable[..., TrainConfig]
"""The ``make_config`` fixture of conftest.py."""


def test_conjugate_gradient_solves_spd_system() -> None:
    gen = torch.Generator().manual_seed(0)
    m = torch.randn(6, 6, generator=gen, dtype=torch.float64)
    a = m @ m.T + 0.5 * torch.eye(6, dtype=torch.float64)
    b = torch.randn(6, generator=gen, dtype=torch.float64)
    calls = []

    def mvp(v: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return a @ v

    x, residual = conjugate_gradient(mvp, b, iters=10)
    torch.testing.assert_close(x, torch.linalg.solve(a, b), rtol=1e-8, atol=1e-8)
    assert residual.item() < 1e-6 and len(calls) == 10  # converged, then stopped moving
    # fewer iterations than dimensions: an approximation whose residual says so
    x3, residual3 = conjugate_gradient(mvp, b, iters=3)
    true3 = (torch.linalg.norm(b - a @ x3) / torch.linalg.norm(b)).item()
    assert residual3.item() == pytest.approx(true3, rel=1e-6) and 1e-6 < true3 < 1.0
    # a zero right-hand side: zero solution, no NaN
    x0, residual0 = conjugate_gradient(mvp, torch.zeros(6, dtype=torch.float64), iters=4)
    assert torch.equal(x0, torch.zeros(6, dtype=torch.float64)) and residual0.item() == 0.0


def test_fisher_vector_product_matches_explicit_fisher() -> None:
    """F v by double backprop of the mean KL == (1/B) sum_s J_s^T diag(1/sigma^2, 2) J_s v.

    J_s is the Jacobian of (mean(s), log std) in the parameters; 1/sigma^2 and 2 are the Fisher
    information of a Gaussian in its mean and log std (Schulman et al. 2015, appendix C.1).
    """
    torch.manual_seed(0)
    policy = GaussianActorCritic(3, 2, (4,), (4,), "tanh", init_log_std=-0.3).double()
    with torch.no_grad():
        policy.log_std.add_(torch.tensor([0.0, 0.4], dtype=torch.float64))
    params = [p for n, p in policy.named_parameters() if not n.startswith("critic_head.")]
    obs = torch.randn(5, 3, dtype=torch.float64)
    with torch.no_grad():
        d = policy.dist(obs)
        old = Normal(d.loc, d.scale)
    kl = kl_divergence(old, policy.dist(obs)).sum(-1).mean()
    fvp = fisher_vector_product(kl, params, damping=0.25)

    num = sum(p.numel() for p in params)
    fisher = torch.zeros(num, num, dtype=torch.float64)
    precision = (1.0 / old.scale[0].square()).tolist()
    for s in range(obs.shape[0]):
        mean = policy.dist(obs[s : s + 1]).loc[0]
        for j in range(2):
            rows = [torch.autograd.grad(mean[j], params, retain_graph=True, allow_unused=True),
                    torch.autograd.grad(policy.log_std[j], params, allow_unused=True)]
            for row, info in zip(rows, (precision[j], 2.0), strict=True):
                flat = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                                  for g, p in zip(row, params, strict=True)])
                fisher += info * torch.outer(flat, flat) / obs.shape[0]
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        v = torch.randn(num, generator=gen, dtype=torch.float64)
        torch.testing.assert_close(fvp(v), fisher @ v + 0.25 * v, rtol=1e-9, atol=1e-10)


def _rollout(alg: TRPO, env: object, obs: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        for _ in range(alg.cfg.rollout_steps):
            out = env.step(alg.act(obs))  # type: ignore[attr-defined]
            alg.process_env_step(out.reward, out.terminated, out.truncated, out.info["final_obs"])
            obs = out.obs
        alg.compute_returns(obs)
    return obs


@pytest.mark.parametrize(("max_kl", "fvp_fraction"), [(0.01, 1.0), (0.01, 0.25), (0.2, 0.25)])
def test_kl_of_every_update_stays_within_max_kl(max_kl: float, fvp_fraction: float) -> None:
    """Measured on InvertedPendulum with 8 worlds: the exact mean KL(old || new) over the
    rollout's states after each update is at most max_kl, and is what train/kl reports."""
    torch.manual_seed(0)
    env = make("inverted_pendulum", 8, seed=0, num_threads=1)
    spec = env.spec
    cfg = TRPOConfig(rollout_steps=32, max_kl=max_kl, fvp_fraction=fvp_fraction, critic_epochs=2,
                     critic_minibatches=4)
    alg = TRPO(spec.obs_dim, spec.action_low, spec.action_high, 8, cfg, seed=0)
    obs = env.reset()
    fractions = []
    for _ in range(6):
        obs = _rollout(alg, env, obs)
        states = alg.buffer.obs.flatten(0, 1).clone()
        with torch.no_grad():
            d = alg.policy.dist(states)
            old = Normal(d.loc.clone(), d.scale.clone())
        metrics = alg.update()
        assert set(metrics) == METRIC_KEYS
        assert all(math.isfinite(v) for v in metrics.values())
        with torch.no_grad():
            kl = kl_divergence(old, alg.policy.dist(states)).sum(-1).mean().item()
        assert kl <= max_kl * (1 + 1e-5), (kl, metrics)
        assert kl == pytest.approx(metrics["train/kl"], rel=1e-4, abs=1e-7)
        assert metrics["train/line_search_accepted"] == 1.0 and metrics["train/improvement"] > 0
        assert 0.0 < metrics["train/cg_residual"] < 0.5
        fractions.append(metrics["train/step_fraction"])
    # the quadratic model's step lands near the boundary: most of the region is used
    assert max(fractions) >= 0.8 and all(f >= 0.8**9 for f in fractions)


def test_rejected_step_keeps_parameters_and_value_still_fits() -> None:
    """Zero advantages: no step improves the surrogate, so the policy must stay put."""
    torch.manual_seed(0)
    env = make("inverted_pendulum", 4, seed=0, num_threads=1)
    spec = env.spec
    cfg = TRPOConfig(rollout_steps=8, normalize_advantages=False, critic_minibatches=2)
    alg = TRPO(spec.obs_dim, spec.action_low, spec.action_high, 4, cfg, seed=0)
    _rollout(alg, env, env.reset())
    alg.buffer.advantages.zero_()
    actor = [p.clone() for p in alg.actor_params]
    critic = [p.clone() for p in alg.critic_params]
    metrics = alg.update()
    assert metrics["train/line_search_accepted"] == 0.0
    assert metrics["train/step_fraction"] == 0.0 and metrics["train/kl"] == 0.0
    assert all(torch.equal(p, q) for p, q in zip(actor, alg.actor_params, strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(critic, alg.critic_params, strict=True))


def test_nan_reward_raises_and_keeps_parameters() -> None:
    torch.manual_seed(0)
    env = make("inverted_pendulum", 4, seed=0, num_threads=1)
    spec = env.spec
    alg = TRPO(spec.obs_dim, spec.action_low, spec.action_high, 4, TRPOConfig(rollout_steps=4), seed=0)
    obs = env.reset()
    before = {k: v.clone() for k, v in alg.policy.state_dict().items()}
    with torch.inference_mode():
        for t in range(4):
            out = env.step(alg.act(obs))
            reward = out.reward.clone()
            if t == 1:
                reward[2] = float("nan")
            alg.process_env_step(reward, out.terminated, out.truncated, out.info["final_obs"])
            obs = out.obs
        alg.compute_returns(obs)
    with pytest.raises(FloatingPointError, match="TRPO (surrogate|critic) loss or its gradient is non-finite"):
        alg.update()
    after = alg.policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_export_actor_equals_act_deterministic() -> None:
    torch.manual_seed(0)
    alg = TRPO(5, -torch.ones(2), torch.ones(2), 4, TRPOConfig(rollout_steps=4), seed=0)
    assert alg.obs_normalizer is not None
    alg.obs_normalizer.update(torch.randn(300, 5) * 2.0 + 1.0)
    with torch.no_grad():
        for p in alg.actor_params:
            p.add_(torch.randn(p.shape))
    actor = alg.export_actor()
    obs = torch.randn(128, 5) * 4.0
    expected = alg.act_deterministic(obs)
    assert torch.equal(actor(obs), expected) and expected.abs().max() == 1.0


@pytest.mark.parametrize(("act_dim", "expected"), [(1, 0.01), (6, 0.06)])
def test_default_kl_bound_is_per_action_dimension(act_dim: int, expected: float) -> None:
    alg = TRPO(3, -torch.ones(act_dim), torch.ones(act_dim), 2, TRPOConfig(rollout_steps=2), seed=0)
    assert alg.max_kl == pytest.approx(expected)
    explicit = TRPO(3, -torch.ones(act_dim), torch.ones(act_dim), 2,
                    TRPOConfig(rollout_steps=2, max_kl=0.2), seed=0)
    assert explicit.max_kl == 0.2


def test_std_floor_is_a_fraction_of_the_action_range() -> None:
    low, high = torch.tensor([-3.0, -0.5]), torch.tensor([3.0, 0.5])
    alg = TRPO(3, low, high, 2, TRPOConfig(rollout_steps=2, min_action_std=0.1), seed=0)
    with torch.no_grad():
        alg.policy.log_std.fill_(-20.0)
    scale = alg.policy.dist(torch.zeros(4, 3)).scale
    torch.testing.assert_close(scale, torch.tensor([0.3, 0.05]).expand(4, 2))
    # off: only the numeric floor exp(-5); unbounded actions get no range-based floor
    off = TRPO(3, low, high, 2, TRPOConfig(rollout_steps=2, min_action_std=0.0), seed=0)
    unbounded = TRPO(3, torch.full((2,), -math.inf), torch.full((2,), math.inf), 2,
                     TRPOConfig(rollout_steps=2), seed=0)
    for a in (off, unbounded):
        with torch.no_grad():
            a.policy.log_std.fill_(-20.0)
        torch.testing.assert_close(a.policy.dist(torch.zeros(1, 3)).scale,
                                   torch.full((1, 2), math.exp(-5.0)))


@pytest.mark.parametrize("min_action_std", [0.0, 1 / 30])
def test_solved_task_drives_log_std_down_until_the_floor(min_action_std: float) -> None:
    """The collapse's mechanism, fast: when every episode runs to the time limit the advantages
    are tiny critic errors that standardization blows up to unit scale; whenever they favour
    less noise (here: advantage -z^2, z the sampled action's standardized noise), TRPO spends its
    whole KL budget and log std falls by up to sqrt(max_kl) per update whatever the std is
    (its Fisher information is constant). Without a floor the std keeps falling towards exp(-5);
    with the default floor it stops at 1/30 of InvertedPendulum's half-range (0.1)."""
    torch.manual_seed(0)
    env = make("inverted_pendulum", 8, seed=0, num_threads=1)
    spec = env.spec
    cfg = TRPOConfig(rollout_steps=16, critic_epochs=1, critic_minibatches=2,
                     min_action_std=min_action_std)
    alg = TRPO(spec.obs_dim, spec.action_low, spec.action_high, 8, cfg, seed=0)
    obs = env.reset()
    stds = []
    for _ in range(60):
        obs = _rollout(alg, env, obs)
        buf = alg.buffer
        with torch.no_grad():
            d = alg.policy.dist(buf.obs.flatten(0, 1))
            z = (buf.action.flatten(0, 1) - d.loc) / d.scale
            buf.advantages.copy_(-z.square().sum(-1).view_as(buf.advantages))
        metrics = alg.update()
        assert metrics["train/kl"] <= alg.max_kl * (1 + 1e-5)
        stds.append(metrics["train/action_std"])
    assert stds[0] > 0.8  # init_log_std 0: std 1
    if min_action_std == 0:  # measured 0.028 after 60 updates, still falling
        falling = all(b < a for a, b in zip(stds[::10], stds[10::10], strict=False))
        assert stds[-1] < 0.04 and falling, stds
    else:
        assert stds[-1] == pytest.approx(0.1, rel=1e-4) and min(stds) >= 0.1 * (1 - 1e-4), stds


@pytest.mark.parametrize("schedule", ["fixed", "linear"])
def test_kl_schedule_scales_the_radius_of_each_step(schedule: str) -> None:
    """The linear schedule's radius is ``max_kl`` x (1 - progress): each accepted step's exact
    KL stays within it, the fixed one spends up to ``max_kl`` throughout, and at the end of
    training the linear radius is 0 and the policy does not move."""
    torch.manual_seed(0)
    env = make("inverted_pendulum", 8, seed=0, num_threads=1)
    spec = env.spec
    cfg = TRPOConfig(rollout_steps=16, critic_epochs=1, critic_minibatches=2, kl_schedule=schedule)
    alg = TRPO(spec.obs_dim, spec.action_low, spec.action_high, 8, cfg, seed=0)
    obs = env.reset()
    kls = []
    for progress in (0.0, 0.5, 0.9, 1.0):
        obs = _rollout(alg, env, obs)
        before = [p.detach().clone() for p in alg.actor_params]
        metrics = alg.update(progress)
        scale = 1.0 if schedule == "fixed" else 1.0 - progress
        assert alg.radius == pytest.approx(alg.max_kl * scale)
        assert metrics["train/kl"] <= alg.max_kl * scale * (1 + 1e-5)
        kls.append(metrics["train/kl"])
        moved = any(not torch.equal(a, b) for a, b in zip(before, alg.actor_params, strict=True))
        assert moved == (scale > 0), (progress, metrics)
    assert kls[0] > 0.2 * alg.max_kl  # a real step (0.45 of the radius after the line search)
    with pytest.raises(ValueError, match="unknown kl_schedule 'cosine'; known: fixed, linear"):
        TRPOConfig(kl_schedule="cosine")


def test_trpo_learns_point_env(point_learner: Callable[..., Any]) -> None:
    """The fast learning check: TRPO with the default KL bound (0.01 per action dimension)
    drives conftest's PointEnv to the origin in 10 updates (~0.4 s): 18.6 with seed 0, 4.8 for
    the untrained policy (with 0 updates the check fails)."""
    run = point_learner("trpo")
    assert run.before < 8.0
    assert run.after > 16.5, f"return {run.after:.2f} after 10 updates (before: {run.before:.2f})"
    assert all(m["train/kl"] <= run.alg.max_kl * (1 + 1e-5) for m in run.history)


@pytest.mark.slow  # a learning run: it must reach a threshold
def test_trpo_solves_inverted_pendulum(tmp_path: Path, make_config: MakeConfig) -> None:
    """The learning claim: mean deterministic return >= 950 (of 1000) on InvertedPendulum-v5.

    Measured: 1000 for seeds 0-3 at 16k steps with max_kl 0.01 (31 updates).
    """
    cfg = make_config(tmp_path, "trpo", num_envs=16, total_steps=16_000, eval_episodes=8,
               algo={"rollout_steps": 32, "actor_hidden": [64, 64], "critic_hidden": [64, 64],
                     "critic_minibatches": 16, "max_kl": 0.01})
    result = run_training(cfg)
    assert result is not None
    assert result["return_mean"] >= 950, result


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_kl", 0.0), ("max_kl", -0.1), ("min_action_std", -0.1), ("min_action_std", 1.0),
     ("cg_iters", 0), ("cg_damping", -1.0),
     ("line_search_steps", 0), ("backtrack", 1.0), ("backtrack", 0.0), ("critic_lr", 0.0),
     ("critic_epochs", 0), ("critic_minibatches", 0), ("rollout_steps", 0), ("gamma", 1.5),
     ("gae_lambda", -0.1), ("activation", "swish"), ("fvp_fraction", 0.0),
     ("fvp_fraction", 1.5)],
)
def test_bad_config_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        TRPOConfig(**{field: value})


def test_unknown_key_through_the_train_config_lists_allowed_keys(tmp_path: Path, make_config: MakeConfig) -> None:
    with pytest.raises(ValueError, match="allowed keys.*max_kl"):
        make_config(tmp_path, "trpo", algo={"clip_low": 0.2})
