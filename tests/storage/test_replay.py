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


def _n_step_by_hand(log: list[dict[str, torch.Tensor]], t: int, w: int, n: int,
                    gamma: float) -> tuple[float, float, float, bool]:
    """World ``w``'s n-step transition from step ``t`` of the add log: (reward sum, next obs,
    discount, terminated), stepping through its episode one step at a time."""
    total, steps = 0.0, 0
    for j in range(t, min(t + n, len(log))):
        row = log[j]
        total += gamma ** steps * float(row["reward"][w])
        steps += 1
        if row["terminated"][w] or row["truncated"][w]:
            break
    last = log[t + steps - 1]
    term = bool(last["terminated"][w])
    return total, float(last["next_obs"][w, 0]), (0.0 if term else gamma ** steps), term


@pytest.mark.parametrize("capacity, worlds, adds", [(64, 4, 9), (23, 4, 11), (12, 3, 3)])
def test_n_step_follows_each_world_to_its_episode_end_and_the_newest_step(
        capacity: int, worlds: int, adds: int) -> None:
    """Every row's n-step transition (n = 1..4) equals one walked step by step through its
    world's episode: rewards summed with gamma^k, cut after a terminated or truncated step and
    at the newest step stored, next obs and termination of the last step used, discount
    gamma^m or 0; on a ring that wrapped (capacity not a multiple of the worlds too)."""
    g = torch.Generator().manual_seed(0)
    buf = ReplayBuffer(capacity, obs_dim=1, act_dim=1)
    log, gamma = [], 0.9
    for t in range(adds):
        step = {"obs": torch.full((worlds, 1), float(t)) + torch.arange(worlds)[:, None] / 10,
                "action": torch.zeros(worlds, 1), "reward": torch.rand(worlds, generator=g),
                "next_obs": torch.randn(worlds, 1, generator=g),
                "terminated": torch.rand(worlds, generator=g) < 0.2,
                "truncated": torch.rand(worlds, generator=g) < 0.15}
        buf.add(**step)
        log.append(step)
    first = max(0, adds - capacity // worlds)  # steps whose rows all survive the wrap
    for n in (1, 2, 3, 4):
        rows = [(t * worlds + w) % capacity for t in range(first, adds) for w in range(worlds)]
        out = buf.n_step(torch.tensor(rows), n, gamma)
        i = 0
        for t in range(first, adds):
            for w in range(worlds):
                total, nxt, discount, term = _n_step_by_hand(log, t, w, n, gamma)
                assert float(out["obs"][i, 0]) == pytest.approx(t + w / 10)
                assert float(out["reward"][i]) == pytest.approx(total, rel=1e-5), (n, t, w)
                assert float(out["next_obs"][i, 0]) == nxt and bool(out["terminated"][i]) == term
                assert float(out["discount"][i]) == pytest.approx(discount, rel=1e-5)
                i += 1
    one = buf.n_step(torch.arange(len(buf)), 1, gamma)  # n = 1: the rows as stored
    for name in ("obs", "action", "reward", "next_obs", "terminated"):
        assert torch.equal(one[name], getattr(buf, name)[: len(buf)])


def test_n_step_needs_equal_adds_and_n_at_least_1() -> None:
    buf = ReplayBuffer(capacity=16, obs_dim=2, act_dim=1)
    with pytest.raises(RuntimeError, match="no add yet"):
        buf.n_step(torch.zeros(1, dtype=torch.long), 3, 0.99)
    _step(buf, 0, 4)
    _step(buf, 4, 2)
    with pytest.raises(RuntimeError, match="varying sizes"):
        buf.n_step(torch.zeros(1, dtype=torch.long), 3, 0.99)
    with pytest.raises(ValueError, match="n >= 1"):
        buf.n_step(torch.zeros(1, dtype=torch.long), 0, 0.99)
    state = buf.state_dict()
    again = ReplayBuffer(capacity=16, obs_dim=2, act_dim=1)
    again.load_state_dict(state)
    assert again.stride is None  # varying sizes: unknown until the next add
