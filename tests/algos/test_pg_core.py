"""The shared policy-gradient losses against hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from robotrl.algos.pg_core import (
    AGGREGATIONS,
    aggregate,
    clipped_surrogate,
    kl_k3,
    policy_loss,
    surrogate,
    value_loss,
)


def test_clipped_surrogate_hand_worked() -> None:
    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.1, 1.25, 0.75], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 2.0, 1.0, -1.0], dtype=torch.float64)
    log_ratio = ratio.log().requires_grad_(True)
    loss, clipped = clipped_surrogate(log_ratio, adv, clip_low=0.2, clip_high=0.3)
    # r=1.5,A=1: min(1.5, 1.3) -> -1.3 clipped | r=1.5,A=-1: min(-1.5,-1.3) -> 1.5 free
    # r=.5,A=1: min(.5,.8) -> -.5 free | r=.5,A=-1: min(-.5,-.8) -> .8 clipped
    # r=1.1,A=2: -2.2 free | r=1.25,A=1: inside [.8, 1.3] -> -1.25 free
    # r=.75,A=-1: clip(.75)=.8 -> min(-.75,-.8) -> .8 clipped (lower bound 1 - 0.2)
    expected = torch.tensor([-1.3, 1.5, -0.5, 0.8, -2.2, -1.25, 0.8], dtype=torch.float64)
    torch.testing.assert_close(loss, expected)
    assert clipped.tolist() == [True, False, False, True, False, False, True]
    # clipped elements carry no gradient; the others d(-rA)/dlog r = -rA
    loss.sum().backward()
    expected_grad = torch.where(clipped, 0.0, -ratio * adv)
    torch.testing.assert_close(log_ratio.grad, expected_grad)


def test_clipped_surrogate_asymmetric_bounds() -> None:
    log_ratio = torch.tensor([math.log(1.25)])
    adv = torch.tensor([1.0])
    _, symmetric = clipped_surrogate(log_ratio, adv, 0.2, 0.2)
    loss, higher = clipped_surrogate(log_ratio, adv, 0.2, 0.28)
    assert symmetric.item() and not higher.item()
    torch.testing.assert_close(loss, torch.tensor([-1.25]))


def test_kl_k3_values_and_estimate() -> None:
    d = torch.tensor([0.0, math.log(2.0), -math.log(2.0)], dtype=torch.float64)
    expected = torch.tensor([0.0, 1.0 - math.log(2.0), -0.5 + math.log(2.0)], dtype=torch.float64)
    torch.testing.assert_close(kl_k3(d), expected)
    # samples from old = N(0, 1), new = N(0.5, 1): KL(old || new) = 0.5^2 / 2 = 0.125
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200_000, generator=g, dtype=torch.float64)
    old = torch.distributions.Normal(0.0, 1.0)
    new = torch.distributions.Normal(0.5, 1.0)
    estimate = kl_k3(new.log_prob(x) - old.log_prob(x)).mean()
    assert abs(estimate.item() - 0.125) < 0.005


X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    ("mode", "masked", "unmasked"),
    [
        ("mean", 7.0 / 3.0, 3.5),  # (1 + 2 + 4) / 3 valid elements
        ("token_mean", 7.0 / 3.0, 3.5),
        ("sum", 7.0, 21.0),
        ("seq_mean_token_mean", (1.5 + 4.0) / 2.0, 3.5),  # row means 1.5 and 4
        ("seq_mean_token_sum", (3.0 + 4.0) / 2.0, (6.0 + 15.0) / 2.0),  # row sums 3 and 4
        ("seq_mean_token_sum_norm", 3.5 / 3.0, 10.5 / 3.0),  # / L = 3
    ],
)
def test_aggregate_hand_worked(mode: str, masked: float, unmasked: float) -> None:
    assert aggregate(X, MASK, mode).item() == pytest.approx(masked)
    assert aggregate(X, MASK.float(), mode).item() == pytest.approx(masked)
    assert aggregate(X, None, mode).item() == pytest.approx(unmasked)


def test_aggregate_registry_covers_tested_modes_and_rejects_unknown() -> None:
    assert set(AGGREGATIONS) == {
        "mean",
        "token_mean",
        "sum",
        "seq_mean_token_mean",
        "seq_mean_token_sum",
        "seq_mean_token_sum_norm",
    }
    with pytest.raises(ValueError, match="known modes: mean, token_mean"):
        aggregate(X, None, "token_avg")
    with pytest.raises(ValueError, match=r"needs x of shape \[B, L\]"):
        aggregate(torch.ones(3), None, "seq_mean_token_sum")
    with pytest.raises(ValueError, match="mask shape"):
        aggregate(X, torch.ones(2, dtype=torch.bool), "mean")
    # a fully masked batch contributes 0, not NaN
    assert aggregate(X, torch.zeros_like(MASK), "token_mean").item() == 0.0
    assert aggregate(X, torch.zeros_like(MASK), "seq_mean_token_mean").item() == 0.0


def test_policy_loss_hand_worked() -> None:
    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5])
    logp_old = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    logp_new = (logp_old + ratio.log()).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, metrics = policy_loss(logp_new, logp_old, adv, 0.2, 0.2)
    # per element (clip 0.2): -1.2 (clipped), 1.5, -0.5, 0.8 (clipped): mean 0.15
    assert loss.item() == pytest.approx(0.15, abs=1e-6)
    assert loss.requires_grad
    k3_up, k3_down = 0.5 - math.log(1.5), -0.5 + math.log(2.0)
    assert metrics["clipfrac"].item() == pytest.approx(0.5)
    assert metrics["approx_kl"].item() == pytest.approx((k3_up + k3_down) / 2.0, abs=1e-6)
    assert all(not m.requires_grad for m in metrics.values())

    mask = torch.tensor([False, True, True, True])
    loss_m, metrics_m = policy_loss(logp_new, logp_old, adv, 0.2, 0.2, mask=mask, agg="token_mean")
    assert loss_m.item() == pytest.approx((1.5 - 0.5 + 0.8) / 3.0, abs=1e-6)
    assert metrics_m["clipfrac"].item() == pytest.approx(1.0 / 3.0)
    assert metrics_m["approx_kl"].item() == pytest.approx((k3_up + 2 * k3_down) / 3, abs=1e-6)


def test_policy_loss_sequence_advantages_broadcast() -> None:
    # two sequences of two tokens, one advantage per sequence ([B, 1] against [B, L])
    logp_old = torch.zeros(2, 2)
    logp_new = torch.tensor([[math.log(1.1), math.log(0.9)], [0.0, math.log(2.0)]])
    adv = torch.tensor([[2.0], [-1.0]])
    loss, _ = policy_loss(logp_new, logp_old, adv, 0.2, 0.2, agg="seq_mean_token_mean")
    # seq 0: -(2.2), -(1.8) -> mean -2.0; seq 1: -(-1), -min(-2, -1.2) = 1, 2 -> mean 1.5
    assert loss.item() == pytest.approx((-2.0 + 1.5) / 2.0, abs=1e-6)


def test_value_loss_hand_worked() -> None:
    value = torch.tensor([1.0, 2.0, 0.0, 1.0], requires_grad=True)
    old_value = torch.tensor([0.5, 2.5, 0.0, 0.5])
    returns = torch.tensor([2.0, 1.0, 1.0, 0.6])
    loss, metrics = value_loss(value, old_value, returns, clip=None)
    # squared errors 1, 1, 1, 0.16 -> half mean
    assert loss.item() == pytest.approx(0.5 * 3.16 / 4.0)
    assert metrics["value_clipfrac"].item() == 0.0

    loss_c, metrics_c = value_loss(value, old_value, returns, clip=0.2)
    # clipped predictions 0.7, 2.3, 0.0, 0.7 -> errors 1.69, 1.69, 1.0, 0.01
    # elementwise max with 1, 1, 1, 0.16 -> 1.69, 1.69, 1.0, 0.16
    assert loss_c.item() == pytest.approx(0.5 * 4.54 / 4.0)
    assert metrics_c["value_clipfrac"].item() == pytest.approx(0.5)
    loss_c.backward()
    # the clipped branch blocks gradients; elsewhere d/dv = (v - R) / B
    torch.testing.assert_close(value.grad, torch.tensor([0.0, 0.0, -1.0, 0.4]) / 4.0)
    with pytest.raises(ValueError, match="positive or None"):
        value_loss(value, old_value, returns, clip=0.0)


def test_surrogate_hand_worked_and_equals_unclipped_clipped_surrogate() -> None:
    ratio = torch.tensor([1.5, 0.5, 2.0, 1.0], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0, -0.5, 3.0], dtype=torch.float64)
    log_ratio = ratio.log().requires_grad_(True)
    loss = surrogate(log_ratio, adv)
    # -r A: -1.5, 1.0, 1.0, -3.0; no clipping, however far the ratio moves
    torch.testing.assert_close(loss, torch.tensor([-1.5, 1.0, 1.0, -3.0], dtype=torch.float64))
    loss.sum().backward()
    # d(-r A)/d log r = -r A: the policy gradient at r = 1 is -A
    torch.testing.assert_close(log_ratio.grad, torch.tensor([-1.5, 1.0, 1.0, -3.0],
                                                            dtype=torch.float64))
    unclipped, clipped = clipped_surrogate(log_ratio.detach(), adv, math.inf, math.inf)
    torch.testing.assert_close(surrogate(log_ratio.detach(), adv), unclipped)
    assert not clipped.any()
    # advantages broadcast against per-token log-ratios, as for sequences
    per_token = surrogate(torch.zeros(2, 3), torch.tensor([[1.0], [-2.0]]))
    torch.testing.assert_close(per_token, torch.tensor([[-1.0] * 3, [2.0] * 3]))


def test_trpo_surrogate_and_gaussian_kl_by_hand() -> None:
    from torch.distributions import Normal

    from robotrl.algos.pg_core import gaussian_kl, surrogate_loss

    logp_new = torch.tensor([0.0, math.log(2.0)])
    logp_old = torch.tensor([0.0, 0.0])
    adv = torch.tensor([1.0, -3.0])
    loss, metrics = surrogate_loss(logp_new, logp_old, adv)
    assert loss.item() == pytest.approx(-(1.0 * 1.0 + 2.0 * -3.0) / 2)  # -mean(r A) = 2.5
    assert metrics["ratio_mean"].item() == pytest.approx(1.5)
    old = Normal(torch.zeros(2, 1), torch.ones(2, 1))
    new = Normal(torch.tensor([[1.0], [0.0]]), torch.tensor([[1.0], [2.0]]))
    # KL(N(0,1) || N(m,s)) = log s + (1 + m^2) / (2 s^2) - 1/2: rows 0.5 and log 2 - 3/8
    expected = (0.5 + (math.log(2.0) + 1 / 8 - 0.5)) / 2
    assert gaussian_kl(old, new).item() == pytest.approx(expected)
