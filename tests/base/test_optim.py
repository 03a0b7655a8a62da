"""The shared optimizer step: gradient norm, clipping, hooks, the one non-finite message."""

from __future__ import annotations

import pytest
import torch

from robotrl import optim
from robotrl.optim import GradientStep, NonFiniteError


def _setup(max_grad_norm: float = 0.0) -> tuple[torch.nn.Linear, GradientStep]:
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)
    step = GradientStep("ALG", "critic", torch.optim.SGD(net.parameters(), lr=1.0), None,
                        max_grad_norm)
    return net, step


def test_step_reports_norm_and_clips() -> None:
    net, step = _setup()
    x = torch.ones(4, 3)
    before = [p.detach().clone() for p in net.parameters()]
    norm = step((net(x) * 10).sum(), "here")
    expected = torch.sqrt(torch.tensor(4 * 10.0) ** 2 * 3 + torch.tensor(40.0) ** 2)
    torch.testing.assert_close(norm, expected)
    torch.testing.assert_close(net.weight, before[0] - 40.0)  # unclipped: lr 1 x grad 40
    assert step.metric == "train/grad_norm/critic"
    net, step = _setup(max_grad_norm=1.0)
    step((net(x) * 10).sum(), "here")
    assert torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in net.parameters()])) \
        == pytest.approx(1.0, rel=1e-5)


def test_non_finite_loss_names_algorithm_loss_and_place_and_skips() -> None:
    net, step = _setup()
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(NonFiniteError, match=r"ALG critic loss or its gradient is non-finite "
                                             r"\(NaN/Inf\) at epoch 2.*unchanged"):
        step(net(torch.full((1, 3), float("nan"))).sum(), "epoch 2")
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    assert all(p.grad is None for p in net.parameters())
    assert issubclass(NonFiniteError, FloatingPointError)  # the runner keeps its checkpoint


def test_gradient_hooks_see_gradients_before_clipping(monkeypatch) -> None:  # noqa: ANN001
    seen = []

    def halve(params: list[torch.Tensor], riders: torch.Tensor | None) -> torch.Tensor | None:
        seen.append(len(params))  # what an all-reduce mean would do
        for p in params:
            p.grad.mul_(0.5)
        return None if riders is None else riders * 0.5

    monkeypatch.setattr(optim, "GRADIENT_HOOKS", [halve])
    net, step = _setup()
    norm = step(net(torch.ones(1, 3)).sum(), "here")
    assert seen == [2] and norm.item() == pytest.approx(0.5 * 2.0)  # grads 1,1,1 and 1
    # riders travel through the same hook and come back as it left them
    norm, riders = step.backward(net(torch.ones(1, 3)).sum(), torch.tensor([4.0, 2.0]))
    assert riders.tolist() == [2.0, 1.0] and norm.item() == pytest.approx(1.0)


@pytest.mark.parametrize("max_grad_norm", [0.0, 0.5])
def test_flat_parameters_step_as_the_separate_parameters_do(max_grad_norm: float) -> None:
    """Adam over one flat tensor (FlatParameters) gives the separate parameters' update: same
    gradient norm, clipping and parameters after three steps, with a parameter the loss does
    not reach (its gradient counts as zero); the modules' state_dict is unchanged in form."""
    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.ModuleDict({"a": torch.nn.Linear(3, 4), "b": torch.nn.Linear(4, 2),
                                    "unused": torch.nn.Linear(2, 2)})

    x = torch.randn(5, 3)
    ref, flat_net = build(), build()
    ref_step = GradientStep("ALG", "pi", optim.adam(ref.parameters(), 0.1), None,
                            max_grad_norm)
    flat = optim.FlatParameters(flat_net.parameters())
    flat_step = GradientStep("ALG", "pi", optim.adam([flat.flat], 0.1), None, max_grad_norm,
                             flat=flat)
    for _ in range(3):
        norms = [step((net["b"](net["a"](x)) ** 2).sum(), "here")
                 for net, step in ((ref, ref_step), (flat_net, flat_step))]
        torch.testing.assert_close(norms[0], norms[1])
    for (name, p), q in zip(ref.named_parameters(), flat_net.parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=name)
        assert q.grad is None
    assert flat_net.state_dict().keys() == ref.state_dict().keys()
    # loading weights copies into the flat tensor's views
    flat_net.load_state_dict({k: torch.zeros_like(v) for k, v in ref.state_dict().items()})
    assert float(flat.flat.detach().abs().sum()) == 0.0
    # an optimizer state saved over the separate parameters loads into the flat one
    flat_opt = optim.adam([flat.flat], 0.1)
    flat_opt.load_state_dict(flat.flat_optimizer_state(ref_step.optimizer.state_dict()))
    state = flat_opt.state[flat.flat]
    torch.testing.assert_close(state["exp_avg"][:12], ref_step.optimizer.state[ref["a"].weight]
                               ["exp_avg"].flatten())
    assert int(state["step"]) == 3
    with pytest.raises(ValueError, match="has 2 parameters; this model has 6"):
        flat.flat_optimizer_state({"state": {}, "param_groups": [{"params": [0, 1]}]})
