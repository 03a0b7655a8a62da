"""Replay ring: wrap-around, separate flags, seeded sampling, checkpoint round trip, bad input."""

from __future__ import annotations

import pytest
import torch

from robotrl.storage.replay import FIELDS, ReplayBuffer


def _step(buf: ReplayBuffer, start: int, n: int) -> None:
    """Add n transitions whose obs rows are start..start+n-1 (every field derived from it)."""
    ids = torch.arange(start, start + n, dtype=torch.float32)
    buf.add(
        ids[:, None].expand(n, buf.obs_dim),
        -ids[:, None].expand(n, buf.act_dim),
        ids * 10,
        ids[:, None].expand(n, buf.obs_dim) + 0.5,
        ids.long() % 3 == 0,
        ids.long() % 3 == 1,
    )


def test_ring_wraps_and_keeps_the_latest() -> None:
    buf = ReplayBuffer(capacity=5, obs_dim=2, act_dim=1)
    _step(buf, 0, 3)
    assert len(buf) == 3 and buf.pos == 3
    _step(buf, 3, 4)  # rows 3, 4 then wrap: 5, 6 overwrite rows 0, 1
    assert len(buf) == 5 and buf.pos == 2
    assert buf.obs[:, 0].tolist() == [5, 6, 2, 3, 4]
    assert buf.next_obs[:, 0].tolist() == [5.5, 6.5, 2.5, 3.5, 4.5]
    assert buf.reward.tolist() == [50, 60, 20, 30, 40]
    assert buf.terminated.tolist() == [False, True, False, True, False]
    assert buf.truncated.tolist() == [False, False, False, False, True]


def test_sample_is_reproducible_and_consistent() -> None:
    buf = ReplayBuffer(capacity=100, obs_dim=3, act_dim=2)
    _step(buf, 0, 40)
    a = buf.sample(16, torch.Generator().manual_seed(1))
    b = buf.sample(16, torch.Generator().manual_seed(1))
    for name in FIELDS:
        assert torch.equal(a[name], b[name])
    ids = a["obs"][:, 0]
    assert (ids < 40).all()
    assert torch.equal(a["reward"], ids * 10)
    assert torch.equal(a["action"][:, 0], -ids)
    assert torch.equal(a["terminated"], ids.long() % 3 == 0)


def test_state_dict_round_trip() -> None:
    buf = ReplayBuffer(capacity=8, obs_dim=2, act_dim=1)
    _step(buf, 0, 6)
    _step(buf, 6, 5)
    state = buf.state_dict()
    assert state["obs"].shape == (8, 2)
    other = ReplayBuffer(capacity=8, obs_dim=2, act_dim=1)
    other.load_state_dict(state)
    assert (other.pos, other.size) == (buf.pos, buf.size)
    for name in FIELDS:
        assert torch.equal(getattr(other, name), getattr(buf, name))
    with pytest.raises(ValueError, match="capacity 8.*has 4"):
        ReplayBuffer(capacity=4, obs_dim=2, act_dim=1).load_state_dict(state)


def test_bad_input() -> None:
    buf = ReplayBuffer(capacity=4, obs_dim=2, act_dim=1)
    with pytest.raises(RuntimeError, match="empty"):
        buf.sample(1, torch.Generator())
    with pytest.raises(ValueError, match=r"next_obs has shape \(2, 3\), expected \(2, 2\)"):
        buf.add(torch.zeros(2, 2), torch.zeros(2, 1), torch.zeros(2), torch.zeros(2, 3),
                torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        ReplayBuffer(capacity=0, obs_dim=2, act_dim=1)
