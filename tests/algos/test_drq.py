"""Pixels: FrameStack's stacks on a scripted image env, FrameReplay rebuilding exactly those
stacks from one frame a slot, the random shift, and DrQ's update, acting and refusals."""

from __future__ import annotations

import math

import pytest
import torch

from robotrl.algos.drq import DrQ, DrQConfig
from robotrl.envs.base import BatchedEnv, EnvSpec, StepOut
from robotrl.envs.wrappers import FrameStack
from robotrl.nn.pixels import PixelEncoder, random_shift
from robotrl.storage.frames import FrameReplay
from robotrl.types import ObsSpec


class ImageEnv(BatchedEnv):
    """World w runs episodes of ``lengths[w]`` steps (terminated if w is even, else truncated);
    every frame it shows, reset frames included, is [1, 2, 2] uint8 filled with its own serial
    number ``(50 w + count) % 256``, so a stack says which frames it holds."""

    def __init__(self, lengths: tuple[int, ...] = (3, 5, 2)) -> None:
        self.num_envs = n = len(lengths)
        self.device = torch.device("cpu")
        self.spec = EnvSpec(obs_dim=1, action_dim=1, action_low=-torch.ones(1),
                            action_high=torch.ones(1), control_dt=0.1,
                            max_episode_steps=max(lengths), task="images",
                            observations={"policy": ObsSpec((1,)),
                                          "image": ObsSpec((1, 2, 2), torch.uint8)})
        self.lengths = torch.tensor(lengths)
        self.count = torch.zeros(n, dtype=torch.long)
        self.steps = torch.zeros(n, dtype=torch.long)

    def _frame(self, shown: torch.Tensor | None = None) -> torch.Tensor:
        """The next frame of every world; only the ``shown`` worlds' counts move on."""
        value = (50 * torch.arange(self.num_envs) + self.count) % 256
        self.count += 1 if shown is None else shown.long()
        return value.to(torch.uint8)[:, None, None, None].expand(-1, 1, 2, 2).clone()

    def _obs(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"policy": image[:, 0, 0, :1].float(), "image": image}

    def reset(self, seed: int | None = None) -> dict[str, torch.Tensor]:
        self.steps.zero_()
        self.current = self._obs(self._frame())
        return self.current

    def observe(self) -> dict[str, torch.Tensor]:
        return self.current

    def step(self, action: torch.Tensor) -> StepOut:
        self.steps += 1
        final = self._obs(self._frame())
        done = self.steps == self.lengths
        first = self._obs(self._frame(done))
        obs = {k: torch.where(done.reshape(-1, *[1] * (v.dim() - 1)), first[k], v)
               for k, v in final.items()}
        self.steps[done] = 0
        self.current = obs
        even = torch.arange(self.num_envs) % 2 == 0
        reward = final["policy"][:, 0]
        return StepOut(obs, reward, done & even, done & ~even,
                       {"final_obs": final, "reward_terms": {}})


def _serials(stack: torch.Tensor) -> list[list[int]]:
    """Each world's stack as the serial numbers of its frames, oldest first."""
    return stack[:, :, 0, 0].tolist()


def test_frame_stack_repeats_a_new_episodes_first_frame_and_keeps_the_ended_one() -> None:
    env = FrameStack(ImageEnv(lengths=(2, 3)), 3)
    assert env.spec.observations["image"].shape == (3, 2, 2)
    obs = env.reset()
    assert _serials(obs["image"]) == [[0, 0, 0], [50, 50, 50]]
    out = env.step(torch.zeros(2, 1))
    assert _serials(out.obs["image"]) == [[0, 0, 1], [50, 50, 51]]
    out = env.step(torch.zeros(2, 1))  # world 0's episode ends: frame 2 ends it, 3 starts one
    assert _serials(out.info["final_obs"]["image"]) == [[0, 1, 2], [50, 51, 52]]
    assert _serials(out.obs["image"]) == [[3, 3, 3], [50, 51, 52]]
    assert bool(out.terminated[0]) and not bool(out.truncated[1])
    out = env.step(torch.zeros(2, 1))  # world 1 truncated
    assert _serials(out.info["final_obs"]["image"]) == [[3, 3, 4], [51, 52, 53]]
    assert _serials(out.obs["image"]) == [[3, 3, 4], [54, 54, 54]]
    assert _serials(env.observe()["image"]) == [[3, 3, 4], [54, 54, 54]]
    with pytest.raises(ValueError, match="needs observation group 'pixels'"):
        FrameStack(ImageEnv(), 3, group="pixels")


@pytest.mark.parametrize("capacity", [300, 21])  # 21: 7 steps of 3 worlds, the ring wraps
def test_frame_replay_rebuilds_the_stacks_the_wrapper_made(capacity: int) -> None:
    """Every stored transition's observation and next observation equal the stacks FrameStack
    gave (the next one before the auto-reset), from one frame a slot; sampling draws only
    slots whose frames are all stored."""
    k = 3
    env = FrameStack(ImageEnv(), k)
    replay = FrameReplay(capacity, 3, (k, 2, 2), k, act_dim=1)
    obs, log = env.reset(), []
    for step in range(20):
        action = torch.full((3, 1), float(step))
        out = env.step(action)
        replay.add(obs["image"], action, out.reward, out.info["final_obs"]["image"],
                   out.terminated, out.truncated)
        log.append((obs["image"], out.info["final_obs"]["image"], out.reward))
        obs = out.obs
    assert len(replay) == 3 * min(20, replay.steps)
    full = replay.steps <= 20
    usable = range(20 - replay.steps + k - 1 if full else 0, 20)
    for step in usable:
        t = torch.full((3,), step % replay.steps)
        got_obs, got_next = replay.stacks(t, torch.arange(3))
        want_obs, want_next, reward = log[step]
        assert _serials(got_obs) == _serials(want_obs), step
        assert _serials(got_next) == _serials(want_next), step
        assert torch.equal(replay.reward[t, torch.arange(3)], reward)
    batch = replay.sample(64, torch.Generator().manual_seed(0))
    steps = set(batch["action"][:, 0].long().tolist())
    assert steps <= set(usable) and len(steps) > 1
    for i in range(64):  # each sampled pair is one of the logged ones
        step = int(batch["action"][i, 0])
        pairs = [(_serials(o), _serials(n)) for o, n, _ in [log[step]]][0]
        assert _serials(batch["obs"][i:i + 1])[0] in pairs[0]
        assert _serials(batch["next_obs"][i:i + 1])[0] in pairs[1]


def test_random_shift_crops_the_border_repeated_image_at_an_offset_per_image() -> None:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (16, 3, 8, 8), generator=g, dtype=torch.uint8)
    torch.testing.assert_close(random_shift(images, 0, g), images.float())
    shifted = random_shift(images, 2, torch.Generator().manual_seed(1))
    assert shifted.shape == (16, 3, 8, 8) and shifted.dtype == torch.float32
    padded = torch.nn.functional.pad(images.float(), (2, 2, 2, 2), mode="replicate")
    offsets = []
    for i in range(16):  # each is the padded image's crop at some offset in [0, 4]^2
        found = [(dy, dx) for dy in range(5) for dx in range(5)
                 if torch.equal(padded[i, :, dy:dy + 8, dx:dx + 8], shifted[i])]
        assert found, i
        offsets.append(found[0])
    assert len(set(offsets)) > 3  # drawn per image
    with pytest.raises(ValueError, match="padding must be >= 0"):
        random_shift(images, -1, g)


def _drq(**over: object) -> DrQ:
    cfg = DrQConfig(**{"batch_size": 8, "learning_starts": 8, "actor_hidden": (16,),
                       "critic_hidden": (16,), "feature_dim": 8, "filters": 4, "image_pad": 1,
                       "buffer_size": 120, "utd_ratio": 0.5, **over})
    torch.manual_seed(0)
    return DrQ(1, -2 * torch.ones(2), 2 * torch.ones(2), 4, cfg, seed=0,
               image_shape=(6, 16, 16))


def _obs(g: torch.Generator) -> dict[str, torch.Tensor]:
    return {"policy": torch.zeros(4, 1),
            "image": torch.randint(0, 256, (4, 6, 16, 16), generator=g, dtype=torch.uint8)}


def test_drq_updates_the_encoder_through_the_critic_only_and_round_trips() -> None:
    """Updates run with finite metrics; the encoder's weights move with the critics' steps and
    the actor's loss leaves them alone; actions lie in the bounds; the state round-trips (the
    replay left out by default) and export is refused naming why."""
    alg, g = _drq(frame_stack=2), torch.Generator().manual_seed(0)
    for _ in range(6):
        action = alg.act(_obs(g))
        assert action.shape == (4, 2) and bool((action.abs() <= 2).all())
        alg.process_env_step(torch.rand(4, generator=g), torch.zeros(4, dtype=torch.bool),
                             torch.zeros(4, dtype=torch.bool), _obs(g))
    before = [p.detach().clone() for p in alg.encoder.parameters()]
    metrics = alg.update()
    assert metrics["train/updates"] == 10 and math.isfinite(metrics["loss/critic"])
    assert math.isfinite(metrics["loss/actor"])
    assert any(not torch.equal(a, b) for a, b in zip(before, alg.encoder.parameters(), strict=True))
    batch = {"obs": alg.encoder(alg.buffer.sample(8, alg.generator)["obs"]).detach()}
    for p in alg.encoder.parameters():
        p.grad = None
    alg._actor_update(batch, alg.log_alpha.detach().exp())
    assert all(p.grad is None or not p.grad.any() for p in alg.encoder.parameters())
    obs = _obs(g)
    again = _drq(frame_stack=2)
    again.load_state_dict(alg.state_dict())
    torch.testing.assert_close(again.act_deterministic(obs), alg.act_deterministic(obs))
    assert "replay" not in alg.state_dict()
    with pytest.raises(ValueError, match="export .* not built for pixel policies"):
        alg.export_actor()


def test_drq_refuses_what_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="critic reads the image's features"):
        DrQConfig(critic_obs=("policy", "privileged"))
    with pytest.raises(ValueError, match="frame_stack must be >= 1"):
        DrQConfig(frame_stack=0)
    alg = _drq()
    assert alg.buffer.nbytes() == 0  # frames are allocated by the first add, not to evaluate
    with pytest.raises(ValueError, match="acts on the 'image' observation group"):
        alg.act({"policy": torch.zeros(4, 1)})
    with pytest.raises(ValueError, match=r"built for 'image' of shape \(6, 16, 16\)"):
        alg.act({"image": torch.zeros(4, 3, 16, 16, dtype=torch.uint8)})
    spec = ImageEnv().spec
    plain = EnvSpec(obs_dim=1, action_dim=1, action_low=-torch.ones(1),
                    action_high=torch.ones(1), control_dt=0.1, max_episode_steps=5, task="flat")
    with pytest.raises(ValueError, match="learns from the 'image' observation group; task "
                                         "'flat' has \\['policy'\\]"):
        DrQ.build(plain, DrQConfig(), None)
    assert PixelEncoder((3, 84, 84))(torch.zeros(2, 3, 84, 84, dtype=torch.uint8)).shape == (2, 50)
    assert spec.observations["image"].dtype == torch.uint8


def test_drq_trains_from_a_dmc_tasks_frame_stacked_images(tmp_path) -> None:  # noqa: ANN001
    """``robotrl train algo=drq env=dmc/...`` end to end at tiny sizes: the build stacks the
    image group for the training and the evaluation worlds, the replay fills, updates run and
    the run writes its result."""
    pytest.importorskip("dm_control")
    import json

    from robotrl.config import TrainConfig, from_dict
    from robotrl.experiment import run_training
    from robotrl.experiment.build import build_env

    cfg = from_dict(TrainConfig, {
        "algo": {"name": "drq", "batch_size": 8, "learning_starts": 16, "filters": 4,
                 "feature_dim": 8, "actor_hidden": [16], "critic_hidden": [16],
                 "buffer_size": 400},
        "env": {"task": "dmc/cartpole-swingup",
                "options": {"image_size": 16, "max_episode_steps": 20}},
        "logger": {"tensorboard": False, "progress": False, "log_interval": 1},
        "num_envs": 2, "total_steps": 64, "eval_episodes": 1, "torch_threads": 1,
        "checkpoint_interval": 1000, "run_dir": str(tmp_path / "run")})
    env = build_env(cfg, 2, seed=0, train=False)
    assert env.spec.observations["image"].shape == (9, 16, 16)
    run_training(cfg)
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["step"] == 64 and math.isfinite(result["final"]["return_mean"])
