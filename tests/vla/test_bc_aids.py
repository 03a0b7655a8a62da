"""Token BC's training-time aids (issue 47): the privileged ``target`` group of tabletop, the
auxiliary head regressing it, random-shift image augmentation; and that with both off BC is
what it was."""

from __future__ import annotations

import pytest
import torch

from robotrl.algos.offline.bc import BCConfig, TokenBC
from robotrl.algos.offline.losses import auxiliary_mse
from robotrl.data.dataset import Dataset, DatasetCard, DatasetError
from robotrl.envs import make
from robotrl.envs.wrappers import ActionChunks
from robotrl.registry import build_policy
from robotrl.runners.collect import collect
from robotrl.vla.policy import token_cross_entropy
from robotrl.vla.transformer import VLAConfig

GROUPS = ("policy", "tokens", "image")
ALL = (*GROUPS, "target")


def _env(groups: tuple[str, ...], n: int = 16) -> ActionChunks:
    return ActionChunks(make("tabletop", n, num_threads=1, observations=groups, image_size=16,
                             templates=["reach"]), 2)


@pytest.fixture(scope="module")
def data() -> Dataset:
    """Scripted reach demonstrations recording every group, ``target`` last."""
    base = _env(ALL).env
    gen = torch.Generator().manual_seed(0)
    return collect(base, lambda obs: base.task.expert(base.sim, gen, 0.1), 640,
                   DatasetCard(task="robotrl/Tabletop"), 0, 0.0, False, ALL)


def _without_target(data: Dataset) -> Dataset:
    """The same rows recording only the policy's groups (a dataset collected before
    ``target`` existed)."""
    return Dataset(data.observations[:, :-2].clone(), data.actions, data.rewards,
                   data.next_observations[:, :-2].clone(), data.terminations, data.truncations,
                   data.episode_starts, DatasetCard(task="robotrl/Tabletop", observations=list(GROUPS)))


def _bc(env: ActionChunks, **cfg: object) -> TokenBC:
    torch.manual_seed(0)
    policy = build_policy(VLAConfig(dim=32, layers=1, heads=2, bins=32, chunk=2), env.spec)
    return TokenBC(policy, env.spec, BCConfig(updates_per_iteration=5, batch_size=32,
                                              actor_lr=3e-3, **cfg), seed=0)


def test_target_group_is_the_instructed_objects_position(data: Dataset) -> None:
    env = _env(ALL).env
    obs = env.reset(seed=3)
    assert torch.equal(obs["target"], env.task.target_xy(env.sim).float())
    _, target, _ = env.task.episode(env.sim)
    assert torch.equal(obs["target"].double(),
                       env.task.object_xy(env.sim)[torch.arange(16), target].float().double())
    # and the dataset's last two columns are it, row by row
    spec = env.spec
    rows = spec.unflatten(data.observations, ALL)
    assert torch.allclose(rows["target"], data.observations[:, -2:])
    assert rows["target"].abs().max() < 0.3


def test_aux_loss_is_cross_entropy_plus_weighted_head_error(data: Dataset) -> None:
    env = _env(ALL)
    bc = _bc(env, aux_weight=0.5)
    bc.attach(data)
    assert bc.aux_head is not None and bc.aux_target is not None
    # standardized by the dataset's statistics
    assert torch.allclose(bc.aux_stats[0], data.observations[:, -2:].mean(0))
    assert torch.allclose(bc.aux_stats[1], data.observations[:, -2:].std(0))
    idx = torch.arange(32)
    obs = env.spec.unflatten(bc.obs[idx], GROUPS)
    loss, metrics = bc._aux_loss(obs, idx)
    tokens = bc.policy.tokenizer.encode(bc.labels[idx])
    ce, _ = token_cross_entropy(bc.policy.forced(obs, tokens), tokens)
    # an independent re-derivation of the head's input: the last prefix position's features
    # and the keypoints' expected image positions under their heat maps
    policy = bc.policy
    x = torch.cat([policy._prefix(obs), policy.actions(tokens[:, :-1])], 1)
    hidden, _ = policy._trunk(x + policy.pos[: x.shape[1]], None)
    image = torch.cat([obs["image"].float() / 255 - 0.5,
                       policy.coords.expand(len(idx), -1, -1, -1)], 1).permute(0, 2, 3, 1)
    heat = (10 * policy.heat(image)).flatten(1, 2).softmax(1)  # [N, HW, K]
    where = torch.einsum("npk,cp->nkc", heat, policy.coords.flatten(2)[0])
    assert where.shape == (32, policy.cfg.keypoints, 2)
    pred = bc.aux_head(torch.cat([hidden[:, policy.prefix_len - 1], where.flatten(1)], 1))
    target = (data.observations[:32, -2:] - bc.aux_stats[0]) / bc.aux_stats[1]
    aux = (pred - target).square().mean()
    assert torch.allclose(metrics["loss/aux"], aux)
    assert torch.allclose(loss, ce + 0.5 * aux)
    assert torch.allclose(auxiliary_mse(pred, target)[0], aux)
    # the head learns: its error falls over a few updates
    first = bc.update()["loss/aux"]
    for _ in range(6):
        last = bc.update()["loss/aux"]
    assert last < first


def test_aux_head_is_not_used_to_act_and_not_part_of_the_policy(data: Dataset) -> None:
    env = _env(ALL)
    bc = _bc(env, aux_weight=1.0)
    bc.attach(data)
    bc.update()
    assert not any(k.startswith("aux") for k in bc.policy.state_dict())
    acting = _env(GROUPS)  # worlds without the privileged group: acting never reads it
    obs = acting.reset(seed=1)
    before = bc.act_deterministic(obs)
    with torch.no_grad():
        assert bc.aux_head is not None
        bc.aux_head.weight.normal_()
        bc.aux_head.bias.normal_()
    assert torch.equal(bc.act_deterministic(obs), before)
    # a checkpoint carries the head; a learner built for worlds without the group loads it
    state = bc.state_dict()
    other = _bc(acting, aux_weight=1.0)
    assert other.aux_head is None
    other.load_state_dict(state)
    assert other.aux_head is not None
    assert torch.equal(other.aux_head.weight, bc.aux_head.weight)
    assert torch.equal(other.act_deterministic(obs), before)
    with pytest.raises(ValueError, match="aux_weight"):
        _bc(acting).load_state_dict(state)


def test_aux_needs_the_group_in_the_dataset(data: Dataset) -> None:
    bc = _bc(_env(ALL), aux_weight=1.0)
    old = _without_target(data)
    with pytest.raises(DatasetError, match="needs 'target'"):
        bc.attach(old)


def _train(bc: TokenBC, data: Dataset) -> list[float]:
    bc.attach(data)
    losses = [bc.update()["loss/bc"] for _ in range(2)]
    return losses + [float(sum(p.detach().double().sum() for p in bc.policy.parameters()))]


def test_aids_off_reproduce_bc_exactly_whatever_the_dataset_records(data: Dataset) -> None:
    """Off, the learner ignores the recorded ``target`` group: the same updates, bit for bit,
    as on the same rows without it; on, the auxiliary loss changes them."""
    old = _without_target(data)
    reference = _train(_bc(_env(GROUPS)), old)
    assert _train(_bc(_env(ALL)), data) == reference
    assert _train(_bc(_env(GROUPS)), data) == reference  # target recorded, worlds lack it
    assert _train(_bc(_env(ALL), aux_weight=1.0), data)[-1] != reference[-1]


def test_bad_options_fail() -> None:
    with pytest.raises(ValueError, match="aux_weight must be >= 0"):
        BCConfig(aux_weight=-1)


def _vla(env: ActionChunks, **cfg: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_policy(VLAConfig(dim=32, layers=1, heads=2, bins=32, chunk=2, **cfg), env.spec)


def test_film_starts_as_the_unconditioned_policy_and_then_reads_the_words() -> None:
    env = _env(GROUPS, 8)
    obs = env.reset(seed=2)
    plain, film = _vla(env), _vla(env, film=True)
    # zero-initialized and built last: the same parameters and outputs at initialization
    shared = {k: v for k, v in film.state_dict().items() if not k.startswith("film.")}
    assert set(shared) == set(plain.state_dict())
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in shared.items())
    assert torch.equal(film._prefix(obs), plain._prefix(obs))  # (the zero head hides logits)
    # the image positions (patches, keypoints) depend on the words with FiLM only
    other = dict(obs, tokens=torch.roll(obs["tokens"], 1, 0))
    side = env.spec.observations["image"].shape[1]
    image = (side // film.cfg.patch) ** 2 + film.cfg.keypoints
    with torch.no_grad():
        film.film.weight.normal_()
    patches = image - film.cfg.keypoints
    assert torch.equal(plain._prefix(obs)[:, :image], plain._prefix(other)[:, :image])
    for part in (slice(0, patches), slice(patches, image)):  # both read the words
        assert not torch.allclose(film._prefix(obs)[:, part], film._prefix(other)[:, part])
    # the words' mean embedding, pads excluded: the pad's embedding changes no image position
    before = film._prefix(obs)[:, :image]
    with torch.no_grad():
        film.words.weight[0].normal_()
    assert torch.equal(film._prefix(obs)[:, :image], before)
    assert film.arch["config"]["film"] is True
    rebuilt = type(film).from_arch(film.arch)
    rebuilt.load_state_dict(film.state_dict())
    assert torch.equal(rebuilt._prefix(obs), film._prefix(obs))
