"""Offline algorithms: every loss against hand-worked numbers, every learner's update lowers its
loss on a tiny dataset, exports match acting, resume is exact, and TD3+BC learns from an expert
dataset through ``robotrl train``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from robotrl.algos.offline import losses
from robotrl.algos.offline.base import GaussianActor
from robotrl.config import TrainConfig, from_dict
from robotrl.data import Dataset, DatasetCard, save_hdf5
from robotrl.envs import make
from robotrl.experiment import run_training
from robotrl.experiment.build import build_runner
from robotrl.nn.target import td_target
from robotrl.registry import ALGORITHMS, algorithm, learner_class
from robotrl.runners.collect import collect
from robotrl.seeding import seed_everything

OFFLINE = [name for name in ALGORITHMS if algorithm(name).offline]


# ---------------------------------------------------------------------------- losses by hand
def test_td_target_and_ensemble_mse() -> None:
    target = td_target(torch.tensor([1.0, 2.0]), torch.tensor([False, True]),
                              torch.tensor([10.0, 10.0]), 0.5)
    assert target.tolist() == [6.0, 2.0]
    q = torch.tensor([[5.0, 2.0], [6.0, 4.0]])  # errors (-1, 0) and (0, 2)
    loss, metrics = losses.ensemble_mse(q, target)
    assert loss.item() == pytest.approx(0.5 + 2.0) and metrics["train/q"].item() == 4.25


def test_td3bc_actor_loss_by_hand() -> None:
    q = torch.tensor([2.0, -4.0])  # mean|Q| = 3 -> lambda = 2.5 / 3
    action, data = torch.tensor([[0.5], [0.0]]), torch.tensor([[0.0], [1.0]])
    loss, m = losses.td3bc_actor_loss(q, action, data, alpha=2.5)
    bc = (0.25 + 1.0) / 2
    assert loss.item() == pytest.approx(-(2.5 / 3) * (-1.0) + bc)
    assert m["train/bc_mse"].item() == pytest.approx(bc)


def test_rebrac_losses_by_hand() -> None:
    q = torch.tensor([1.0, 3.0])  # lambda = 1 / 2
    action, data = torch.tensor([[1.0, 0.0], [0.0, 0.0]]), torch.tensor([[0.0, 0.0], [0.0, 2.0]])
    loss, _ = losses.rebrac_actor_loss(q, action, data, beta=0.1)
    # bc per row (summed over dims): 1 and 4
    assert loss.item() == pytest.approx(((0.1 * 1 - 0.5) + (0.1 * 4 - 1.5)) / 2)
    loss_raw, _ = losses.rebrac_actor_loss(q, action, data, beta=0.1, normalize_q=False)
    assert loss_raw.item() == pytest.approx(((0.1 - 1) + (0.4 - 3)) / 2)
    next_q = torch.tensor([[5.0, 1.0], [4.0, 2.0]])
    value = losses.rebrac_next_value(next_q, action, data, beta=0.5)
    assert value.tolist() == [4.0 - 0.5, 1.0 - 2.0]


def test_expectile_loss_by_hand() -> None:
    diff = torch.tensor([2.0, -1.0])
    loss, _ = losses.expectile_loss(diff, 0.7)
    assert loss.item() == pytest.approx((0.7 * 4 + 0.3 * 1) / 2)
    assert losses.expectile_loss(diff, 0.5)[0].item() == pytest.approx(0.5 * 5 / 2)


def test_advantage_weighted_loss_by_hand() -> None:
    log_prob = torch.tensor([-1.0, -2.0])
    adv = torch.tensor([0.0, 10.0])
    loss, m = losses.advantage_weighted_loss(log_prob, adv, temperature=1.0, max_weight=100.0)
    assert loss.item() == pytest.approx(-(1.0 * -1.0 + 100.0 * -2.0) / 2)  # exp(10) clipped
    assert m["train/weight"].item() == pytest.approx(50.5)
    loss, _ = losses.advantage_weighted_loss(log_prob, torch.tensor([math.log(2), 0.0]), 0.5)
    assert loss.item() == pytest.approx(-(4.0 * -1.0 + -2.0) / 2)  # exp(log 2 / 0.5) = 4


def test_cql_penalty_by_hand() -> None:
    q_sampled = torch.tensor([[[0.0, math.log(3.0)]]])  # [E=1, B=1, K=2]
    log_density = torch.tensor([[0.0, 0.0]])
    q_data = torch.tensor([[1.0]])
    gap, _ = losses.cql_penalty(q_sampled, log_density, q_data)
    assert gap.item() == pytest.approx(math.log(1 + 3) - 1.0)
    # importance weights: dividing by a density of 2 is subtracting log 2 inside
    gap2, _ = losses.cql_penalty(q_sampled, torch.full((1, 2), math.log(2.0)), q_data, 2.0)
    assert gap2.item() == pytest.approx(2 * math.log((1 + 3 ** 0.5) / 2 ** 0.5) - 1.0)


def test_gaussian_actor_log_prob_matches_torch() -> None:
    actor = GaussianActor(3, 2, (8,))
    with torch.no_grad():
        actor.log_std.copy_(torch.tensor([-0.5, 0.3]))
    obs, action = torch.randn(5, 3), torch.rand(5, 2) * 2 - 1
    expected = torch.distributions.Normal(actor(obs), actor.std()).log_prob(action).sum(-1)
    assert torch.allclose(actor.log_prob(obs, action), expected, atol=1e-6)


# ---------------------------------------------------------------------------- learners
def tiny_dataset(n: int = 512, seed: int = 0) -> Dataset:
    """Bandit-like data: obs [n, 3], the reward peaks at action tanh(obs . w); 16-step episodes."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, 3, generator=g)
    best = torch.tanh(obs @ torch.tensor([[0.8], [-0.5], [0.3]]))
    action = (best + 0.2 * torch.randn(n, 1, generator=g)).clamp(-1, 1)
    reward = 1.0 - (action - best).square().squeeze(1)
    nxt = torch.randn(n, 3, generator=g)
    ends = torch.arange(n) % 16 == 15
    return Dataset(obs, action, reward, nxt, torch.zeros(n, dtype=torch.bool), ends,
                   torch.arange(0, n, 16), DatasetCard(task="", kind="medium"))


def small_learner(name: str, **over: object):  # noqa: ANN201 - any offline learner
    cfg = from_dict(TrainConfig, {"algo": {"name": name, "updates_per_iteration": 50, "batch_size": 64,
                                           "hidden": [32, 32], **over}}).algo
    return learner_class(name)(3, -torch.ones(1), torch.ones(1), cfg, seed=0)


@pytest.mark.parametrize("name", OFFLINE)
def test_update_lowers_the_loss(name: str) -> None:
    """The main loss (the critics', BC's actor loss) falls over 6 x 50 updates; CQL's critic
    loss carries the conservative term, which may rise by design, so its actor loss is
    compared."""
    torch.manual_seed(0)
    alg = small_learner(name)
    alg.attach(tiny_dataset())
    history = [alg.update(i / 6) for i in range(6)]
    key = alg.METRIC_KEYS[0]
    assert all(math.isfinite(m[key]) for m in history)
    if name == "cql":
        key = "loss/actor"
    assert history[-1][key] < history[0][key], [round(m[key], 4) for m in history]


@pytest.mark.parametrize("name", ["td3bc", "iql", "cql"])
@pytest.mark.usefixtures("bf16_cpu")
def test_bf16_updates_learn_and_keep_float32_state(name: str) -> None:
    """``precision=bf16``: the loss still falls, the updates differ from float32's (autocast is
    on), and parameters, gradients and Adam's moments stay float32."""
    histories = {}
    for precision in ("float32", "bf16"):
        torch.manual_seed(0)
        alg = small_learner(name, precision=precision)
        alg.attach(tiny_dataset())
        histories[precision] = [alg.update(i / 6) for i in range(6)]
        params = [p for module in alg.modules.values() for p in module.parameters()]
        assert params and all(p.dtype == torch.float32 for p in params)
        assert all(p.grad is None or p.grad.dtype == torch.float32 for p in params)
        for opt in alg.optimizers.values():
            for state in opt.state.values():
                assert all(v.dtype == torch.float32 for v in state.values() if v.dim())
    key = "loss/actor" if name == "cql" else alg.METRIC_KEYS[0]
    bf16 = histories["bf16"]
    assert bf16[-1][key] < bf16[0][key], [round(m[key], 4) for m in bf16]
    assert bf16[0][key] != histories["float32"][0][key]


@pytest.mark.parametrize("name", ["td3bc", "iql"])
@pytest.mark.usefixtures("bf16_cpu")
def test_bf16_seed_batch_runs_under_autocast_and_keeps_float32_state(name: str) -> None:
    """``num_seeds`` with ``precision=bf16``: the batch's updates differ from float32's, every
    seed's parameters stay float32, and its losses fall as the learner's do."""
    from robotrl.registry import algorithm, resolve

    losses_by = {}
    for precision in ("float32", "bf16"):
        cfg = small_learner(name, precision=precision).cfg
        batch = resolve(algorithm(name).seed_batch).create(3, -torch.ones(1), torch.ones(1), cfg,
                                                          [0, 1])
        batch.attach(tiny_dataset())
        losses_by[precision] = [batch.update(i / 6)[0] for i in range(6)]
        assert all(p.dtype == torch.float32 for lr in batch.learners
                   for module in lr.modules.values() for p in module.parameters())
    key, bf16 = batch.METRIC_KEYS[0], losses_by["bf16"]
    assert all(math.isfinite(m[key]) for m in bf16) and bf16[-1][key] < bf16[0][key]
    assert bf16[0] != losses_by["float32"][0]  # some metric differs


def test_unknown_precision_names_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="precision.*fp16.*float32, bf16"):
        small_learner("td3bc", precision="fp16")


@pytest.mark.parametrize("fields, refused", [
    ({"model name": "AMD EPYC", "flags": "sse avx2 fma"}, True),  # Zen 2: emulated bfloat16
    ({"flags": "avx2 avx512f avx512_bf16"}, False),  # Zen 4, Xeon (Cooper Lake on)
    ({"flags": "avx512f amx_tile amx_bf16"}, False),  # Xeon with AMX
    ({"Features": "fp asimd bf16"}, False),  # aarch64
    ({}, False),  # flags unreadable: let be
])
def test_bf16_is_refused_on_a_cpu_without_bfloat16_products(
        monkeypatch: pytest.MonkeyPatch, fields: dict[str, str], refused: bool) -> None:
    """On a CPU without AVX512-BF16, AMX or aarch64's bf16, ``precision=bf16`` would run about
    10x slower than float32: the learner refuses it, naming the flags and the allowed values;
    float32 is never refused, nor bf16 on a GPU."""
    from robotrl.nn import linear

    monkeypatch.setattr(linear, "cpu_fields", lambda: fields)
    if refused:
        with pytest.raises(ValueError, match=r"avx512_bf16 or amx_bf16.*AMD EPYC.*"
                                             r"allowed: float32, bf16"):
            small_learner("td3bc", precision="bf16")
    else:
        small_learner("td3bc", precision="bf16")
    small_learner("td3bc", precision="float32")
    linear.check_precision(torch.device("cuda"), "bf16")  # a GPU's bf16 is not the CPU's


def test_train_refuses_bf16_on_such_a_cpu_with_exit_2_before_writing(tmp_path: Path) -> None:
    """``robotrl train ... algo.precision=bf16`` on a CPU without bfloat16 products: exit 2 and
    one line, before the run directory is made."""
    import subprocess
    import sys

    n = 4
    episode = {"observations": torch.randn(n + 1, 4).numpy(), "actions": torch.zeros(n, 1).numpy(),
               "rewards": torch.ones(n).numpy(), "terminations": torch.zeros(n, dtype=torch.bool).numpy(),
               "truncations": (torch.arange(n) == n - 1).numpy()}
    data = Dataset.from_episodes([episode], DatasetCard(task="InvertedPendulum-v5", kind="expert"))
    path = save_hdf5(data, tmp_path / "ip.hdf5")
    run_dir = tmp_path / "run"
    code = ("from robotrl.nn import linear; "
            "linear.cpu_fields = lambda: {'model name': 'AMD EPYC', 'flags': 'avx2 fma'}; "
            "from robotrl.cli.main import main; "
            f"main(['train', 'algo=td3bc', 'dataset={path}', "
            f"'algo.precision=bf16', 'run_dir={run_dir}'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("config error: precision=bf16 needs a CPU with bfloat16")
    assert len(proc.stderr.strip().splitlines()) == 1 and not run_dir.exists()


@pytest.mark.parametrize("name", OFFLINE)
def test_export_matches_acting_and_state_round_trips(name: str) -> None:
    alg = small_learner(name)
    alg.attach(tiny_dataset())
    alg.update(0.0)
    obs = torch.randn(16, 3) * 3
    action = alg.act_deterministic(obs)
    assert action.shape == (16, 1) and bool((action.abs() <= 1).all())
    assert torch.allclose(alg.export_actor()(obs), action, atol=1e-6)
    copy = small_learner(name)  # no dataset attached: eval/export of a checkpoint
    copy.load_state_dict(alg.state_dict())
    assert torch.equal(copy.act_deterministic(obs), action)


def test_rebrac_takes_the_paper_coefficients_from_the_card() -> None:
    alg = small_learner("rebrac")
    data = tiny_dataset()
    data.card.task, data.card.kind = "Hopper-v5", "medium-replay"
    alg.attach(data)
    assert (alg.actor_bc, alg.critic_bc) == (0.05, 0.5)
    alg = small_learner("rebrac", actor_bc_coef=0.2)
    alg.attach(data)
    assert (alg.actor_bc, alg.critic_bc) == (0.2, 0.5)


def test_mcep_acts_with_its_evaluation_policy_only() -> None:
    alg = small_learner("td3bc_mcep")
    alg.attach(tiny_dataset())
    target_before = [p.clone() for p in alg.critic_target.parameters()]
    alg.update(0.0)
    assert alg.eval_actor() is alg.eval_policy and alg.eval_policy is not alg.actor
    obs = torch.randn(4, 3)
    assert not torch.equal(alg.eval_policy(obs), alg.actor(obs))
    after = list(alg.critic_target.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(target_before, after, strict=True))


# ---------------------------------------------------------------------------- the runner
def pd_expert_dataset(path: Path, steps: int = 20_000) -> tuple[Path, float]:
    """InvertedPendulum data from a PD controller (return 1000) with action noise 0.3."""
    env = make("inverted_pendulum", 16, seed=0)
    gains = torch.tensor([0.5, 5.0, 0.5, 0.5])

    def expert(obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return (obs["policy"] * gains).sum(-1, keepdim=True).clamp(-3, 3)

    card = DatasetCard(task="InvertedPendulum-v5", kind="expert", policy="PD controller",
                       ref_min_score=5.0, ref_max_score=1000.0)
    data = collect(env, expert, steps, card, seed=0, action_noise=0.3, progress=False)
    return save_hdf5(data, path), 1000.0


def offline_config(run_dir: Path, dataset: Path, name: str = "td3bc", **over: object) -> TrainConfig:
    algo = {"name": name, "updates_per_iteration": 100, "hidden": [64, 64], **over.pop("algo", {})}
    return from_dict(TrainConfig, {
        "algo": algo, "env": {"task": "inverted_pendulum", "options": {}},
        "logger": {"tensorboard": False, "progress": False, "log_interval": 1},
        "dataset": str(dataset), "total_steps": 600, "eval_interval": 3, "eval_episodes": 4,
        "checkpoint_interval": 2, "run_dir": str(run_dir), "seed": 0, **over})


@pytest.mark.parametrize("name", ["td3bc", "iql", "cql"])  # delayed actor; cosine lr; temperature
def test_offline_resume_equals_uninterrupted(tmp_path: Path, name: str) -> None:
    data = save_hdf5(tiny_pendulum(), tmp_path / "d.hdf5")

    def runner(cfg: TrainConfig):  # noqa: ANN202
        seed_everything(cfg.seed)
        r = build_runner(cfg)
        r.evaluator = None
        return r

    # 6 iterations of 20 updates (exactness does not need more; 100 each took 20 s for CQL)
    small = {"total_steps": 120, "algo": {"updates_per_iteration": 20}}
    full = runner(offline_config(tmp_path / "full", data, name, **small))
    full.train()
    part = runner(offline_config(tmp_path / "part", data, name, **small))
    iteration = part._iteration
    calls = iter(range(10))

    def interrupted() -> dict[str, float]:  # Ctrl-C before the 4th iteration: the same total
        if next(calls) == 3:                # steps, so schedules (IQL's cosine) are the run's
            raise KeyboardInterrupt
        return iteration()

    part._iteration = interrupted
    with pytest.raises(KeyboardInterrupt):
        part.train()
    resumed = runner(offline_config(tmp_path / "part", data, name, **small))
    resumed.load(tmp_path / "part" / "checkpoints" / "last.pt")
    assert resumed.global_step == 60
    resumed.train()

    def learning(history: list[dict[str, float]]) -> list[dict[str, float]]:
        return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in history]

    assert learning(resumed.history) == learning(list(full.history)[3:])
    for key, value in full.alg.state_dict()["modules"]["actor"].items():
        assert torch.equal(value, resumed.alg.state_dict()["modules"]["actor"][key])


def tiny_pendulum() -> Dataset:
    env = make("inverted_pendulum", 4, seed=0)
    card = DatasetCard(task="InvertedPendulum-v5", kind="random")
    return collect(env, lambda obs: torch.zeros(4, 1), 400, card, seed=0, action_noise=0.5,
                   progress=False)


@pytest.mark.slow  # a learning run (~15 s alone, a minute on a loaded host)
def test_td3bc_recovers_the_expert(tmp_path: Path) -> None:
    """The learning claim: TD3+BC from 20k noisy-expert transitions reaches >= 90% of the
    expert's return (normalized score >= 90) within 3000 updates (~15 s on 2 cores)."""
    path, expert_return = pd_expert_dataset(tmp_path / "expert.hdf5")
    cfg = offline_config(tmp_path / "run", path, total_steps=3000, eval_interval=10,
                         eval_episodes=8, algo={"updates_per_iteration": 300})
    result = run_training(cfg)
    assert result is not None
    assert result["normalized_score"] >= 90, result
    best = tmp_path / "run" / "checkpoints" / "best.pt"
    assert best.exists()
    # eval and export take the offline run as any other
    from robotrl.cli.evaluate import eval_main
    from robotrl.cli.export import export_main

    eval_main([f"checkpoint={best}", "episodes=4", f"out={tmp_path / 'eval.json'}"])
    again = json.loads((tmp_path / "eval.json").read_text())
    assert again["return_mean"] >= 900, again
    export_main([f"checkpoint={best}", "format=onnx", f"out={tmp_path / 'p.onnx'}",
                 "num_obs=500"])  # parity with act_deterministic is checked inside
    assert (tmp_path / "p.onnx").stat().st_size > 0
