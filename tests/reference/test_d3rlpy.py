"""Offline learners against d3rlpy 2.8.1, update for update (``pytest -m reference``).

For BC, TD3+BC, IQL, CQL (fixed and Lagrange weight) and AWAC: our learner and d3rlpy's
implementation get the same initial weights, the same K batches and the same noise; after each
update, every loss term, every gradient an optimizer step used, every parameter (target
networks, SAC temperature and CQL's Lagrange weight included) and Adam's moments and step count
must agree within 1e-9 relative, in float64.

d3rlpy lives in its own virtual environment (it pins gymnasium 1.0.0); the test runs
``tests/reference/d3rlpy_peer.py`` with ``$ROBOTRL_D3RLPY_PYTHON`` (default
``/work/venvs/d3rlpy-ref/bin/python``) and exchanges data-only files with it (JSON, .npz).
Ours runs through its real ``update()`` (batches handed to ``sample``); its random draws are
recorded as they happen and injected into d3rlpy's samplers in d3rlpy's order.

Deliberate differences, each set to d3rlpy's choice here:
- TD3+BC: d3rlpy updates the actor on grad_step 0, 2, ... (its first update); ours, like
  Fujimoto's code, on the 2nd, 4th: d3rlpy is handed grad_step = our 1-based update count.
- IQL: ``q_on_updated_value=False`` and ``actor_on_updated_value=True`` (d3rlpy steps Q and V
  together, Q bootstrapping from V before that step, then the actor on the new V; ours by
  default bootstraps from the new V and weighs the actor by the old one),
  ``sigmoid_log_std`` (d3rlpy's log-std map), d3rlpy's ``weight_temp`` = 1 / our
  ``temperature``. The expectile loss and the weight clip agree (max_weight 0.2 so it binds).
- CQL: ``update_order="critic_first"`` (the Lagrange weight and the temperature read after
  their steps), ``temperature_loss="alpha"``, ``backup_entropy`` (d3rlpy's
  ``soft_q_backup``; its default bootstraps from tanh(mean) instead, which ours does not have),
  d3rlpy's ``conservative_weight`` = our ``cql_alpha``. The conservative term agrees
  (3 x 10 sampled actions, importance-weighted log-sum-exp without -log K); d3rlpy's carries
  -alpha' cw threshold per critic, a constant the comparison of loss values adds back.
- AWAC: ``advantage_weights="batch_softmax"`` (d3rlpy's lambda-softmax over the batch times B,
  summed, unclipped), ``backup="squashed_entropy"`` (d3rlpy keeps SAC's soft target with its
  placeholder temperature 1), ``sigmoid_log_std`` with d3rlpy's range (-6, 0); the advantage
  estimate is one policy sample, min over critics, on both sides (d3rlpy's n_action_samples=1).
- Encoders: d3rlpy's VectorEncoder (Linear, ReLU per hidden width) plus its heads is our mlp.
- dtype: d3rlpy's two float32 constants on these paths (the critics' summed-loss accumulator,
  IQL's expectile indicator) are made to follow the data's dtype in the peer; nothing else of
  d3rlpy's is changed besides its random draws.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from robotrl.algos.offline import (
    AWAC,
    BC,
    CQL,
    IQL,
    TD3BC,
    AWACConfig,
    BCConfig,
    CQLConfig,
    IQLConfig,
    TD3BCConfig,
)
from robotrl.algos.offline.base import OfflineLearner
from robotrl.data import Dataset, DatasetCard
from robotrl.nn.ensemble import EnsembleLinear, EnsembleQ

PYTHON = os.environ.get("ROBOTRL_D3RLPY_PYTHON", "/work/venvs/d3rlpy-ref/bin/python")
MAKE_VENV = ("python3.11 -m venv /work/venvs/d3rlpy-ref && "
             "/work/venvs/d3rlpy-ref/bin/pip install torch==2.13.0 && "
             "/work/venvs/d3rlpy-ref/bin/pip install d3rlpy==2.8.1")
PEER = Path(__file__).with_name("d3rlpy_peer.py")
REPLY = "d3rlpy-peer:"
"""Prefix of the peer's answer lines (``d3rlpy_peer.REPLY``)."""

OBS, ACT, BATCH, UPDATES, SAMPLES = 5, 3, 32, 4, 10
HIDDEN = (16, 16)
COMMON = {"hidden": HIDDEN, "batch_size": BATCH, "updates_per_iteration": UPDATES, "normalize_obs": False,
          "gamma": 0.99, "tau": 0.05, "actor_lr": 3e-3, "critic_lr": 3e-3}
D3_COMMON = {"batch_size": BATCH, "gamma": 0.99, "tau": 0.05, "actor_learning_rate": 3e-3,
             "critic_learning_rate": 3e-3}
CQL_WEIGHT, CQL_GAP = 5.0, 10.0

Entry = tuple[str, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]
"""(d3rlpy's parameter name, our parameter, our tensor -> d3rlpy's layout)."""


def same(t: torch.Tensor) -> torch.Tensor:
    return t


def mlp_entries(prefix: str, net: nn.Module,
                heads: tuple[tuple[str, slice], ...] = (("_fc", slice(None)),)) -> list[Entry]:
    """Our ``mlp`` as d3rlpy's VectorEncoder ``<prefix>._encoder._layers.<2i>`` and its output
    layer's rows split over ``heads`` (e.g. ``_mu`` and ``_logstd``)."""
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    out: list[Entry] = []
    for i, lin in enumerate(linears[:-1]):
        where = f"{prefix}._encoder._layers.{2 * i}"
        out += [(f"{where}.weight", lin.weight, same), (f"{where}.bias", lin.bias, same)]
    last = linears[-1]
    for head, rows in heads:
        out += [(f"{prefix}.{head}.weight", last.weight, lambda t, r=rows: t[r]),
                (f"{prefix}.{head}.bias", last.bias, lambda t, r=rows: t[r])]
    return out


def ensemble_entries(prefix: str, q: EnsembleQ) -> list[Entry]:
    """Member e of our ``EnsembleQ`` (weights [E, in, out]) as d3rlpy's ``<prefix>.<e>``."""
    layers = [m for m in q.net if isinstance(m, EnsembleLinear)]
    out: list[Entry] = []
    for e in range(q.num_members):
        for i, lin in enumerate(layers):
            where = (f"{prefix}.{e}._fc" if i == len(layers) - 1
                     else f"{prefix}.{e}._encoder._layers.{2 * i}")
            out += [(f"{where}.weight", lin.weight, lambda t, e=e: t[e].T),
                    (f"{where}.bias", lin.bias, lambda t, e=e: t[e, 0])]
    return out


def gaussian_entries(prefix: str, actor: nn.Module) -> list[Entry]:
    """``GaussianActor``: mean network plus the state-independent log-std parameter [A]."""
    return [*mlp_entries(prefix, actor.net, (("_mu", slice(None)),)),
            (f"{prefix}._logstd", actor.log_std, lambda t: t[None])]


def scalar(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(1, 1)


@dataclasses.dataclass
class Case:
    """One learner and its d3rlpy counterpart."""

    algo: str
    learner: Callable[[], OfflineLearner]
    entries: Callable[[Any], list[Entry]]
    d3rlpy: dict[str, Any]
    noise: Callable[[list[tuple[str, torch.Tensor]]], list[tuple[str, torch.Tensor]]]
    losses: Callable[[dict[str, torch.Tensor], dict[str, np.ndarray], dict[str, np.ndarray]],
                     list[tuple[str, Any, Any]]]
    grad_step: int = 0
    constants: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    """d3rlpy parameters ours has no counterpart of (fed in, never stepped, not compared)."""


def expect(noise: list[tuple[str, torch.Tensor]], shapes: list[tuple[str, tuple[int, ...]]]
           ) -> list[torch.Tensor]:
    seen = [(kind, tuple(t.shape)) for kind, t in noise]
    assert seen == shapes, f"our learner drew {seen}; the test maps {shapes}"
    return [t for _, t in noise]


def no_noise(noise: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    expect(noise, [])
    return []


def td3_noise(noise: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    (smoothing,) = expect(noise, [("randn", (BATCH, ACT))])
    return [("normal", smoothing)]


def awac_noise(noise: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    backup, value = expect(noise, [("randn", (BATCH, ACT))] * 2)
    return [("normal", backup), ("normal", value[None])]  # d3rlpy: sample_n(1), [1, B, A]


def cql_noise(noise: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """Ours (critic first): backup, uniform [B, K, A], pi(s) and pi(s') [B, K, A], actor;
    d3rlpy: backup, rsample((K,)) at s and s' [K, B, A], uniform_ [B K, A], actor."""
    k = SAMPLES
    backup, uniform, at_s, at_next, actor = expect(noise, [
        ("randn", (BATCH, ACT)), ("rand", (BATCH, k, ACT)), ("randn", (BATCH, k, ACT)),
        ("randn", (BATCH, k, ACT)), ("randn", (BATCH, ACT))])
    return [("normal", backup), ("normal", at_s.transpose(0, 1)),
            ("normal", at_next.transpose(0, 1)),
            ("uniform", (uniform * 2 - 1).reshape(BATCH * k, ACT)), ("normal", actor)]


def bc_losses(m: dict, theirs: dict, extra: dict) -> list[tuple[str, Any, Any]]:
    return [("actor loss", m["loss/actor"], theirs["loss"])]


def td3bc_losses(m: dict, theirs: dict, extra: dict) -> list[tuple[str, Any, Any]]:
    assert ("loss/actor" in m) == ("actor_loss" in theirs), "actor updates on different steps"
    out = [("critic loss", m["loss/critic"], theirs["critic_loss"])]
    if "loss/actor" in m:
        out += [("actor loss", m["loss/actor"], theirs["actor_loss"]),
                ("BC term", m["train/bc_mse"], theirs["bc_loss"])]
    return out


def iql_losses(m: dict, theirs: dict, extra: dict) -> list[tuple[str, Any, Any]]:
    return [("Q loss", m["loss/critic"], theirs["q_loss"]),
            ("V loss (expectile)", m["loss/value"], theirs["v_loss"]),
            ("actor loss (AWR)", m["loss/actor"], theirs["actor_loss"])]


def cql_losses(m: dict, theirs: dict, extra: dict) -> list[tuple[str, Any, Any]]:
    conservative = torch.as_tensor(extra["conservative"])  # [E]: cw (gap_e - threshold)
    constant = float(theirs["alpha"]) * conservative.numel() * CQL_WEIGHT * CQL_GAP
    return [("critic loss", m["loss/critic"], theirs["critic_loss"] + constant),
            ("conservative gap", m["train/cql_gap"], (conservative / CQL_WEIGHT + CQL_GAP).mean()),
            ("conservative weight", m["train/cql_weight"], theirs["alpha"] * CQL_WEIGHT),
            ("actor loss", m["loss/actor"], theirs["actor_loss"]),
            ("temperature loss", m["loss/alpha"], theirs["temp_loss"]),
            ("temperature", m["train/alpha"], theirs["temp"])]


def awac_losses(m: dict, theirs: dict, extra: dict) -> list[tuple[str, Any, Any]]:
    return [("critic loss", m["loss/critic"], theirs["critic_loss"]),
            ("actor loss", m["loss/actor"], theirs["actor_loss"])]


def q_entries(learner: Any) -> list[Entry]:
    return [*ensemble_entries("q_funcs", learner.critic),
            *ensemble_entries("targ_q_funcs", learner.critic_target)]


def cql_case(lagrange: bool) -> Case:
    cfg = CQLConfig(**COMMON, cql_alpha=CQL_WEIGHT, num_actions=SAMPLES, lagrange=lagrange,
                    target_action_gap=CQL_GAP, backup_entropy=True, temperature_loss="alpha",
                    update_order="critic_first")
    return Case(
        "cql", lambda: CQL(OBS, -torch.ones(ACT), torch.ones(ACT), cfg, seed=0),
        lambda ln: [*mlp_entries("policy", ln.actor.net, (("_mu", slice(0, ACT)),
                                                          ("_logstd", slice(ACT, 2 * ACT)))),
                    *q_entries(ln), ("log_temp._parameter", ln.temperature.value, scalar),
                    ("log_alpha._parameter", ln.cql_weight.value, scalar)],
        {**D3_COMMON, "temp_learning_rate": cfg.actor_lr,
         "alpha_learning_rate": cfg.critic_lr if lagrange else 0.0, "n_critics": 2,
         "initial_temperature": 1.0, "initial_alpha": 1.0, "alpha_threshold": CQL_GAP,
         "conservative_weight": CQL_WEIGHT, "n_action_samples": SAMPLES,
         "soft_q_backup": True},
        cql_noise, cql_losses)


def cases() -> dict[str, Case]:
    bc = BCConfig(**{**COMMON, "actor_lr": 1e-3})
    td3 = TD3BCConfig(**COMMON, alpha=2.5, policy_noise=0.2, noise_clip=0.5, policy_freq=2)
    # max_weight 0.2: the clip binds for 19% to 78% of the batch over the 4 updates
    iql = IQLConfig(**COMMON, expectile=0.7, temperature=1 / 3, max_weight=0.2,
                    actor_cosine=False, normalize_reward=False, q_on_updated_value=False,
                    actor_on_updated_value=True,
                    sigmoid_log_std=True, log_std_range=(-5.0, 2.0))
    awac = AWACConfig(**COMMON, temperature=1.0, advantage_weights="batch_softmax",
                      backup="squashed_entropy", sigmoid_log_std=True, log_std_range=(-6.0, 0.0))
    low, high = -torch.ones(ACT), torch.ones(ACT)
    return {
        "bc": Case("bc", lambda: BC(OBS, low, high, bc, seed=0),
                   lambda ln: mlp_entries("imitator", ln.actor.net),
                   {"batch_size": BATCH, "learning_rate": 1e-3, "policy_type": "deterministic"},
                   no_noise, bc_losses),
        "td3bc": Case(
            "td3bc", lambda: TD3BC(OBS, low, high, td3, seed=0),
            lambda ln: [*mlp_entries("policy", ln.actor.net),
                        *mlp_entries("targ_policy", ln.actor_target.net), *q_entries(ln)],
            {**D3_COMMON, "n_critics": 2, "target_smoothing_sigma": 0.2,
             "target_smoothing_clip": 0.5, "alpha": 2.5, "update_actor_interval": 2},
            td3_noise, td3bc_losses, grad_step=1),
        "iql": Case(
            "iql", lambda: IQL(OBS, low, high, iql, seed=0),
            lambda ln: [*gaussian_entries("policy", ln.actor), *q_entries(ln),
                        *mlp_entries("value_func", ln.value)],
            {**D3_COMMON, "n_critics": 2, "expectile": 0.7, "weight_temp": 3.0,
             "max_weight": 0.2},
            no_noise, iql_losses),
        "cql": cql_case(lagrange=False),
        "cql_lagrange": cql_case(lagrange=True),
        "awac": Case(
            "awac", lambda: AWAC(OBS, low, high, awac, seed=0),
            lambda ln: [*gaussian_entries("policy", ln.actor), *q_entries(ln)],
            {**D3_COMMON, "lam": 1.0, "n_action_samples": 1, "n_critics": 2},
            awac_noise, awac_losses, constants={"log_temp._parameter": np.zeros((1, 1))}),
    }


def make_batches() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(UPDATES):
        out.append({
            "obs": torch.randn(BATCH, OBS, generator=g),
            "action": torch.rand(BATCH, ACT, generator=g) * 1.9 - 0.95,
            "reward": torch.randn(BATCH, generator=g),
            "next_obs": torch.randn(BATCH, OBS, generator=g),
            "terminated": torch.rand(BATCH, generator=g) < 0.2,
            "truncated": torch.zeros(BATCH, dtype=torch.bool)})
    return out


def run_ours(case: Case, monkeypatch: pytest.MonkeyPatch
             ) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    """Build ours, run UPDATES updates through ``update()``. Returns the initial weights and,
    per update, the metrics, the gradients each optimizer step used, parameters, Adam state and
    the random draws (d3rlpy's names and layouts)."""
    torch.manual_seed(0)
    learner = case.learner()
    entries = case.entries(learner)
    init = {n: fn(p).detach().contiguous().numpy().copy() for n, p, fn in entries}
    by_param: dict[int, list[tuple[str, Callable]]] = {}
    for name, p, fn in entries:
        by_param.setdefault(id(p), []).append((name, fn))
    batches = make_batches()
    first = batches[0]
    learner.attach(Dataset(first["obs"], first["action"], first["reward"], first["next_obs"],
                           first["terminated"], first["truncated"], torch.tensor([0]),
                           DatasetCard(task="")))
    feed: Iterator[dict[str, torch.Tensor]] = iter(batches)
    monkeypatch.setattr(learner, "sample", lambda: next(feed))

    current: dict[str, Any] = {}
    for opt in learner.optimizers.values():
        def step(*args: Any, opt: torch.optim.Optimizer = opt, inner: Any = opt.step,
                 **kwargs: Any) -> Any:
            for group in opt.param_groups:
                for p in group["params"]:
                    for name, fn in by_param[id(p)]:
                        current["grad"][name] = fn(p.grad).detach().clone()
            return inner(*args, **kwargs)
        monkeypatch.setattr(opt, "step", step)

    def spy(real: Callable, kind: str) -> Callable:
        def draw(*args: Any, **kwargs: Any) -> torch.Tensor:
            out = real(*args, **kwargs)
            if kwargs.get("generator") is learner.generator:
                current["noise"].append((kind, out.clone()))
            return out
        return draw
    monkeypatch.setattr(torch, "randn", spy(torch.randn, "randn"))
    monkeypatch.setattr(torch, "rand", spy(torch.rand, "rand"))

    records: list[dict[str, Any]] = []
    inner_update = learner._update_once

    def update_once(batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        current.update(grad={}, noise=[])
        metrics = inner_update(batch)
        moments = {}
        for opt in learner.optimizers.values():
            for group in opt.param_groups:
                for p in group["params"]:
                    for key, value in opt.state.get(p, {}).items():
                        for name, fn in by_param[id(p)]:
                            moments[f"{key}/{name}"] = (value.detach().double().clone()
                                                        if key == "step" else fn(value).clone())
        records.append({"metrics": {k: v.detach().clone() for k, v in metrics.items()},
                        "grad": current["grad"], "noise": current["noise"], "moments": moments,
                        "param": {n: fn(p).detach().clone() for n, p, fn in entries}})
        return metrics
    monkeypatch.setattr(learner, "_update_once", update_once)
    learner.update(0.0)
    monkeypatch.undo()
    assert len(records) == UPDATES
    return init, records


def run_peer(case: Case, init: dict[str, np.ndarray], records: list[dict[str, Any]],
             job_dir: Path, peer: Callable[[Path], None]) -> dict[str, np.ndarray]:
    """Hand d3rlpy our initial weights, the batches and our draws; its per-update record."""
    arrays = {f"init/{n}": v for n, v in {**init, **case.constants}.items()}
    noise_kinds = []
    for k, (batch, record) in enumerate(zip(make_batches(), records, strict=True)):
        for field in ("obs", "action", "reward", "next_obs"):
            arrays[f"batch/{k}/{field}"] = batch[field].numpy()
        arrays[f"batch/{k}/terminated"] = batch["terminated"].double().numpy()
        draws = case.noise(record["noise"])
        noise_kinds.append([kind for kind, _ in draws])
        for i, (_, value) in enumerate(draws):
            arrays[f"noise/{k}/{i}"] = value.contiguous().numpy()
    np.savez(job_dir / "inputs.npz", **arrays)
    (job_dir / "job.json").write_text(json.dumps({
        "algo": case.algo, "obs_dim": OBS, "act_dim": ACT, "hidden": list(HIDDEN),
        "updates": UPDATES, "config": case.d3rlpy, "grad_step": case.grad_step,
        "noise": noise_kinds}))
    peer(job_dir)
    with np.load(job_dir / "outputs.npz", allow_pickle=False) as out:
        return dict(out)


class PeerError(RuntimeError):
    """The d3rlpy peer exited or failed a job; the message holds its traceback."""


@contextlib.contextmanager
def serve(log: Path) -> Iterator[Callable[[Path], None]]:
    """One d3rlpy process (``d3rlpy_peer.py --serve``, its stderr to ``log``) while the context
    lasts; the function it yields runs a job directory and raises ``PeerError`` with the peer's
    traceback if the job fails (``benchmarks/iql_lockstep.py`` drives it too)."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    with log.open("w") as err:
        proc = subprocess.Popen([PYTHON, str(PEER), "--serve"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    assert proc.stdin is not None and proc.stdout is not None

    def run(job_dir: Path) -> None:
        proc.stdin.write(f"{job_dir}\n")
        proc.stdin.flush()
        while not (line := proc.stdout.readline()).startswith(REPLY):
            if not line:
                raise PeerError(f"the d3rlpy peer exited ({proc.wait()}):\n"
                                f"{log.read_text()[-4000:]}")
        if line.split()[-1] != "ok":
            raise PeerError(f"the d3rlpy peer failed:\n{(job_dir / 'error.txt').read_text()}")

    try:
        yield run
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[Path], None]]:
    """One d3rlpy process for the module (``serve``); calling the fixture with a job directory
    runs that job and fails the test with the peer's traceback."""
    if not Path(PYTHON).exists():
        pytest.skip(f"d3rlpy peer python {PYTHON} missing (set ROBOTRL_D3RLPY_PYTHON); make "
                    f"it with: {MAKE_VENV}")
    with serve(tmp_path_factory.mktemp("d3rlpy_peer") / "stderr.txt") as serve_job:
        def run(job_dir: Path) -> None:
            try:
                serve_job(job_dir)
            except PeerError as err:
                pytest.fail(str(err))

        yield run


def theirs_at(out: dict[str, np.ndarray], k: int, kind: str) -> dict[str, np.ndarray]:
    prefix = f"{k}/{kind}/"
    return {key[len(prefix):]: v for key, v in out.items() if key.startswith(prefix)}


@pytest.mark.parametrize("name", ["bc", "td3bc", "iql", "cql", "cql_lagrange", "awac"])
def test_matches_d3rlpy(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                        close: Callable[..., float], peer: Callable[[Path], None]) -> None:
    """Every loss term, gradient, parameter and Adam moment after each of UPDATES updates."""
    case = cases()[name]
    init, records = run_ours(case, monkeypatch)
    out = run_peer(case, init, records, tmp_path, peer)
    constants = set(case.constants)
    worst = 0.0
    for k, record in enumerate(records):
        at = f"{name} update {k + 1}"
        theirs_param = {n: v for n, v in theirs_at(out, k, "param").items() if n not in constants}
        theirs_moments = {f"{kind}/{n}": v for kind in ("exp_avg", "exp_avg_sq", "step")
                          for n, v in theirs_at(out, k, kind).items()}
        for label, ours, theirs in case.losses(record["metrics"], theirs_at(out, k, "loss"),
                                               theirs_at(out, k, "extra")):
            worst = max(worst, close(ours, theirs, f"{at}: {label}"))
        worst = max(worst, close(record["grad"], theirs_at(out, k, "grad"), f"{at}: gradient"))
        worst = max(worst, close(record["param"], theirs_param, f"{at}: parameter"))
        worst = max(worst, close(record["moments"], theirs_moments, f"{at}: Adam"))
    print(f"{name}: largest relative difference {worst:.2e} over {UPDATES} updates")
    assert math.isfinite(worst)
