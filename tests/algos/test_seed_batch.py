"""Seed-batched offline learners (issue 46): every seed of a batch is the run of that seed alone,
and a diverging seed is stopped without stopping the others."""

from __future__ import annotations

import pytest
import torch

from robotrl.algos.offline.awac import AWAC, AWACConfig
from robotrl.algos.offline.bc import BC, BCConfig
from robotrl.algos.offline.cql import CQL, CQLConfig
from robotrl.algos.offline.iql import IQL, IQLConfig
from robotrl.algos.offline.mcep import AWACMCEP, TD3BCMCEP, AWACMCEPConfig, TD3BCMCEPConfig
from robotrl.algos.offline.rebrac import ReBRAC, ReBRACConfig
from robotrl.algos.offline.seed_batch import (
    SeedBatch,
    SeedBatchAWAC,
    SeedBatchAWACMCEP,
    SeedBatchBC,
    SeedBatchCQL,
    SeedBatchIQL,
    SeedBatchReBRAC,
    SeedBatchTD3BC,
    SeedBatchTD3BCMCEP,
)
from robotrl.algos.offline.td3bc import TD3BC, TD3BCConfig
from robotrl.data import Dataset, DatasetCard
from robotrl.seeding import seed_everything

SEEDS = (3, 7, 11)
TOL = 1e-10


pytestmark = pytest.mark.usefixtures("float64_one_thread")


def dataset(n: int = 400) -> Dataset:
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(n, 5, generator=g) * 3 + 1
    action = torch.rand(n, 2, generator=g) * 4 - 2  # bounds [-2, 2]
    ends = torch.arange(n) % 20 == 19
    terminated = torch.arange(n) % 40 == 39
    return Dataset(obs, action, torch.randn(n, generator=g), torch.randn(n, 5, generator=g),
                   terminated, ends & ~terminated, torch.arange(0, n, 20),
                   DatasetCard(task="", kind="medium"))


def config(**over: object) -> TD3BCConfig:
    return TD3BCConfig(**{"updates_per_iteration": 4, "batch_size": 32, "hidden": (16, 16),
                          **over})


KINDS: dict[type, tuple[type, type[SeedBatch]]] = {
    TD3BCConfig: (TD3BC, SeedBatchTD3BC), IQLConfig: (IQL, SeedBatchIQL),
    BCConfig: (BC, SeedBatchBC), CQLConfig: (CQL, SeedBatchCQL),
    ReBRACConfig: (ReBRAC, SeedBatchReBRAC), AWACConfig: (AWAC, SeedBatchAWAC),
    TD3BCMCEPConfig: (TD3BCMCEP, SeedBatchTD3BCMCEP), AWACMCEPConfig: (AWACMCEP, SeedBatchAWACMCEP)}
"""config class -> (learner, its seed batch)."""


def solo(seed: int, cfg: TD3BCConfig | IQLConfig, data: Dataset,
         device: str = "cpu") -> TD3BC | IQL:
    seed_everything(seed)
    learner = KINDS[type(cfg)][0](5, -2 * torch.ones(2), 2 * torch.ones(2), cfg, device, seed=seed)
    learner.attach(data)
    return learner


def state(learner: TD3BC | IQL) -> dict[str, torch.Tensor]:
    """Every network parameter, Adam moment, step count and learning rate, and the generator
    state."""
    batch = KINDS[type(learner.cfg)][1]
    out: dict[str, torch.Tensor] = {}
    for net in batch.NETS:
        for name, p in getattr(learner, net).named_parameters():
            out[f"{net}.{name}"] = p.detach().clone()
    for net, opt in learner.optimizers.items():  # every optimizer the learner checkpoints
        module = learner.modules[{"alpha": "temperature", "weight": "cql_weight"}.get(net, net)]
        out[f"{net}_opt.lr"] = torch.tensor(float(opt.param_groups[0]["lr"]))
        for name, p in module.named_parameters():
            for key, value in opt.state[p].items():
                out[f"{net}_opt.{name}.{key}"] = value.detach().clone().double()
    out["generator"] = learner.generator.get_state().double()
    out["num_updates"] = torch.tensor(float(learner.num_updates))
    return out


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    worst = 0.0
    for key in a:
        assert a[key].shape == b[key].shape, key
        assert torch.isfinite(a[key]).all() and torch.isfinite(b[key]).all(), key
        # relative above 1: AWAC's batch-sum loss (d3rlpy's) gives Adam second moments ~3e4
        scale = b[key].abs().clamp_min(1.0)
        worst = max(worst, ((a[key] - b[key]).abs() / scale).max().item())
    return worst


def batch_and_alone(cfg: TD3BCConfig | IQLConfig, device: str = "cpu",
                    cuda_graphs: bool | None = None) -> tuple[SeedBatch, list[TD3BC | IQL]]:
    """The batch of SEEDS and, beside it, each seed's learner alone, on the same data."""
    data = dataset()
    cls = KINDS[type(cfg)][1]
    return (cls([solo(s, cfg, data, device) for s in SEEDS], cuda_graphs),
            [solo(s, cfg, data, device) for s in SEEDS])


def worst_difference(batch: SeedBatch, alone: list[TD3BC | IQL],
                     metrics: dict[int, dict[str, float]],
                     solo_metrics: list[dict[str, float]]) -> float:
    """Every seed's metrics equal its solo learner's (the solo learner averages them in
    float32); the largest state difference between a seed and its solo learner."""
    worst = 0.0
    for i in range(len(SEEDS)):
        worst = max(worst, max_diff(state(batch.learners[i]), state(alone[i])))
        assert metrics[i].keys() == solo_metrics[i].keys()
        for key, value in metrics[i].items():
            assert value == pytest.approx(solo_metrics[i][key], rel=1e-6, abs=1e-9), key
    return worst


def two_calls(batch: SeedBatch, alone: list[TD3BC | IQL]) -> float:
    """Two update calls of the batch and of each seed alone, at progress 0 and 0.4 (IQL's
    cosine actor rate moves between them); ``worst_difference`` after them."""
    for progress in (0.0, 0.4):
        metrics = batch.update(progress)
        solo_metrics = [learner.update(progress) for learner in alone]
    return worst_difference(batch, alone, metrics, solo_metrics)


@pytest.mark.parametrize("over", [{}, {"actor_on_first_update": True,
                                       "lagged_actor_target": True, "policy_freq": 3}])
def test_every_seed_is_its_solo_run(over: dict[str, object]) -> None:
    """Two calls of 4 updates (the delayed actor and target updates run, and the second call
    continues from the Adam state written back after the first): every parameter, target,
    Adam moment, step count and generator state of every seed equals that seed trained alone,
    and so do the metrics."""
    batch, alone = batch_and_alone(config(**over))
    for _ in range(2):
        metrics = batch.update()
        solo_metrics = [learner.update() for learner in alone]
    worst = worst_difference(batch, alone, metrics, solo_metrics)
    assert worst < TOL, worst
    assert not batch.stopped
    print(f"max |batched - solo| = {worst:.3e}")


@pytest.mark.parametrize(("net", "update", "metric"), [("critic", 5, "loss/critic"),
                                                        ("actor", 6, "loss/actor")])
def test_a_diverging_seed_is_stopped_alone(net: str, update: int, metric: str) -> None:
    """Seed 1 poisoned (a NaN weight) after 4 updates: its critic loss is NaN at update 5, or,
    poisoning its actor, its actor loss at update 6 (the first actor update of the call)."""
    batch, alone = batch_and_alone(config())
    batch.update()
    for learner in alone:
        learner.update()
    kept = state(batch.learners[1])
    with torch.no_grad():  # poison seed 1
        next(getattr(batch.learners[1], net).parameters()).view(-1)[0] = float("nan")
    metrics = batch.update()
    assert sorted(metrics) == [0, 2]
    stop = batch.stopped[1]
    assert (stop.seed, stop.update, stop.metric, stop.last_good) == (1, update, metric, 4)
    assert "seed 1" in stop.message() and metric in stop.message()
    # the stopped seed keeps its last good state (the poisoned weight aside)
    poisoned = state(batch.learners[1])
    key = f"{net}.net.0.weight"
    assert torch.isnan(poisoned[key].view(-1)[0])
    poisoned[key].view(-1)[0] = kept[key].view(-1)[0]
    assert max_diff(poisoned, kept) == 0.0
    # the others go on as alone, now as a batch of two
    batch.update()
    for learner in (alone[0], alone[2]):
        learner.update()
        learner.update()
    for i in (0, 2):
        assert max_diff(state(batch.learners[i]), state(alone[i])) < TOL
    assert batch.active == [0, 2] and batch.learners[1].num_updates == 4


def iql_config(**over: object) -> IQLConfig:
    return IQLConfig(**{"updates_per_iteration": 4, "batch_size": 32, "hidden": (16, 16),
                        **over})


@pytest.mark.parametrize("over", [{}, {"q_on_updated_value": False,
                                       "actor_on_updated_value": False,
                                       "sigmoid_log_std": True, "actor_cosine": False}])
def test_every_iql_seed_is_its_solo_run(over: dict[str, object]) -> None:
    """IQL, two calls of 4 updates at different progress (the cosine actor rate moves): every
    parameter, Adam moment, learning rate and generator state of every seed equals that seed
    alone, and so do the metrics, in both update orders."""
    batch, alone = batch_and_alone(iql_config(**over))
    worst = two_calls(batch, alone)
    assert worst < TOL, worst
    print(f"IQL: max |batched - solo| = {worst:.3e}")


def test_a_diverging_iql_seed_is_stopped_alone() -> None:
    batch, alone = batch_and_alone(iql_config())
    batch.update()
    for learner in alone:
        learner.update()
    with torch.no_grad():  # poison seed 2's value network
        next(batch.learners[2].value.parameters()).view(-1)[0] = float("nan")
    metrics = batch.update()
    assert sorted(metrics) == [0, 1]
    stop = batch.stopped[2]
    assert (stop.update, stop.metric, stop.last_good) == (5, "loss/value", 4)
    for i in (0, 1):
        alone[i].update()
        assert max_diff(state(batch.learners[i]), state(alone[i])) < TOL


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cfg", [config(updates_per_iteration=12),
                                 config(updates_per_iteration=12, policy_freq=3,
                                        actor_on_first_update=True),
                                 iql_config(updates_per_iteration=12),
                                 BCConfig(updates_per_iteration=12, batch_size=32,
                                          hidden=(16, 16)),
                                 CQLConfig(updates_per_iteration=12, batch_size=32,
                                           hidden=(16, 16), num_actions=3, lagrange=True),
                                 ReBRACConfig(updates_per_iteration=12, batch_size=32,
                                              hidden=(16, 16)),
                                 AWACConfig(updates_per_iteration=12, batch_size=32,
                                            hidden=(16, 16)),
                                 TD3BCMCEPConfig(updates_per_iteration=12, batch_size=32,
                                                 hidden=(16, 16)),
                                 AWACMCEPConfig(updates_per_iteration=12, batch_size=32,
                                                hidden=(16, 16))],
                         ids=["td3bc", "td3bc-freq3", "iql", "bc", "cql", "rebrac", "awac",
                              "td3bc-mcep", "awac-mcep"])
def test_cuda_graphs_replay_each_seed_alone(cfg: TD3BCConfig | IQLConfig) -> None:
    """On a GPU the batch replays CUDA graphs (12 updates a call: each kind of update twice
    eagerly, then recorded and replayed) and is still every seed's run alone, in float64 over
    two calls (the second records its graphs anew over the Adam state written back). Passed for
    every offline batch on an H100, 2026-11-26 (TD3+BC and IQL first on an H200)."""
    batch, alone = batch_and_alone(cfg, "cuda", cuda_graphs=True)
    assert batch.cuda_graphs
    worst = two_calls(batch, alone)
    assert worst < TOL, worst
    print(f"{type(batch).__name__} with CUDA graphs: max |batched - solo| = {worst:.3e}")


def test_cuda_graphs_need_a_cuda_device() -> None:
    with pytest.raises(ValueError, match="cuda_graphs=True needs learners on a CUDA device"):
        SeedBatchTD3BC([solo(0, config(), dataset())], cuda_graphs=True)


def test_a_batch_holds_one_learner_class() -> None:
    data = dataset()
    with pytest.raises(TypeError, match="SeedBatchIQL batches IQL only, got TD3BC"):
        SeedBatchIQL([solo(0, config(), data)])


def test_checkpoints_are_ordinary_td3bc_checkpoints() -> None:
    cfg, data = config(), dataset()
    batch = SeedBatchTD3BC([solo(s, cfg, data) for s in SEEDS[:2]])
    batch.update()
    resumed = solo(SEEDS[1], cfg, data)
    resumed.load_state_dict(batch.learners[1].state_dict())
    batch.update()
    resumed.update()
    assert max_diff(state(batch.learners[1]), state(resumed)) < TOL


@pytest.mark.parametrize("cfg", [
    BCConfig(updates_per_iteration=4, batch_size=32, hidden=(16, 16)),
    CQLConfig(updates_per_iteration=4, batch_size=32, hidden=(16, 16), num_actions=3),
    CQLConfig(updates_per_iteration=4, batch_size=32, hidden=(16, 16), num_actions=3,
              lagrange=True, backup_entropy=True, temperature_loss="alpha",
              update_order="critic_first"),
    ReBRACConfig(updates_per_iteration=4, batch_size=32, hidden=(16, 16)),
    ReBRACConfig(updates_per_iteration=4, batch_size=32, hidden=(16, 16), actor_bc_coef=0.3,
                 critic_bc_coef=0.2, normalize_q=False, lagged_actor_target=True,
                 actor_on_first_update=True, drop_truncated=True, edac_init=True),
    AWACConfig(updates_per_iteration=4, batch_size=32, hidden=(16, 16), temperature=0.05,
               max_weight=2.0),  # some weights clipped
    AWACConfig(updates_per_iteration=4, batch_size=32, hidden=(16, 16),
               advantage_weights="batch_softmax", backup="squashed_entropy",
               sigmoid_log_std=True, log_std_range=(-6.0, 0.0)),
    TD3BCMCEPConfig(updates_per_iteration=4, batch_size=32, hidden=(16, 16)),
    AWACMCEPConfig(updates_per_iteration=4, batch_size=32, hidden=(16, 16))],
    ids=["bc", "cql", "cql-lagrange-critic-first", "rebrac", "rebrac-authors", "awac",
         "awac-d3rlpy", "td3bc-mcep", "awac-mcep"])
def test_every_other_offline_seed_is_its_solo_run(cfg: BCConfig | CQLConfig) -> None:
    """BC; CQL in both update orders, fixed and Lagrange weight; ReBRAC (its LayerNorm
    critics, penalized bootstrap and actor objective, with the authors' switches); AWAC (CORL's
    and d3rlpy's weights and backups); both MCEP variants (their evaluation policies): two
    calls of
    4 updates, every parameter, Adam state (temperature and Lagrange weight too) and generator
    state of every seed equals that seed alone, and so do the metrics."""
    batch, alone = batch_and_alone(cfg)
    worst = two_calls(batch, alone)
    assert worst < TOL, worst
    print(f"{type(batch).__name__}: max |batched - solo| = {worst:.3e}")
