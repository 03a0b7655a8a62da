"""Fitted Q evaluation on tiny MDPs whose value is known, and the simulator's discounted return."""

import numpy as np
import pytest
import torch

from robotrl.data.dataset import Dataset, DatasetCard
from robotrl.ope import FQEConfig, fitted_q_evaluation


def toy(terminal: bool, episodes: int = 100, length: int = 20) -> Dataset:
    """1-D states drawn i.i.d. from U(-1, 1) at every step, uniform random actions, reward
    ``a * s``: under pi(s) = s a step earns s^2 and the value from s0 is
    ``s0^2 + gamma E[s'^2] / (1 - gamma)`` (``s0^2`` when every step terminates)."""
    rng = np.random.default_rng(0)
    eps = []
    n = 1 if terminal else length
    for _ in range(episodes * (length // n)):
        o = rng.uniform(-1, 1, (n + 1, 1)).astype(np.float32)
        a = rng.uniform(-1, 1, (n, 1)).astype(np.float32)
        last = np.eye(n, dtype=bool)[-1]
        eps.append({"observations": o, "actions": a, "rewards": a[:, 0] * o[:-1, 0],
                    "terminations": last if terminal else np.zeros(n, bool),
                    "truncations": np.zeros(n, bool) if terminal else last})
    return Dataset.from_episodes(eps, DatasetCard(task="toy"))


def policy(s: torch.Tensor) -> torch.Tensor:
    return s.clamp(-1, 1)


@pytest.mark.parametrize("terminal", [False, True])
def test_fqe_recovers_known_value(terminal):
    torch.set_num_threads(1)
    ds, gamma = toy(terminal), 0.9
    s0 = ds.observations[ds.episode_starts]
    true = float((s0 ** 2).mean())
    if not terminal:
        true += gamma * float((ds.next_observations ** 2).mean()) / (1 - gamma)
    cfg = FQEConfig(updates=2000, gamma=gamma, hidden=(64, 64), lr=1e-3, tau=0.05)
    est = fitted_q_evaluation(policy, ds, cfg)
    assert est["estimate"] == pytest.approx(true, rel=0.08)
    assert est["starts"] == len(s0)
    # the behaviour's own actions average to ~0 reward: using them instead of pi's would give ~0
    assert abs(est["estimate"]) > 0.25


def test_fqe_rejects_bad_settings():
    with pytest.raises(ValueError, match="gamma"):
        FQEConfig(gamma=1.0)
    with pytest.raises(ValueError, match="updates"):
        FQEConfig(updates=0)


def test_evaluate_discounted_return():
    from robotrl.envs import make
    from robotrl.runners.evaluation import evaluate

    env = make("inverted_pendulum", num_envs=4, seed=0)
    zero = lambda obs: torch.zeros(4, env.spec.action_dim)  # noqa: E731
    full = evaluate(zero, env, seed=1, gamma=1.0)
    assert full["discounted_return_mean"] == pytest.approx(full["return_mean"])
    first = evaluate(zero, env, seed=1, gamma=0.0)
    assert first["discounted_return_mean"] == pytest.approx(1.0)  # 1 per step alive
    half = evaluate(zero, env, seed=1, gamma=0.5)
    assert 1.0 < half["discounted_return_mean"] < 2.0
