"""MLP builder and Gaussian actor-critic."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from robotrl.nn.mlp import ACTIVATIONS, mlp
from robotrl.nn.policy import LOG_STD_MAX, GaussianActorCritic
from robotrl.nn.residual import ResidualMLP


def test_mlp_structure_activations_and_init() -> None:
    net = mlp(3, [8, 5], 2, "elu", ortho_init=True, out_gain=0.01)
    linears = [m for m in net if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(3, 8), (8, 5), (5, 2)]
    assert sum(isinstance(m, nn.ELU) for m in net) == 2
    assert net(torch.zeros(7, 3)).shape == (7, 2)
    # orthogonal rows scaled by the gain: W W^T = gain^2 I for a wide-to-narrow layer
    w = linears[-1].weight
    torch.testing.assert_close(w @ w.T, 1e-4 * torch.eye(2), atol=1e-7, rtol=0)
    assert all(torch.count_nonzero(m.bias) == 0 for m in linears)
    trunk = mlp(3, [8], None, "relu")
    assert isinstance(trunk[-1], nn.ReLU) and trunk(torch.zeros(1, 3)).shape == (1, 8)
    assert set(ACTIVATIONS) == {"relu", "tanh", "elu", "silu", "gelu"}
    with pytest.raises(ValueError, match="known activations: relu, tanh, elu, silu, gelu"):
        mlp(3, [8], 2, "swish")


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("state_dependent_std", [False, True])
def test_actor_critic_shapes_and_std(shared: bool, state_dependent_std: bool) -> None:
    torch.manual_seed(0)
    ac = GaussianActorCritic(5, 3, (16, 16), (8,), "tanh", shared, -0.5, state_dependent_std)
    obs = torch.randn(4, 5)
    dist, value = ac(obs)
    assert dist.loc.shape == (4, 3) and value.shape == (4,)
    torch.testing.assert_close(ac.value(obs), value)
    torch.testing.assert_close(ac.dist(obs).loc, dist.loc)
    torch.testing.assert_close(ac.deterministic(obs), dist.loc)
    # small output gain: log std starts near init_log_std, means near 0
    torch.testing.assert_close(dist.scale.log(), torch.full((4, 3), -0.5), atol=0.05, rtol=0)
    assert dist.loc.abs().max() < 0.1
    if not state_dependent_std:
        with torch.no_grad():
            ac.log_std.fill_(10.0)
        assert ac.dist(obs).scale.log().max().item() == pytest.approx(LOG_STD_MAX)


def test_residual_mlp_structure_and_block_formula() -> None:
    torch.manual_seed(0)
    net = ResidualMLP(5, 16, 3, 2, "silu")
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 2 * 3 + 2
    assert sum(isinstance(m, nn.LayerNorm) for m in net.modules()) == 3 + 1
    assert net(torch.randn(4, 7, 5)).shape == (4, 7, 2)  # any leading dims
    block, x = net.blocks[0], torch.randn(6, 16)
    expected = x + block.fc2(nn.functional.silu(block.fc1(nn.functional.layer_norm(
        x, (16,), block.norm.weight, block.norm.bias))))
    torch.testing.assert_close(block(x), expected)
    with torch.no_grad():  # pre-norm: the skip path is the identity
        block.fc2.weight.zero_()
    torch.testing.assert_close(block(x), x)
    assert ResidualMLP(5, 16, 0, 2)(torch.randn(3, 5)).shape == (3, 2)
    with pytest.raises(ValueError, match="known activations"):
        ResidualMLP(5, 16, 2, 2, "swish")
    with pytest.raises(ValueError, match="num_blocks must be >= 0"):
        ResidualMLP(5, 16, -1, 2)


def test_residual_mlp_stays_trainable_at_depth() -> None:
    """128 blocks (258 linear layers): the residual stream and the gradients neither explode
    nor vanish across depth, thanks to pre-norm and the 1/sqrt(num_blocks) output scale."""
    torch.manual_seed(0)
    net = ResidualMLP(10, 32, 128, 3)
    x = torch.randn(32, 10)
    stream_in = net.input(x)
    growth = (net.blocks(stream_in).var() / stream_in.var()).item()
    assert 0.9 < growth < 2.0
    net(x).square().mean().backward()
    first = net.blocks[0].fc1.weight.grad.norm().item()
    last = net.blocks[-1].fc1.weight.grad.norm().item()
    assert first > 0 and 0.2 < first / last < 5.0
    assert all(torch.isfinite(p.grad).all() for p in net.parameters())


@pytest.mark.parametrize("layer_norm", [False, True])
def test_ensemble_member_equals_its_slice_of_the_ensemble(layer_norm: bool) -> None:
    from robotrl.nn.ensemble import EnsembleQ

    q = EnsembleQ(5, 2, (8, 8), 3, layer_norm=layer_norm)
    with torch.no_grad():
        for p in q.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # LayerNorm gains away from their init of 1
    obs, action = torch.randn(4, 5), torch.randn(4, 2)
    full = q(obs, action)
    for i in range(3):
        assert torch.allclose(q.member(obs, action, i), full[i], atol=1e-6)


@pytest.mark.parametrize("kind", ["plain", "layer_norm", "distributional", "batch_renorm"])
def test_ensemble_sampled_actions_equal_the_repeated_rows(kind: str) -> None:
    """``EnsembleQ.sampled`` (the first layer's state columns once per state) gives ``forward``
    on every (state, action) row, values and gradients, in float64."""
    from robotrl.nn.ensemble import EnsembleQ

    torch.manual_seed(0)
    options = {"plain": {}, "layer_norm": {"layer_norm": True}, "distributional": {"out_dim": 4},
               "batch_renorm": {"batch_renorm": {}}}[kind]
    q = EnsembleQ(5, 2, (8, 8), 3, **options).double()
    obs, actions = torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 6, 2, dtype=torch.float64)
    sampled = q.sampled(obs, actions)
    rows = q(obs.repeat_interleave(6, 0), actions.reshape(24, 2))
    assert sampled.shape == (3, 4, 6, *rows.shape[2:])
    torch.testing.assert_close(sampled, rows.view(sampled.shape), rtol=0, atol=1e-12)
    grads = torch.autograd.grad(sampled.square().sum(), list(q.parameters()))
    again = torch.autograd.grad(rows.square().sum(), list(q.parameters()))
    for g, h in zip(grads, again, strict=True):
        torch.testing.assert_close(g, h, rtol=0, atol=1e-10)
