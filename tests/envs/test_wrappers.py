"""Env wrappers on a tiny deterministic fake env: hand-worked numbers and state round trips."""

from __future__ import annotations

import pytest
import torch

from robotrl.envs import make
from robotrl.envs.base import BatchedEnv, EnvSpec, StepOut, check_action
from robotrl.envs.gym import GymnasiumEnv
from robotrl.envs.wrappers import (
    ClipAction,
    RecordEpisodeStatistics,
    RescaleAction,
    Wrapper,
    finished_episodes,
)


class FakeEnv(BatchedEnv):
    """World i runs episodes of ``lengths[i]`` steps, terminated if i is even else truncated.

    Reward at episode step k (1-based) of world i: ``k + 10 * i``. Observations are random
    (from a generator seeded by ``reset``) with per-dimension scale and offset; the last
    observation of an episode is ``-100`` in every entry so it is easy to spot.
    """

    def __init__(self, num_envs: int = 2, lengths: tuple[int, ...] = (2, 3),
                 rewards: torch.Tensor | None = None) -> None:
        self.num_envs = num_envs
        self.device = torch.device("cpu")
        self.spec = EnvSpec(obs_dim=3, action_dim=2, action_low=torch.tensor([-2.0, 0.0]),
                            action_high=torch.tensor([2.0, 4.0]), control_dt=0.1,
                            max_episode_steps=max(lengths), task="fake")
        self.lengths = torch.tensor(lengths)
        self.rewards = rewards  # [T, N] scripted rewards, or None for k + 10 i
        self.t = 0
        self.steps = torch.zeros(num_envs, dtype=torch.long)
        self.gen = torch.Generator().manual_seed(0)
        self.last_action: torch.Tensor | None = None
        self.marker = "inner"

    def _obs(self) -> torch.Tensor:
        return torch.randn(self.num_envs, 3, generator=self.gen) * torch.tensor([1.0, 5, 0.1]) \
            + torch.tensor([0.0, 3, -1])

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self.gen.manual_seed(seed)
        self.steps.zero_()
        self.t = 0
        return self._obs()

    def step(self, action: torch.Tensor) -> StepOut:
        check_action(action, self.spec, self.num_envs)
        self.last_action = action.clone()
        self.steps += 1
        if self.rewards is not None:
            reward = self.rewards[self.t].float()
        else:
            reward = (self.steps + 10 * torch.arange(self.num_envs)).float()
        self.t += 1
        done = self.steps >= self.lengths
        even = torch.arange(self.num_envs) % 2 == 0
        obs = self._obs()
        final = torch.where(done[:, None], torch.full_like(obs, -100.0), obs)
        self.steps[done] = 0
        return StepOut(obs, reward, done & even, done & ~even, {"final_obs": final})

    def get_state(self) -> torch.Tensor:
        return torch.cat([self.steps[:, None].double(), torch.full((self.num_envs, 1),
                                                                   float(self.t))], dim=1)

    def set_state(self, state: torch.Tensor, env_ids: torch.Tensor | None = None) -> None:
        self.steps[:] = state[:, 0].long()
        self.t = int(state[0, 1])


def test_wrapper_forwards_everything() -> None:
    inner = FakeEnv()
    env = Wrapper(Wrapper(inner))
    assert env.num_envs == 2 and env.device == inner.device and env.spec is inner.spec
    assert env.unwrapped is inner
    assert env.marker == "inner"  # unknown attributes come from the inner env
    env.reset(seed=1)
    env.step(torch.zeros(2, 2))
    torch.testing.assert_close(env.get_state(), inner.get_state())
    env.set_state(torch.tensor([[1.0, 7.0], [2.0, 7.0]]))
    assert inner.steps.tolist() == [1, 2] and inner.t == 7
    with pytest.raises(AttributeError):
        _ = env.no_such_attribute
    with pytest.raises(TypeError, match="wraps a BatchedEnv"):
        Wrapper("not an env")  # type: ignore[arg-type]


def test_rescale_action_mapping() -> None:
    inner = FakeEnv()
    env = RescaleAction(inner)
    assert env.spec.action_low.tolist() == [-1.0, -1.0]
    assert env.spec.action_high.tolist() == [1.0, 1.0]
    assert inner.spec.action_low.tolist() == [-2.0, 0.0]  # the inner spec is untouched
    env.reset()
    env.step(torch.tensor([[-1.0, -1.0], [1.0, 1.0]]))
    torch.testing.assert_close(inner.last_action, torch.tensor([[-2.0, 0.0], [2.0, 4.0]]))
    env.step(torch.tensor([[0.0, 0.0], [0.5, -0.5]]))
    torch.testing.assert_close(inner.last_action, torch.tensor([[0.0, 2.0], [1.0, 1.0]]))
    with pytest.raises(ValueError, match="expected"):
        env.step(torch.zeros(2, 3))
    unbounded = FakeEnv()
    unbounded.spec = EnvSpec(3, 1, torch.tensor([-float("inf")]), torch.tensor([1.0]), 0.1, 5)
    with pytest.raises(ValueError, match="finite action bounds"):
        RescaleAction(unbounded)


def test_clip_action() -> None:
    inner = FakeEnv()
    env = ClipAction(inner)
    env.step(torch.tensor([[-5.0, 5.0], [1.0, -1.0]]))
    torch.testing.assert_close(inner.last_action, torch.tensor([[-2.0, 4.0], [1.0, 0.0]]))
    with pytest.raises(ValueError, match="NaN"):
        env.step(torch.tensor([[float("nan"), 0.0], [0.0, 0.0]]))


def test_record_episode_statistics() -> None:
    # lengths (2, 3): world 0 ends at steps 2, 4, 6 with return 1 + 2 = 3;
    # world 1 at steps 3, 6 with return 11 + 12 + 13 = 36 (reward k + 10 i)
    env = RecordEpisodeStatistics(FakeEnv(), window=3)
    env.reset()
    finished: dict[int, tuple[list[float], list[int]]] = {}
    for t in range(1, 7):
        ep = env.step(torch.zeros(2, 2)).info["episode"]
        assert ep["return"].dtype == torch.float32 and ep["length"].dtype == torch.long
        assert ep["return"].shape == ep["length"].shape == ep["done"].shape == (2,)
        finished[t] = finished_episodes([ep])
    assert finished[1] == ([], [])
    assert finished[2] == ([3.0], [2])
    assert finished[3] == ([36.0], [3])
    assert finished[4] == ([3.0], [2])
    assert finished[5] == ([], [])
    assert finished[6] == ([3.0, 36.0], [2, 3])
    assert list(env.recent_returns) == [3.0, 3.0, 36.0]  # window 3 keeps the last three
    assert list(env.recent_lengths) == [2, 2, 3]
    assert env.num_episodes == 5
    assert env.episode_lengths.tolist() == [0, 0]
    env.step(torch.zeros(2, 2))
    assert env.episode_returns.tolist() == [1.0, 11.0]
    env.reset()
    assert env.episode_returns.tolist() == [0.0, 0.0]


def test_record_episode_statistics_across_flushes() -> None:
    # 600 steps pass the wrapper's on-device buffer (flushed every _FLUSH steps) twice; episodes
    # stay in step order, then world order: world 0 ends every 2 steps, world 1 every 3
    env = RecordEpisodeStatistics(FakeEnv(), window=1000)
    env.reset()
    steps = 600
    assert steps > 2 * RecordEpisodeStatistics._FLUSH
    for _ in range(steps):
        env.step(torch.zeros(2, 2))
    expected = [r for t in range(1, steps + 1) for r, k in ((3.0, 2), (36.0, 3)) if t % k == 0]
    assert list(env.recent_returns) == expected
    assert env.num_episodes == steps // 2 + steps // 3


def _stack() -> RecordEpisodeStatistics:
    """Two stateful wrappers with a stateless one between them."""
    return RecordEpisodeStatistics(ClipAction(RecordEpisodeStatistics(FakeEnv(), window=2)))


def test_state_dict_round_trip() -> None:
    env = _stack()
    env.reset(seed=5)
    for _ in range(7):
        env.step(torch.zeros(2, 2))
    state = env.state_dict()
    assert set(state) == {"wrapper", "env"} and set(state["env"]["env"]) == {"wrapper"}
    twin = _stack()
    twin.load_state_dict(state)
    # bring the fake simulators in line too: state_dict holds the wrappers' state only
    twin.set_state(env.get_state())
    twin.unwrapped.gen.set_state(env.unwrapped.gen.get_state())
    for _ in range(5):
        a, b = env.step(torch.zeros(2, 2)), twin.step(torch.zeros(2, 2))
        torch.testing.assert_close(a.obs, b.obs, rtol=0, atol=0)
        torch.testing.assert_close(a.reward, b.reward, rtol=0, atol=0)
        assert finished_episodes([a.info["episode"]]) == finished_episodes([b.info["episode"]])
    assert list(env.recent_returns) == list(twin.recent_returns)
    assert env.num_episodes == twin.num_episodes
    inner = twin.env.env
    assert isinstance(inner, RecordEpisodeStatistics)
    assert list(inner.recent_returns) == list(env.env.env.recent_returns)
    # the saved dict is a snapshot, not a view of the live state
    before = state["env"]["env"]["wrapper"]["episode_returns"].clone()
    env.step(torch.zeros(2, 2))
    assert torch.equal(state["env"]["env"]["wrapper"]["episode_returns"], before)


def test_load_state_dict_mismatch_raises() -> None:
    state = _stack().state_dict()
    with pytest.raises(ValueError, match="same wrapper stack"):
        RecordEpisodeStatistics(FakeEnv()).load_state_dict(state)
    with pytest.raises(ValueError, match="expects the dict state_dict"):
        _stack().load_state_dict({"mean": torch.zeros(3)})
    with pytest.raises(ValueError, match="has no state"):
        Wrapper(FakeEnv()).load_state_dict({"wrapper": {"x": 1}})


def test_stack_over_native_env_checkpoints_the_simulator() -> None:
    def stack() -> RecordEpisodeStatistics:
        return RecordEpisodeStatistics(RescaleAction(make("halfcheetah", 2, seed=0,
                                                          num_threads=1)))

    env = stack()
    env.reset(seed=1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(4):
        env.step(torch.rand(2, 6, generator=gen) * 2 - 1)
    state = env.state_dict()
    assert "integration_state" in state["env"]["env"]  # MujocoEnv's own state_dict, nested
    twin = stack()
    twin.load_state_dict(state)
    for _ in range(3):
        action = torch.rand(2, 6, generator=gen) * 2 - 1
        a, b = env.step(action), twin.step(action)
        torch.testing.assert_close(a.obs, b.obs, rtol=0, atol=0)
        torch.testing.assert_close(a.reward, b.reward, rtol=0, atol=0)


def test_stack_over_gymnasium_env_saves_wrapper_state_only() -> None:
    env = RecordEpisodeStatistics(GymnasiumEnv("Pendulum-v1", 2))
    env.step(torch.zeros(2, 1))
    state = env.state_dict()
    assert set(state) == {"wrapper"}
    assert state["wrapper"]["episode_lengths"].tolist() == [1, 1]
    env.close()
