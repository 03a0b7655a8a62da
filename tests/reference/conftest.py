"""Shared pieces of the reference-equivalence suite (``pytest -m reference``).

Every test here builds one of our learners and a peer's (or an independent float64
re-derivation from the paper) with the same hyperparameters, copies the same initial weights
into both, feeds both the same batch and the same injected noise, and compares every loss
term, gradient, parameter and optimizer moment after several updates within ``RTOL``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import torch

RTOL = 1e-9
"""Relative tolerance of every comparison (float64 on both sides)."""
ATOL = 1e-12
"""Absolute floor, for entries that are exactly zero on one side (a ReLU's dead unit)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/reference/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.reference)


@pytest.fixture(autouse=True)
def float64() -> Iterator[None]:
    """Every reference test runs in float64 (modules built inside it default to float64)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def assert_close(ours: Any, theirs: Any, what: str, rtol: float = RTOL) -> float:
    """Assert two tensors (or nested mappings/sequences of them, or numbers) are equal within
    ``rtol`` relative (``ATOL`` floor); the message names ``what`` and the worst entry.
    Returns the largest relative difference seen (for the summary table)."""
    if isinstance(ours, Mapping):
        assert set(ours) == set(theirs), f"{what}: keys {sorted(ours)} != {sorted(theirs)}"
        return max((assert_close(ours[k], theirs[k], f"{what}[{k!r}]", rtol) for k in ours),
                   default=0.0)
    if isinstance(ours, (list, tuple)):
        assert len(ours) == len(theirs), f"{what}: {len(ours)} != {len(theirs)} entries"
        return max((assert_close(a, b, f"{what}[{i}]", rtol)
                    for i, (a, b) in enumerate(zip(ours, theirs, strict=True))), default=0.0)
    a = torch.as_tensor(ours, dtype=torch.float64).detach().cpu()
    b = torch.as_tensor(theirs, dtype=torch.float64).detach().cpu()
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    diff = (a - b).abs()
    scale = torch.maximum(a.abs(), b.abs())
    bad = diff > rtol * scale + ATOL
    rel = (diff / scale.clamp_min(ATOL / rtol)).max().item() if a.numel() else 0.0
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(
            f"{what}: ours {a.flatten()[i].item()!r} != theirs {b.flatten()[i].item()!r} "
            f"(relative difference {rel:.3e} > {rtol:g}; {int(bad.sum())} of {a.numel()} entries)")
    return rel


@pytest.fixture
def close() -> Callable[..., float]:
    """``assert_close`` as a fixture: ``close(ours, theirs, "critic loss")``."""
    return assert_close


def record_ppo_updates(ours: Any, monkeypatch: pytest.MonkeyPatch,
                       rename: Callable[[str], str]) -> list[dict[str, Any]]:
    """Per optimizer step of our PPO's ``update``: what ``ppo_loss`` returned, the gradient
    norm, the lr, the (clipped) gradients, then the parameters and Adam's state after the step;
    parameters are keyed by ``rename(our name)`` (the peer's name for it)."""
    from robotrl.algos import ppo as ppo_module

    steps: list[dict[str, Any]] = []
    loss_fn, backward, optimizer_step = ppo_module.ppo_loss, ours.step.backward, ours.optimizer.step
    flat = ours.flat.flat
    names = [rename(n) for n, _ in ours.policy.named_parameters()]
    assert [id(p) for _, p in ours.policy.named_parameters()] == [id(p) for p in ours.flat.params]
    sizes, shapes = [p.numel() for p in ours.flat.params], [p.shape for p in ours.flat.params]

    def split(x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {n: v.reshape(shape).clone()
                for n, v, shape in zip(names, x.split(sizes), shapes, strict=True)}

    def recording_loss(policy: Any, batch: dict[str, torch.Tensor], cfg: Any) -> Any:
        loss, metrics = loss_fn(policy, batch, cfg)
        steps.append({"advantages": batch["advantages"].clone(),
                      **dict(zip(ppo_module.LOSS_METRIC_KEYS, metrics, strict=True))})
        return loss, metrics

    def recording_backward(loss: torch.Tensor, riders: torch.Tensor) -> Any:
        grad_norm, riders = backward(loss, riders)
        steps[-1]["grad_norm"] = grad_norm.clone()
        return grad_norm, riders

    def recording_step() -> None:
        steps[-1]["grads"] = split(flat.grad)
        steps[-1]["lr"] = ours.optimizer.param_groups[0]["lr"]
        optimizer_step()
        state = ours.optimizer.state[flat]
        steps[-1]["params"] = split(flat.detach())
        steps[-1]["exp_avg"] = split(state["exp_avg"])
        steps[-1]["exp_avg_sq"] = split(state["exp_avg_sq"])
        steps[-1]["step"] = float(state["step"])

    monkeypatch.setattr(ppo_module, "ppo_loss", recording_loss)
    monkeypatch.setattr(ours.step, "backward", recording_backward)
    monkeypatch.setattr(ours.optimizer, "step", recording_step)
    return steps


def adam_state(optimizer: torch.optim.Optimizer, params: dict[str, torch.nn.Parameter],
               step_of: str) -> dict[str, Any]:
    """A peer's parameters and Adam moments (by name) after its step, and the step count of
    the parameter ``step_of``."""
    return {"params": {n: p.detach().clone() for n, p in params.items()},
            **{key: {n: optimizer.state[p][key].clone() for n, p in params.items()}
               for key in ("exp_avg", "exp_avg_sq")},
            "step": float(optimizer.state[params[step_of]]["step"])}


@pytest.fixture
def record_ppo() -> Callable[..., list[dict[str, Any]]]:
    """``record_ppo_updates`` as a fixture."""
    return record_ppo_updates


@pytest.fixture
def peer_adam() -> Callable[..., dict[str, Any]]:
    """``adam_state`` as a fixture (test modules cannot import the conftest)."""
    return adam_state
