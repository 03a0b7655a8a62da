"""Language-policy bridge: tabletop task, ray camera, action tokenizer, token policies, action
chunks, BC and GRPO on token policies."""

from __future__ import annotations

import pytest
import torch

from robotrl.algos.grpo import GRPO, GRPOConfig
from robotrl.envs import make
from robotrl.envs.tasks.tabletop import HELD_OUT, SHAPES, VOCAB
from robotrl.envs.wrappers import ActionChunks
from robotrl.registry import build_policy
from robotrl.vla import ActionTokenizer, policy_from_arch
from robotrl.vla.transformer import VLAConfig, VLATransformer

GROUPS = ("policy", "tokens", "image")


def _env(n: int = 8, **options: object) -> object:
    return make("tabletop", n, num_threads=1, observations=GROUPS, image_size=16, **options)


def _policy(env: object, **cfg: object) -> VLATransformer:
    torch.manual_seed(0)
    return build_policy(VLAConfig(dim=32, layers=1, heads=2, bins=32, **cfg), env.spec)


def test_tokenizer_round_trip_is_within_half_a_bin() -> None:
    tok = ActionTokenizer(torch.tensor([-1.0, -2.0]), torch.tensor([1.0, 0.5]), bins=256)
    action = torch.rand(1000, 6) * 3.2 - 1.6  # a chunk of 3 two-dim actions, some out of range
    low, high = tok.low.repeat(3), tok.high.repeat(3)
    clipped = torch.maximum(torch.minimum(action, high), low)
    tokens = tok.encode(action)
    assert tokens.min() >= 0 and tokens.max() <= 255
    err = (tok.decode(tokens) - clipped).abs()
    assert bool((err <= tok.half_bin().repeat(3) + 1e-6).all())
    assert torch.equal(tok.encode(tok.decode(tokens)), tokens)  # bin centres are fixed points
    with pytest.raises(ValueError, match="multiple of the action size"):
        tok.encode(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="tokens must be in"):
        tok.decode(torch.full((1, 2), 256))


def test_image_shows_each_world_its_own_colours() -> None:
    env = _env(16)
    obs = env.observe()
    image, seg = obs["image"], env._camera.segmentation(env.batch)
    assert image.shape == (16, 3, 16, 16) and image.dtype == torch.uint8
    colours = env.task.geom_colors(env.sim)
    for i in range(16):
        for g in env.task.object_geoms.tolist():
            pix = image[i].permute(1, 2, 0)[seg[i] == g].float()
            if len(pix):  # the object's dominant channel is its colour's
                assert int(pix.mean(0).argmax()) == int(colours[i, g].argmax())


def test_success_predicates_on_hand_placed_states() -> None:
    env = make("tabletop", 3, num_threads=1)
    task, sim = env.task, env.sim
    ud = env.batch.bind("userdata")
    qpos = env.batch.bind("qpos")
    ud[:] = [[0, 1, 0, 1, 2], [1, 0, 0, 1, 2], [2, 2, 0, 1, 2]]  # reach ball, push cube L, cyl R
    qpos[:] = 0.0
    cube, ball, cyl = (task.object_qpos[i].tolist() for i in range(3))
    qpos[0, ball] = [0.1, 0.1]
    qpos[0, :2] = [0.1, 0.15]      # gripper 0.05 from the ball: reached
    qpos[1, cube] = [-0.2, 0.0]    # cube past the left edge
    qpos[2, cyl] = [0.1, 0.0]      # cylinder not yet at the right edge
    assert task.success(sim).tolist() == [True, True, False]
    qpos[0, :2] = [0.1, 0.2]       # 0.1 away
    qpos[2, cyl] = [0.2, 0.0]
    assert task.success(sim).tolist() == [False, True, True]
    assert task.instructions(sim) == ["reach the green ball", "push the red cube to the left edge",
                                      "push the blue cylinder to the right edge"]


def test_splits_hold_out_compositions_and_snapshots_carry_the_instruction() -> None:
    for split, held in (("train", False), ("heldout", True)):
        env = make("tabletop", 64, num_threads=1, split=split)
        words = env.task.tokens(env.sim)
        colour = [VOCAB[w] for w in words.gather(1, (words >= VOCAB.index("red")).long()
                                                 .argmax(1, keepdim=True)).flatten().tolist()]
        target = [SHAPES[t] for t in env.task.episode(env.sim)[1].tolist()]
        assert all(((c, s) in HELD_OUT) == held for c, s in zip(colour, target, strict=True))
    state = env.get_state()
    other = make("tabletop", 64, num_threads=1, seed=5)
    other.set_state(state)
    assert other.task.instructions(other.sim) == env.task.instructions(env.sim)


@pytest.mark.parametrize("keypoints", [4, 0])
def test_token_log_probs_are_the_sampling_distribution(keypoints: int) -> None:
    env = _env(4)
    policy = _policy(env, temperature=1.5, keypoints=keypoints)
    torch.nn.init.normal_(policy.head.weight, 0.0, 0.5)
    obs = env.observe()
    with torch.no_grad():
        action, logp = policy.sample(obs, torch.Generator().manual_seed(0))
        again, _ = policy.evaluate(obs, action)
        assert torch.allclose(logp, again, atol=1e-5)
        # the first token's frequencies over many draws match exp(log-prob)
        one = {k: v[:1].expand(4000, *v.shape[1:]) for k, v in obs.items()}
        draws, lp = policy.sample(one, torch.Generator().manual_seed(1))
        tokens = policy.tokenizer.encode(draws)[:, 0]
        freq = torch.bincount(tokens, minlength=32).float() / 4000
        prob = torch.zeros(32)
        prob[tokens] = lp[:, 0].exp()
        assert (freq - prob).abs().max() < 0.03
        # teacher forcing equals step-by-step decoding with the KV cache
        cache, logits = policy.start(obs)
        forced = policy.forced(obs, policy.tokenizer.encode(action))
        assert torch.allclose(logits, forced[:, 0], atol=1e-5)


def test_action_chunks_sum_rewards_and_keep_episodes_aligned() -> None:
    env = ActionChunks(make("tabletop", 4, num_threads=1), 4)
    assert env.spec.action_dim == 8 and env.spec.max_episode_steps == 10
    env.reset(seed=0)
    ends = [bool(env.step(torch.zeros(4, 8)).truncated.all()) for _ in range(10)]
    assert ends == [False] * 9 + [True]
    with pytest.raises(ValueError, match="divide the episode limit"):
        ActionChunks(make("tabletop", 2, num_threads=1), 3)


def test_grpo_updates_a_token_policy_and_restores_it(grpo_round) -> None:
    env = ActionChunks(_env(8, templates=["reach"]), 2)
    policy = _policy(env, chunk=2)
    cfg = GRPOConfig(group_size=4, outcome="success", num_epochs=1, num_minibatches=1,
                     dynamic_sampling=False)
    alg = GRPO(env.spec.obs_dim, env.spec.action_low, env.spec.action_high, 8,
               env.spec.max_episode_steps, cfg, seed=0, policy=policy,
               obs_specs=env.spec.observations)
    obs = grpo_round(alg, env, env.reset(seed=0), [0, 1, 0, 1, 1, 1, 0, 0.0])
    before = [p.detach().clone() for p in alg.policy.parameters()]
    metrics = alg.update()
    assert metrics["train/groups"] == 2 and abs(metrics["loss/entropy"]) > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, alg.policy.parameters(), strict=True))
    state = alg.state_dict()
    rebuilt = policy_from_arch(state["arch"])
    rebuilt.load_state_dict(state["policy"])
    with torch.no_grad():
        assert torch.equal(rebuilt.deterministic(obs), alg.act_deterministic(obs))


def test_token_bc_learns_demonstrated_chunks() -> None:
    from robotrl.algos.offline.bc import BCConfig, TokenBC
    from robotrl.data.dataset import DatasetCard
    from robotrl.runners.collect import collect

    base = _env(16, templates=["reach"])
    gen = torch.Generator().manual_seed(0)
    data = collect(base, lambda obs: base.task.expert(base.sim, gen, 0.1), 640,
                   DatasetCard(task="robotrl/Tabletop"), 0, 0.0, False, GROUPS)
    env = ActionChunks(base, 2)
    bc = TokenBC(_policy(env, chunk=2), env.spec, BCConfig(updates_per_iteration=40, batch_size=64,
                                                           actor_lr=3e-3), seed=0)
    bc.attach(data)
    # a row's label is its own action then the next one, within the episode
    assert torch.equal(bc.labels[0], data.actions[:2].flatten())
    first = bc.update()["loss/bc"]
    last = bc.update()["loss/bc"]
    assert last < first - 0.2  # nats: the demonstrated tokens became likelier
    assert bc.act_deterministic(env.observe()).shape == (16, 4)
    data.card.observations = ["policy"]
    with pytest.raises(ValueError, match="observation groups"):
        bc.attach(data)
