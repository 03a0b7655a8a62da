"""RolloutBuffer: step writes, bootstrap values and minibatch coverage."""

from __future__ import annotations

import pytest
import torch

from robotrl.storage import MINIBATCH_KEYS, RolloutBuffer

T, N, D, A = 3, 4, 2, 1


def _fill(buf: RolloutBuffer, truncate: tuple[int, int] | None = None) -> None:
    for t in range(T):
        truncated = torch.zeros(N, dtype=torch.bool)
        if truncate is not None and truncate[0] == t:
            truncated[truncate[1]] = True
        buf.add(
            obs=torch.full((N, D), float(t)),
            action=torch.arange(N, dtype=torch.float32)[:, None] + 10 * t,
            log_prob=torch.full((N,), -float(t)),
            value=torch.arange(N, dtype=torch.float32) + 100 * t,
            reward=torch.ones(N),
            terminated=torch.zeros(N, dtype=torch.bool),
            truncated=truncated,
            truncation_value=torch.full((N,), -7.0),
        )


def test_add_fill_next_value_and_overflow() -> None:
    buf = RolloutBuffer(T, N, D, A)
    _fill(buf, truncate=(1, 2))
    assert buf.full and buf.obs.shape == (T, N, D) and buf.action.shape == (T, N, A)
    with pytest.raises(RuntimeError, match="full"):
        buf.add(
            *(getattr(buf, k)[0] for k in ("obs", "action", "log_prob", "value", "reward")),
            buf.terminated[0],
            buf.truncated[0],
        )
    last = torch.full((N,), 555.0)
    buf.fill_next_value(last)
    # next_value[t] = value[t + 1], last_value at the end, V(final_obs) where truncated
    expected = torch.stack([buf.value[1], buf.value[2], last])
    expected[1, 2] = -7.0
    torch.testing.assert_close(buf.next_value, expected)
    buf.clear()
    assert buf.step == 0
    with pytest.raises(RuntimeError, match="incomplete"):
        buf.fill_next_value(last)


def test_minibatches_cover_every_sample_once() -> None:
    buf = RolloutBuffer(T, N, D, A)
    _fill(buf)
    buf.advantages.copy_(torch.arange(T * N, dtype=torch.float32).reshape(T, N))
    buf.returns.copy_(buf.advantages * 2)
    g = torch.Generator().manual_seed(0)
    batches = list(buf.minibatches(5, g))  # 12 samples in 5 minibatches: sizes 3,3,2,2,2
    assert sorted(len(b["advantages"]) for b in batches) == [2, 2, 2, 3, 3]
    assert all(set(b) == set(MINIBATCH_KEYS) for b in batches)
    seen = torch.cat([b["advantages"] for b in batches])
    assert sorted(seen.long().tolist()) == list(range(T * N))
    assert not torch.equal(seen, torch.arange(T * N, dtype=torch.float32))  # shuffled
    for b in batches:  # fields of one sample stay together
        t, n = b["advantages"].long() // N, b["advantages"].long() % N
        torch.testing.assert_close(b["returns"], 2 * b["advantages"])
        torch.testing.assert_close(b["obs"], t.float()[:, None].expand(-1, D))
        torch.testing.assert_close(b["action"][:, 0], (n + 10 * t).float())
        torch.testing.assert_close(b["value"], (n + 100 * t).float())
    # the same generator state gives the same split
    again = list(buf.minibatches(5, torch.Generator().manual_seed(0)))
    assert all(torch.equal(a["obs"], b["obs"]) for a, b in zip(batches, again, strict=True))
    with pytest.raises(ValueError, match="num_minibatches"):
        next(buf.minibatches(T * N + 1))
