"""GAE and group normalization against hand-worked numbers."""

from __future__ import annotations

import pytest
import torch

from robotrl.algos.advantages import gae, group_normalize


def _columns(*cols: list[float]) -> torch.Tensor:
    return torch.tensor(cols, dtype=torch.float64).T  # [T, N]


def test_gae_hand_worked_continue_terminate_truncate() -> None:
    # three envs, T = 3, gamma = lam = 0.5 (gamma * lam = 0.25):
    # env 0 runs on; env 1 terminates at t=1; env 2 is truncated at t=1 with V(final_obs) = 4
    reward = _columns([1, 2, 3], [1, 2, 3], [1, 2, 3])
    value = _columns([0.5, 1.0, 1.5], [0.5, 1.0, 1.5], [0.5, 1.0, 1.5])
    next_value = _columns([1.0, 1.5, 2.0], [1.0, 99.0, 2.0], [1.0, 4.0, 2.0])
    terminated = _columns([0, 0, 0], [0, 1, 0], [0, 0, 0]).bool()
    done = _columns([0, 0, 0], [0, 1, 0], [0, 1, 0]).bool()
    adv, ret = gae(reward, value, next_value, terminated, done, gamma=0.5, lam=0.5)
    # deltas env 0: 1 + .5*1 - .5 = 1.0, 2 + .5*1.5 - 1 = 1.75, 3 + .5*2 - 1.5 = 2.5
    #   A2 = 2.5, A1 = 1.75 + .25*2.5 = 2.375, A0 = 1.0 + .25*2.375 = 1.59375
    # env 1: delta1 = 2 - 1 = 1 (no bootstrap, 99 ignored), A1 = 1 (recursion cut), A0 = 1.25
    # env 2: delta1 = 2 + .5*4 - 1 = 3 (bootstraps on truncation), A1 = 3, A0 = 1.75
    expected = _columns([1.59375, 2.375, 2.5], [1.25, 1.0, 2.5], [1.75, 3.0, 2.5])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + value)


def _reference_gae(reward, value, next_value, terminated, done, gamma, lam):
    """The definition: A_t = sum_l (gamma lam)^l delta_{t+l}, summed until the episode ends."""
    T, N = reward.shape
    delta = reward + gamma * next_value * (~terminated) - value
    adv = torch.zeros_like(reward)
    for n in range(N):
        for t in range(T):
            weight = 1.0
            for k in range(t, T):
                adv[t, n] += weight * delta[k, n]
                if done[k, n]:
                    break
                weight *= gamma * lam
    return adv


def test_gae_matches_definition_on_random_rollout() -> None:
    g = torch.Generator().manual_seed(0)
    T, N = 7, 5
    reward, value, next_value = (
        torch.randn(T, N, generator=g, dtype=torch.float64) for _ in range(3)
    )
    terminated = torch.rand(T, N, generator=g) < 0.15
    done = terminated | (torch.rand(T, N, generator=g) < 0.15)
    adv, ret = gae(reward, value, next_value, terminated, done, gamma=0.9, lam=0.8)
    expected = _reference_gae(reward, value, next_value, terminated, done, 0.9, 0.8)
    torch.testing.assert_close(adv, expected)
    # float 0/1 flags are accepted and give the same result
    adv_f, _ = gae(reward, value, next_value, terminated.double(), done.double(), 0.9, 0.8)
    torch.testing.assert_close(adv_f, expected)


def test_gae_lambda_limits() -> None:
    reward = _columns([1.0, 1.0, 1.0])
    value = _columns([0.0, 0.0, 0.0])
    next_value = _columns([0.0, 0.0, 10.0])
    flags = torch.zeros(3, 1, dtype=torch.bool)
    # lam = 0: one-step TD errors
    adv0, _ = gae(reward, value, next_value, flags, flags, gamma=0.5, lam=0.0)
    torch.testing.assert_close(adv0, _columns([1.0, 1.0, 6.0]))
    # lam = 1: discounted return with bootstrap: 1 + .5 + .25 + .125 * 10
    adv1, _ = gae(reward, value, next_value, flags, flags, gamma=0.5, lam=1.0)
    torch.testing.assert_close(adv1, _columns([3.0, 4.0, 6.0]))


def test_group_normalize_hand_worked() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0], [0.0, 4.0, 8.0]], dtype=torch.float64)
    out = group_normalize(x, eps=0.0)
    # row 0: mean 2, population std sqrt(2/3); row 2: mean 4, std sqrt(32/3)
    s = (3.0 / 2.0) ** 0.5
    expected = torch.tensor([[-s, 0.0, s], [0.0, 0.0, 0.0], [-s, 0.0, s]], dtype=torch.float64)
    torch.testing.assert_close(out[[0, 2]], expected[[0, 2]])
    # a group of equal outcomes has no signal: zeros with eps > 0, never NaN
    torch.testing.assert_close(group_normalize(x, eps=1e-6)[1], torch.zeros(3, dtype=torch.float64))
    # eps enters the denominator: std 1 (row [-1, 1]) and eps 1 halve the result
    torch.testing.assert_close(
        group_normalize(torch.tensor([[-1.0, 1.0]]), eps=1.0), torch.tensor([[-0.5, 0.5]])
    )


def test_group_normalize_rejects_wrong_rank() -> None:
    with pytest.raises(ValueError, match=r"\[G, K\]"):
        group_normalize(torch.zeros(4))
