"""Seed-batched SAC, CrossQ and FastTD3 (issue 46): every seed of a batch is that seed's learner alone,
update for update, in float64; a diverging seed is stopped without stopping the others."""

from __future__ import annotations

import pytest
import torch

from robotrl.algos.crossq import CrossQ, CrossQConfig
from robotrl.algos.fasttd3 import FastTD3, FastTD3Config
from robotrl.algos.sac import SAC, SACConfig
from robotrl.algos.seed_batch import (
    OffPolicySeedBatch,
    SeedBatchCrossQ,
    SeedBatchFastTD3,
    SeedBatchSAC,
)
from robotrl.seeding import seed_everything

SEEDS = (3, 7, 11)
OBS, ACT, WORLDS = 5, 2, 4
TOL = 1e-10


pytestmark = pytest.mark.usefixtures("float64_one_thread")


SMALL = {"batch_size": 16, "learning_starts": 40, "buffer_size": 500, "actor_hidden": (16, 16),
         "critic_hidden": (16, 16)}


def config(**over: object) -> SACConfig:
    return SACConfig(**{**SMALL, **over})


def td3_config(**over: object) -> FastTD3Config:
    return FastTD3Config(**{**SMALL, "utd_ratio": 1.0, "num_atoms": 11, "v_min": -10.0,
                            "v_max": 10.0, **over})


def crossq_config(**over: object) -> CrossQConfig:
    return CrossQConfig(**{**SMALL, "critic_hidden": (24, 24), "renorm_warmup": 20, **over})


KINDS = ((CrossQConfig, CrossQ, SeedBatchCrossQ), (FastTD3Config, FastTD3, SeedBatchFastTD3),
         (SACConfig, SAC, SeedBatchSAC))
"""(config, learner, batch): CrossQ's config is a SAC config, so it comes first."""


def kind(cfg: object) -> tuple[type, type, type]:
    return next(k for k in KINDS if isinstance(cfg, k[0]))


def learner(seed: int, cfg: SACConfig | FastTD3Config, device: str = "cpu") -> SAC | FastTD3:
    """The learner of ``seed`` built as a run builds it, its replay in float64 (the
    comparison's)."""
    seed_everything(seed)
    sac = kind(cfg)[1](OBS, -2 * torch.ones(ACT), 2 * torch.ones(ACT), WORLDS, cfg, device, seed=seed)
    for field in ("obs", "action", "reward", "next_obs"):
        setattr(sac.buffer, field, getattr(sac.buffer, field).double())
    return sac


def collect(learners: list[SAC], steps: int, data: torch.Generator) -> None:
    """``steps`` env steps of WORLDS worlds stored into every learner of one seed alike (each
    seed's own data: ``data`` is that seed's)."""
    for _ in range(steps):
        obs = torch.randn(WORLDS, OBS, generator=data)
        action = torch.rand(WORLDS, ACT, generator=data) * 2 - 1
        reward, nxt = torch.randn(WORLDS, generator=data), torch.randn(WORLDS, OBS, generator=data)
        term, trunc = torch.rand(WORLDS, generator=data) < 0.2, torch.zeros(WORLDS, dtype=torch.bool)
        for sac in learners:
            if getattr(sac, "normalizer", None) is not None:  # FastTD3's, as its act() does
                sac.normalizer.update(obs.to(sac.device))
            sac._pending = (obs.to(sac.device), action.to(sac.device))
            sac.process_env_step(reward, term, trunc, nxt)


def state(sac: SAC) -> dict[str, torch.Tensor]:
    """Every parameter, target, temperature, Adam moment and step, generator and counter."""
    out: dict[str, torch.Tensor] = {}
    if isinstance(sac, FastTD3):
        out["noise_scale"] = sac.noise_scale.clone()
        if sac.normalizer is not None:
            out.update({f"normalizer.{k}": v.clone()
                        for k, v in sac.normalizer.state_dict().items()})
    else:
        out["log_alpha"] = sac.log_alpha.detach().clone()
    for net in ("actor", "critic", "critic_target"):
        module = getattr(sac, net)
        if module is None:  # CrossQ: no target critics
            continue
        for name, p in [*module.named_parameters(), *module.named_buffers()]:
            out[f"{net}.{name}"] = p.detach().clone().double()  # Batch Renorm counts too
    opts = [("actor", sac.actor_opt), ("critic", sac.critic_opt)]
    for name, opt in opts + ([] if isinstance(sac, FastTD3) else [("alpha", sac.alpha_opt)]):
        for k, p in enumerate(opt.param_groups[0]["params"]):
            for key, value in opt.state[p].items():
                out[f"{name}_opt.{k}.{key}"] = value.detach().clone().double()
    out["generator"] = sac.generator.get_state().double()
    out["counters"] = torch.tensor([sac.transitions, sac.num_updates, sac.owed_updates],
                                   dtype=torch.float64)
    return out


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def run(cfg: SACConfig | FastTD3Config, calls: int, poison: tuple[int, int] | None = None,
        device: str = "cpu"
        ) -> tuple[OffPolicySeedBatch, list[SAC], list[dict[int, dict[str, float]]]]:
    """A batch of SEEDS and each seed alone, ``calls`` iterations of 8 steps then an update
    call; ``poison`` = (seed position, call): a NaN critic weight of that seed before that
    call's update (in the batch only)."""
    batch = kind(cfg)[2]([learner(s, cfg, device) for s in SEEDS],
                         cuda_graphs=device == "cuda")
    alone = [learner(s, cfg, device) for s in SEEDS]
    data = [torch.Generator().manual_seed(100 + s) for s in SEEDS]
    history = []
    for call in range(calls):
        for i in batch.active:
            collect([batch.learners[i], alone[i]], 8, data[i])
        if poison is not None and poison[1] == call:
            with torch.no_grad():
                next(batch.learners[poison[0]].critic.parameters()).view(-1)[0] = float("nan")
        metrics = batch.update()
        solo = {i: alone[i].update() for i in metrics}
        for i, m in metrics.items():  # the batch reports what each seed alone reports
            assert m.keys() == solo[i].keys(), (call, i)
            for key, value in m.items():
                assert value == pytest.approx(solo[i][key], rel=1e-6, abs=1e-9), (call, i, key)
        history.append(metrics)
    return batch, alone, history


@pytest.mark.parametrize("cfg", [config(), config(actor_update_interval=2, utd_ratio=0.5),
                                 config(autotune_alpha=False, squash_epsilon=1e-6),
                                 td3_config(), td3_config(normalize_obs=False, utd_ratio=0.5),
                                 crossq_config(),
                                 crossq_config(renorm_variant="sb3_contrib", utd_ratio=0.5,
                                               alpha_adam_beta1=0.9)],
                         ids=["sac", "sac-delayed", "sac-fixed-alpha", "fasttd3",
                              "fasttd3-raw-obs", "crossq", "crossq-sb3-renorm"])
def test_every_seed_is_its_solo_run(cfg: SACConfig | FastTD3Config) -> None:
    """Warm-up (no update until 40 transitions), then three calls of earned updates (28 then 32,
    or half at utd 0.5, with the delayed actor and temperature steps): every parameter, target,
    temperature, normalizer, Adam state, generator state and counter of every seed equals that
    seed's learner trained alone, and so do the metrics."""
    batch, alone, history = run(cfg, calls=4)
    assert history[0] == {0: {}, 1: {}, 2: {}}  # warming up: nothing to update yet
    assert all(m["train/updates"] > 0 for m in history[-1].values())
    worst = max(max_diff(state(b), state(a)) for b, a in zip(batch.learners, alone, strict=True))
    assert worst < TOL, worst
    assert not batch.stopped
    print(f"{type(batch).__name__}: max |batched - solo| = {worst:.3e}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cfg", [config(actor_update_interval=2), crossq_config(),
                                 td3_config()], ids=["sac", "crossq", "fasttd3"])
def test_cuda_graphs_replay_each_online_seed_alone(cfg: SACConfig | FastTD3Config) -> None:
    """On a GPU (CUDA graphs: each kind of update twice eagerly, then recorded and replayed;
    CrossQ's kinds include the renormalization's warm-up): every seed is still its learner
    alone, in float64. Passed on an H100, 2026-11-26 (max difference 4.4e-16)."""
    batch, alone, _ = run(cfg, calls=4, device="cuda")
    worst = max(max_diff(state(b), state(a)) for b, a in zip(batch.learners, alone, strict=True))
    assert worst < TOL, worst
    print(f"{type(batch).__name__} with CUDA graphs: max |batched - solo| = {worst:.3e}")


def test_a_diverging_sac_seed_is_stopped_alone() -> None:
    """Seed position 1 poisoned before the third call: it stops at that call's first update
    (loss/critic NaN) with its parameters of the end of the second call; the others go on as
    alone."""
    batch, alone, history = run(config(), calls=4, poison=(1, 2))
    stop = batch.stopped[1]
    assert (stop.seed, stop.metric, stop.last_good) == (1, "loss/critic", 28)
    assert sorted(history[-1]) == [0, 2]
    assert batch.learners[1].num_updates == 28
    for i in (0, 2):
        assert max_diff(state(batch.learners[i]), state(alone[i])) < TOL
