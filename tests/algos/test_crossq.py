"""CrossQ: Batch Renormalization against hand-worked numbers and torch's BatchNorm, the joint
(s, a) / (s', a') critic batch, no target critics, modes, export, bad config (its learning
run is in tests/algos/test_sac.py, beside SAC's)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from robotrl.algos.crossq import CrossQ, CrossQConfig
from robotrl.nn.batch_renorm import BatchRenorm, training
from robotrl.nn.ensemble import EnsembleQ


# ------------------------------------------------------------------ Batch Renormalization
def test_warmup_is_batch_norm_hand_worked() -> None:
    layer = BatchRenorm(1, momentum=0.5, eps=1e-3)
    x = torch.tensor([[1.0], [3.0]])  # mean 2, biased variance 1, unbiased 2
    with training(layer):
        y = layer(x)
    torch.testing.assert_close(y, torch.tensor([[-1.0], [1.0]]) / math.sqrt(1.001))
    assert layer.running_mean.item() == pytest.approx(1.0)  # 0 + 0.5 (2 - 0)
    assert layer.running_var.item() == pytest.approx(1.5)  # 1 + 0.5 (2 - 1)
    assert int(layer.steps) == 1 and not layer.training
    # evaluation: the running statistics, nothing updated
    torch.testing.assert_close(layer(x), (x - 1.0) / math.sqrt(1.5 + 1e-3))
    assert int(layer.steps) == 1


def test_warmup_matches_torch_batchnorm_with_gradients() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 5) * 3 + 1
    ours, ref = BatchRenorm(5, momentum=0.1, eps=1e-3), nn.BatchNorm1d(5, eps=1e-3, momentum=0.1)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 2.0)
        ours.bias.uniform_(-1.0, 1.0)
        ref.weight.copy_(ours.weight)
        ref.bias.copy_(ours.bias)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    with training(ours):
        ya = ours(xa)
    yb = ref.train()(xb)
    torch.testing.assert_close(ya, yb)
    (ya.square().sum()).backward()
    (yb.square().sum()).backward()
    torch.testing.assert_close(xa.grad, xb.grad)
    torch.testing.assert_close(ours.running_var, ref.running_var)


def test_renormalization_corrects_towards_running_statistics() -> None:
    layer = BatchRenorm(1, momentum=0.5, eps=1e-3, warmup_steps=0, dmax=0.25)
    with torch.no_grad():
        layer.running_mean.fill_(1.0)
        layer.running_var.fill_(1.0)
    x = torch.tensor([[1.0], [3.0]], requires_grad=True)
    with training(layer):
        y = layer(x)
    std = math.sqrt(1.001)
    # r = std_B / std = 1, d = (2 - 1) / std = 0.9995 clamped to dmax = 0.25
    torch.testing.assert_close(y.detach(), torch.tensor([[-1.0], [1.0]]) / std + 0.25)
    # r and d are not differentiated: the gradient is batch norm's (zero for a plain sum)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.zeros(2, 1), atol=1e-6, rtol=0)
    without_clamp = BatchRenorm(1, warmup_steps=0, eps=1e-3)
    with torch.no_grad():
        without_clamp.running_mean.fill_(1.0)
        without_clamp.running_var.fill_(1.0)
    with training(without_clamp):  # unclamped, training output = evaluation output
        y = without_clamp(x.detach())
    torch.testing.assert_close(y, (x.detach() - 1.0) / std)


def test_sb3_contrib_variant_hand_worked() -> None:
    """``variant="sb3_contrib"``: the unbiased batch variance, also while warming up, and the
    correction as a shifted mean and a scaled variance (tests/reference/test_sb3_contrib.py
    checks it against sb3-contrib itself)."""
    layer = BatchRenorm(1, momentum=0.5, eps=1e-3, warmup_steps=1, variant="sb3_contrib")
    x = torch.tensor([[1.0], [3.0]])  # mean 2, unbiased variance 2
    with training(layer):
        torch.testing.assert_close(layer(x), torch.tensor([[-1.0], [1.0]]) / math.sqrt(2.001))
    assert layer.running_mean.item() == pytest.approx(1.0)
    assert layer.running_var.item() == pytest.approx(1.5)
    r, d = math.sqrt(2.001 / 1.501), 1.0 / math.sqrt(1.501)  # both inside their bounds
    mean, var = 2.0 - d * math.sqrt(2.0) / r, 2.0 / r**2
    with training(layer):
        torch.testing.assert_close(layer(x), (x - mean) / math.sqrt(var + 1e-3))
    with pytest.raises(ValueError, match="unknown Batch Renormalization variant 'paper'; "
                                         "known: ioffe, sb3_contrib"):
        BatchRenorm(1, variant="paper")
    with pytest.raises(ValueError, match="unknown renorm_variant 'paper'"):
        CrossQConfig(renorm_variant="paper")


def test_ensemble_members_keep_their_own_statistics() -> None:
    layer = BatchRenorm(3, members=2, momentum=1.0)
    x = torch.stack([torch.randn(16, 3), torch.randn(16, 3) * 5 + 2])
    with training(layer):
        layer(x)
    torch.testing.assert_close(layer.running_mean, x.mean(1, keepdim=True))
    torch.testing.assert_close(layer.running_var, x.var(1, keepdim=True))
    y = layer(x)  # eval: member i alone equals row i
    torch.testing.assert_close(layer.member(x[1], 1), y[1])
    shared = layer(x[0])  # one input for every member
    assert shared.shape == (2, 16, 3)
    with pytest.raises(ValueError, match=r"expects \[2, B, H\] with H = 3"):
        layer(torch.randn(2, 16, 4))
    with pytest.raises(RuntimeError, match="eval mode"), training(layer):
        layer.member(x[0], 0)


def test_steps_survive_a_state_dict_round_trip() -> None:
    layer = BatchRenorm(2, warmup_steps=1)
    with training(layer):
        layer(torch.randn(8, 2))
    fresh = BatchRenorm(2, warmup_steps=1)
    fresh.load_state_dict(layer.state_dict())
    x = torch.randn(8, 2)
    with training(fresh), training(layer):  # both past warm-up: the same renormalized output
        torch.testing.assert_close(fresh(x), layer(x))
    assert int(fresh.steps) == 2


# ------------------------------------------------------------------ CrossQ
def _filled(cfg: CrossQConfig, next_value: float = 1.0) -> CrossQ:
    """A learner whose replay holds 64 transitions from observation 0 to ``next_value``."""
    alg = CrossQ(3, -torch.ones(2), torch.ones(2), 4, cfg, seed=0)
    no = torch.zeros(4, dtype=torch.bool)
    for _ in range(16):
        alg.act(torch.zeros(4, 3))
        alg.process_env_step(torch.ones(4), no, no, torch.full((4, 3), next_value))
    return alg


def test_critic_normalizes_current_and_next_states_as_one_batch() -> None:
    cfg = CrossQConfig(learning_starts=0, batch_size=32, actor_hidden=(8,), critic_hidden=(8,),
                       renorm_momentum=1.0)
    alg = _filled(cfg)
    alg.update()
    first = alg.critic.net[0]
    assert isinstance(first, BatchRenorm)
    # observation columns: half the rows 0 (s), half 1 (s'): mean 0.5 (s alone would give 0)
    torch.testing.assert_close(first.running_mean[:, 0, :3], torch.full((2, 3), 0.5))
    assert alg.critic_target is None and "critic_target" not in alg.state_dict()
    assert not alg.critic.training and not alg.actor.training  # eval outside the update
    actor_first = alg.actor.net[0]
    assert isinstance(actor_first, BatchRenorm)
    assert int(actor_first.steps) == alg.num_updates // cfg.actor_update_interval > 0


def test_uses_the_papers_optimizer_and_refuses_tau() -> None:
    alg = _filled(CrossQConfig(learning_starts=0, actor_hidden=(8,), critic_hidden=(8,)))
    assert alg.critic_opt.param_groups[0]["betas"] == (0.5, 0.999)
    assert alg.actor_opt.param_groups[0]["lr"] == 1e-3
    with pytest.raises(ValueError, match="no target networks, so tau does not apply"):
        CrossQConfig(tau=0.01)
    with pytest.raises(ValueError, match="adam_beta1 must be in"):
        CrossQConfig(adam_beta1=1.0)


def test_export_uses_running_statistics() -> None:
    alg = _filled(CrossQConfig(learning_starts=0, batch_size=32, actor_hidden=(16, 16),
                               critic_hidden=(8,)))
    for _ in range(3):
        alg.owed_updates += 32
        alg.update()
    obs = torch.randn(32, 3) * 2
    exported = alg.export_actor()
    torch.testing.assert_close(exported(obs), alg.act_deterministic(obs), rtol=0, atol=1e-6)
    steps = int(alg.actor.net[0].steps)
    alg.act_deterministic(obs)
    exported(obs)
    assert int(alg.actor.net[0].steps) == steps  # acting never updates the statistics


def test_ensemble_q_with_batch_renorm_layout() -> None:
    q = EnsembleQ(3, 2, (8, 8), 2, batch_renorm={"momentum": 0.1})
    norms = [m for m in q.net if isinstance(m, BatchRenorm)]
    assert [m.num_features for m in norms] == [5, 8, 8]  # before every linear layer
    assert q(torch.randn(4, 3), torch.randn(4, 2)).shape == (2, 4)
