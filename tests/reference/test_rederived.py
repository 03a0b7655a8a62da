"""Learners with no installable peer, each against an independent float64 re-derivation.

The reference math below is written from the papers' equations, with the authors' published
code read as facts where the paper leaves a choice open, and shares no code with
``robotrl.algos`` (our learners are only the thing under test; their parameters are copied
into plain float64 leaves here, and the reference steps its own Adam, Kingma & Ba 2015,
Algorithm 1):

* ReBRAC (Tarasov et al. 2023) as tinkoff-ai/CORL ``algorithms/offline/rebrac.py``: its
  dataset (``qlearning_dataset``: timeout rows dropped, a'_data = the next row's action), the
  penalized bootstrap, the actor loss, the schedule ``arange(n) % policy_freq == 0``, the
  target actor moved toward the pre-step actor, Flax's LayerNorm epsilon 1e-6.
* MCEP (Xu et al. 2023, arXiv 2306.03680; egg-west/MCEP): TD3+BC's target policy (Fujimoto &
  Gu 2021, eq. 3) with a second, evaluation policy (``td3_bc_ep``: alpha 10), and AWAC's
  (``awac_ep``: advantage-weighted target policy, evaluation policy -Q_mean - lambda log pi).
* CRL (Eysenbach et al. 2022) as JaxGCRL's ``agents/crl`` (Bortkiewicz et al. 2024), with
  the residual networks of Wang et al. 2025: energies, InfoNCE variants, logsumexp penalty,
  the actor and temperature; once with JaxGCRL's choices switched on, once with ours.
* GRPO (Shao et al. 2024, DeepSeekMath, sec. 4.1), DAPO (Yu et al. 2025: clip-higher,
  token-level loss, dynamic sampling), Dr. GRPO (Liu et al. 2025), RLOO (Ahmadian et al.
  2024) and GSPO's sequence ratio (Zheng et al. 2025): the collection of groups, their
  advantages, every minibatch step and the observation normalizer.

Batches and noise are the ones our learner draws: the reference replays the same generator
(same seed, same draws in the same order) or reads the batch our replay returned.

Not reproduced, on purpose (the equations are the papers'; these are the authors' code's):
MCEP's critic loss is a mean over critics and batch (jaxrl), ours and TD3's a sum of per-critic
means (a factor E on the critic gradients); MCEP's AWAC policy is a tanh-squashed Gaussian
with a state-dependent std, ours AWAC's (CORL's) Gaussian with a tanh mean and a free std;
JaxGCRL builds its actor without LayerNorm (the paper's and ours has it) and its ``cosine``
energy divides by the norms of the whole batch; GRPO's group std is the population one (1/G)
as ours, where TRL and verl take torch's unbiased std. Data preprocessing (MCEP's return
scaling and action clipping, CORL's state normalization when enabled) is outside the update.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch

from robotrl.algos import crl as crl_module
from robotrl.algos import grpo as grpo_module
from robotrl.algos.crl import CRL, CRLConfig
from robotrl.algos.grpo import GRPO, GRPOConfig
from robotrl.algos.offline.mcep import AWACMCEP, TD3BCMCEP, AWACMCEPConfig, TD3BCMCEPConfig
from robotrl.algos.offline.rebrac import ReBRAC, ReBRACConfig
from robotrl.data import Dataset, DatasetCard
from robotrl.envs.base import EnvSpec, GoalSpec
from robotrl.nn.ensemble import EnsembleLinear

Close = Callable[..., float]
WORST: dict[str, float] = {}
"""Largest relative difference seen per learner (printed with ``-s``)."""


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Checker:
    """``close`` that remembers the largest relative difference under one name."""

    def __init__(self, close: Close, name: str) -> None:
        self.close, self.name = close, name

    def __call__(self, ours: Any, theirs: Any, what: str) -> None:
        rel = self.close(ours, theirs, f"{self.name}: {what}")
        WORST[self.name] = max(WORST.get(self.name, 0.0), rel)


@pytest.fixture(autouse=True, scope="module")
def report_worst() -> Iterator[None]:
    yield
    for name, rel in WORST.items():
        print(f"\n{name}: largest relative difference {rel:.2e}")


# ---------------------------------------------------------------------------- reference pieces
def leaves(module: torch.nn.Module) -> list[torch.Tensor]:
    """Float64 copies of ``module``'s parameters (registration order) as fresh leaves."""
    return [p.detach().clone().double().requires_grad_(True) for p in module.parameters()]


class Adam:
    """Adam (Kingma & Ba 2015, Algorithm 1; optax.adam / torch.optim.Adam defaults)."""

    def __init__(self, params: list[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.params, self.lr, self.eps = params, lr, eps
        self.b1, self.b2 = betas
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    @torch.no_grad()
    def step(self, grads: Sequence[torch.Tensor]) -> None:
        self.t += 1
        for p, g, m, v in zip(self.params, grads, self.m, self.v, strict=True):
            m.copy_(self.b1 * m + (1 - self.b1) * g)
            v.copy_(self.b2 * v + (1 - self.b2) * g * g)
            m_hat = m / (1 - self.b1 ** self.t)
            v_hat = v / (1 - self.b2 ** self.t)
            p.sub_(self.lr * m_hat / (v_hat.sqrt() + self.eps))


def grad(loss: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, params))


def norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.sqrt(sum((g * g).sum() for g in grads))


@torch.no_grad()
def soft_update(target: list[torch.Tensor], source: list[torch.Tensor], tau: float) -> None:
    for t, s in zip(target, source, strict=True):
        t.copy_((1 - tau) * t + tau * s)


def frozen(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


def layer_norm(x: torch.Tensor, gain: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * gain + bias


def mlp(params: list[torch.Tensor], x: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]
        ) -> torch.Tensor:
    """Dense layers (weight [out, in]) with ``act`` between them."""
    *hidden, w_out, b_out = params
    for w, b in zip(hidden[::2], hidden[1::2], strict=True):
        x = act(x @ w.T + b)
    return x @ w_out.T + b_out


def ensemble_q(params: list[torch.Tensor], obs: torch.Tensor, action: torch.Tensor,
               layer_norm_eps: float | None) -> torch.Tensor:
    """E critics Dense -> ReLU (-> LayerNorm) ... -> Dense on [obs, action]; weights [E, in,
    out], biases [E, 1, out]; [E, B]."""
    h = torch.cat([obs, action], -1)[None]
    it = iter(params)
    per_layer = 2 if layer_norm_eps is None else 4
    for _ in range((len(params) - 2) // per_layer):
        w, b = next(it), next(it)
        h = torch.relu(h @ w + b)
        if layer_norm_eps is not None:
            h = layer_norm(h, next(it), next(it), layer_norm_eps)
    w, b = next(it), next(it)
    return (h @ w + b).squeeze(-1)


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    z = (x - mean) / log_std.exp()
    return (-0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


# ---------------------------------------------------------------------------- our side, recorded
def record(step: Any, log: list[list[torch.Tensor]]) -> None:
    """Append the gradients of every step ``step`` (a ``GradientStep``) applies, as applied
    (after clipping)."""
    apply = step.apply

    def recorded() -> None:
        log.append([p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                    for p in step.params])
        apply()

    step.apply = recorded


def check_adam(check: Checker, optimizer: torch.optim.Optimizer, ref: Adam, what: str) -> None:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for i, p in enumerate(params):
        state = optimizer.state[p]
        if ref.t == 0:
            assert not state, f"{what}: Adam stepped before the reference did"
            continue
        check(state["exp_avg"], ref.m[i], f"{what} Adam exp_avg[{i}]")
        check(state["exp_avg_sq"], ref.v[i], f"{what} Adam exp_avg_sq[{i}]")
        check(state["step"], float(ref.t), f"{what} Adam step[{i}]")


def check_params(check: Checker, module: torch.nn.Module, ref: list[torch.Tensor], what: str
                 ) -> None:
    check(list(module.parameters()), ref, what)


# ---------------------------------------------------------------------------- offline data
OBS, ACT = 5, 2


def episodes_dataset(seed: int = 0) -> tuple[Dataset, dict[str, torch.Tensor]]:
    """Six episodes (ending by termination or truncation, one of length 1) with float32-exact
    values; returns our ``Dataset`` and the raw rows in time order."""
    g = torch.Generator().manual_seed(seed)
    ends = [("trunc", 7), ("term", 5), ("trunc", 1), ("term", 9), ("trunc", 6), ("trunc", 8)]
    rows: dict[str, list[torch.Tensor]] = {k: [] for k in ("obs", "action", "reward", "next_obs",
                                                           "terminal", "timeout")}
    starts = []
    for kind, length in ends:
        starts.append(sum(len(x) for x in rows["reward"]))
        obs = torch.randn(length + 1, OBS, generator=g).float().double()
        rows["obs"].append(obs[:-1])
        rows["next_obs"].append(obs[1:])
        rows["action"].append(torch.rand(length, ACT, generator=g).mul(1.8).sub(0.9).float().double())
        rows["reward"].append(torch.randn(length, generator=g).float().double())
        last = torch.zeros(length, dtype=torch.bool)
        last[-1] = True
        rows["terminal"].append(last if kind == "term" else torch.zeros_like(last))
        rows["timeout"].append(last if kind == "trunc" else torch.zeros_like(last))
    raw = {k: torch.cat(v) for k, v in rows.items()}
    data = Dataset(raw["obs"], raw["action"], raw["reward"], raw["next_obs"], raw["terminal"],
                   raw["timeout"], torch.tensor(starts), DatasetCard(task="Hopper-v5",
                                                                      kind="medium"))
    return data, raw


def qlearning_rows(raw: dict[str, torch.Tensor], drop_timeouts: bool) -> dict[str, torch.Tensor]:
    """The transitions a learner samples from. ``drop_timeouts``: D4RL's / CORL's
    ``qlearning_dataset`` (rows ending by timeout skipped; a'_data = the next row's action);
    else every row, a'_data the next row's action within the episode (the row's own at its
    end)."""
    n = raw["reward"].numel()
    ends = raw["terminal"] | raw["timeout"]
    keep = ~raw["timeout"] if drop_timeouts else torch.ones(n, dtype=torch.bool)
    nxt = torch.arange(n) + 1
    if not drop_timeouts:
        nxt = torch.where(ends, torch.arange(n), nxt)
    # masked rows (terminal) bootstrap nothing: which action stands at s' there is immaterial
    next_action = raw["action"][nxt.clamp(max=n - 1)]
    rows = {k: v[keep] for k, v in raw.items()}
    rows["next_action"] = next_action[keep]
    return rows


def as_float64(learner: Any) -> None:
    """Our attached view is float64 (``OfflineLearner.attach`` follows the default dtype)."""
    assert learner.data.table.dtype == torch.float64
    assert learner.next_actions is None or learner.next_actions.dtype == torch.float64


def capture_updates(learner: Any) -> list[dict[str, torch.Tensor]]:
    """The float64 metrics of every ``_update_once`` ``update()`` runs."""
    log: list[dict[str, torch.Tensor]] = []
    update_once = learner._update_once

    def recorded(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        metrics = update_once(batch)
        log.append(metrics)
        return metrics

    learner._update_once = recorded
    return log


def batch_of(rows: dict[str, torch.Tensor], g: torch.Generator, size: int) -> dict[str, torch.Tensor]:
    idx = torch.randint(rows["reward"].numel(), (size,), generator=g)
    return {k: v[idx] for k, v in rows.items()}


# ---------------------------------------------------------------------------- ReBRAC
CORL_REBRAC = {"edac_init": True, "layer_norm_eps": 1e-6, "actor_on_first_update": True,
               "lagged_actor_target": True, "drop_truncated": True}
"""Our switches at the authors' values (tinkoff-ai/CORL ``algorithms/offline/rebrac.py``)."""


@pytest.mark.parametrize("case", ["corl", "defaults"])
def test_rebrac_matches_corl(case: str, close: Close) -> None:
    """ReBRAC against CORL's math, K = 6 updates (3 actor steps): with the authors' switches
    ("corl"), and with our defaults (TD3's schedule and target, PyTorch's LayerNorm epsilon,
    truncated rows kept) against the same math with those choices."""
    check = Checker(close, "ReBRAC")
    switches = CORL_REBRAC if case == "corl" else {}
    cfg = ReBRACConfig(updates_per_iteration=1, batch_size=24, hidden=(16, 16, 16), actor_bc_coef=0.3,
                       critic_bc_coef=0.2, **switches)  # type: ignore[arg-type]
    ours = ReBRAC(OBS, -torch.ones(ACT), torch.ones(ACT), cfg, seed=3)
    data, raw = episodes_dataset()
    ours.attach(data)
    as_float64(ours)
    rows = qlearning_rows(raw, drop_timeouts=cfg.drop_truncated)
    assert len(ours.data) == rows["reward"].numel()  # type: ignore[arg-type]

    actor, critic = leaves(ours.actor), leaves(ours.critic)
    actor_t, critic_t = frozen(actor), frozen(critic)
    actor_opt, critic_opt = Adam(actor, cfg.actor_lr), Adam(critic, cfg.critic_lr)
    g = torch.Generator().manual_seed(3)
    metrics = capture_updates(ours)
    critic_grads: list[list[torch.Tensor]] = []
    actor_grads: list[list[torch.Tensor]] = []
    record(ours.critic_step, critic_grads)
    record(ours.actor_step, actor_grads)

    def pi(params: list[torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(mlp(params, obs, torch.relu))

    def q(params: list[torch.Tensor], obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return ensemble_q(params, obs, action, cfg.layer_norm_eps)

    for i in range(6):
        ours.update()
        b = batch_of(rows, g, cfg.batch_size)
        noise = torch.randn(cfg.batch_size, ACT, generator=g)
        with torch.no_grad():  # CORL update_critic
            next_a = pi(actor_t, b["next_obs"])
            next_a = (next_a + (noise * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
                      ).clamp(-1, 1)
            penalty = ((next_a - b["next_action"]) ** 2).sum(-1)
            next_q = q(critic_t, b["next_obs"], next_a).min(0).values - 0.2 * penalty
            target = b["reward"] + (1 - b["terminal"].double()) * cfg.gamma * next_q
        q_data = q(critic, b["obs"], b["action"])
        critic_loss = ((q_data - target[None]) ** 2).mean(1).sum(0)
        grads = grad(critic_loss, critic)
        critic_opt.step(grads)
        m = metrics[-1]
        check(m["loss/critic"], critic_loss, f"update {i} critic loss")
        check(m["train/q"], q_data.mean(), f"update {i} mean Q")
        check(m["train/grad_norm/critic"], norm(grads), f"update {i} critic grad norm")
        check(critic_grads[-1], grads, f"update {i} critic gradients")
        phase = 0 if cfg.actor_on_first_update else cfg.policy_freq - 1
        if i % cfg.policy_freq == phase:  # CORL update_actor, with the critic after its step
            action = pi(actor, b["obs"])
            bc = ((action - b["action"]) ** 2).sum(-1)
            q_pi = q(critic, b["obs"], action).min(0).values
            lmbda = 1 / q_pi.abs().mean().detach()
            actor_loss = (0.3 * bc - lmbda * q_pi).mean()
            grads = grad(actor_loss, actor)
            before = frozen(actor)
            actor_opt.step(grads)
            # CORL: incremental_update(actor.params, ...) of the actor before its step
            soft_update(actor_t, before if cfg.lagged_actor_target else actor, cfg.tau)
            soft_update(critic_t, critic, cfg.tau)
            check(m["loss/actor"], actor_loss, f"update {i} actor loss")
            check(m["train/bc_mse"], bc.mean() / action.shape[-1], f"update {i} BC penalty")
            check(m["train/lambda"], lmbda, f"update {i} lambda")
            check(m["train/grad_norm/actor"], norm(grads), f"update {i} actor grad norm")
            check(actor_grads[-1], grads, f"update {i} actor gradients")
        else:
            assert "loss/actor" not in m
        check_params(check, ours.critic, critic, f"update {i} critic")
        check_params(check, ours.actor, actor, f"update {i} actor")
        check_params(check, ours.critic_target, critic_t, f"update {i} critic target")
        check_params(check, ours.actor_target, actor_t, f"update {i} actor target")
        check_adam(check, ours.critic_opt, critic_opt, f"update {i} critic")
        check_adam(check, ours.actor_opt, actor_opt, f"update {i} actor")
    assert len(actor_grads) == 3


def test_rebrac_edac_init_and_defaults() -> None:
    """``edac_init`` gives the authors' initialization (targets equal to the networks); the
    defaults keep PyTorch's, TD3's schedule, the updated actor as the target's source and
    truncated rows."""
    torch.manual_seed(0)
    alg = ReBRAC(OBS, -torch.ones(ACT), torch.ones(ACT),
                 ReBRACConfig(hidden=(32, 32, 32), edac_init=True))
    actor = [m for m in alg.actor.modules() if isinstance(m, torch.nn.Linear)]
    critic = [m for m in alg.critic.modules() if isinstance(m, EnsembleLinear)]
    assert all(bool((m.bias == 0.1).all()) for m in actor[:-1] + critic[:-1])
    assert float(actor[-1].weight.detach().abs().max()) <= 1e-3 and float(actor[-1].bias.detach().abs().max()) <= 1e-3
    out = critic[-1]
    assert float(out.weight.detach().abs().max()) <= 3e-3 and float(out.bias.detach().abs().max()) <= 3e-3
    for a, b in ((alg.actor, alg.actor_target), (alg.critic, alg.critic_target)):
        assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    default = ReBRACConfig()
    assert not (default.edac_init or default.actor_on_first_update or default.lagged_actor_target
                or default.drop_truncated) and default.layer_norm_eps == 1e-5
    alg = ReBRAC(OBS, -torch.ones(ACT), torch.ones(ACT), ReBRACConfig(hidden=(8,), batch_size=4))
    data, _ = episodes_dataset()
    alg.attach(data)
    assert len(alg.data) == len(data)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- MCEP
def test_td3bc_mcep_matches_the_paper(close: Close) -> None:
    """TD3+BC-MCEP: TD3+BC's critic and target policy (alpha 2.5) and the evaluation policy
    (alpha 10, egg-west/MCEP ``td3_bc_ep``), K = 6 updates (3 actor steps)."""
    check = Checker(close, "TD3+BC-MCEP")
    cfg = TD3BCMCEPConfig(updates_per_iteration=1, batch_size=24, hidden=(16, 16), normalize_obs=False)
    ours = TD3BCMCEP(OBS, -torch.ones(ACT), torch.ones(ACT), cfg, seed=5)
    data, raw = episodes_dataset(1)
    ours.attach(data)
    as_float64(ours)
    rows = qlearning_rows(raw, drop_timeouts=False)
    actor, critic, evaluation = leaves(ours.actor), leaves(ours.critic), leaves(ours.eval_policy)
    actor_t, critic_t = frozen(actor), frozen(critic)
    opts = {"actor": Adam(actor, cfg.actor_lr), "critic": Adam(critic, cfg.critic_lr),
            "eval": Adam(evaluation, cfg.actor_lr)}
    g = torch.Generator().manual_seed(5)
    metrics = capture_updates(ours)
    logs: dict[str, list[list[torch.Tensor]]] = {"critic": [], "actor": [], "eval": []}
    record(ours.critic_step, logs["critic"])
    record(ours.actor_step, logs["actor"])
    record(ours.eval_step, logs["eval"])

    def pi(params: list[torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(mlp(params, obs, torch.relu))

    def td3bc_actor_loss(params: list[torch.Tensor], b: dict[str, torch.Tensor], alpha: float
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        action = pi(params, b["obs"])
        q1 = ensemble_q(critic, b["obs"], action, None)[0]
        lmbda = alpha / q1.abs().mean().detach()
        bc = ((action - b["action"]) ** 2).mean()
        return -lmbda * q1.mean() + bc, bc, lmbda

    for i in range(6):
        ours.update()
        b = batch_of(rows, g, cfg.batch_size)
        noise = torch.randn(cfg.batch_size, ACT, generator=g)
        with torch.no_grad():
            next_a = (pi(actor_t, b["next_obs"])
                      + (noise * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)).clamp(-1, 1)
            next_q = ensemble_q(critic_t, b["next_obs"], next_a, None).min(0).values
            target = b["reward"] + cfg.gamma * (1 - b["terminal"].double()) * next_q
        q_data = ensemble_q(critic, b["obs"], b["action"], None)
        # TD3: each critic regresses on the target, L = sum_e E[(Q_e - y)^2]
        critic_loss = ((q_data - target) ** 2).mean(-1).sum()
        grads = grad(critic_loss, critic)
        opts["critic"].step(grads)
        m = metrics[-1]
        check(m["loss/critic"], critic_loss, f"update {i} critic loss")
        check(logs["critic"][-1], grads, f"update {i} critic gradients")
        if (i + 1) % cfg.policy_freq == 0:  # MCEP: update_target_actor = i % policy_delay == 0
            for name, params, alpha in (("actor", actor, cfg.alpha),
                                        ("eval", evaluation, cfg.eval_alpha)):
                loss, bc, lmbda = td3bc_actor_loss(params, b, alpha)
                grads = grad(loss, params)
                opts[name].step(grads)
                check(logs[name][-1], grads, f"update {i} {name} gradients")
                key = "loss/actor" if name == "actor" else "loss/eval_actor"
                check(m[key], loss, f"update {i} {name} loss")
                if name == "actor":
                    check(m["train/bc_mse"], bc, f"update {i} BC term")
                    check(m["train/lambda"], lmbda, f"update {i} lambda")
            soft_update(critic_t, critic, cfg.tau)
            soft_update(actor_t, actor, cfg.tau)
        check_params(check, ours.critic, critic, f"update {i} critic")
        check_params(check, ours.actor, actor, f"update {i} target policy")
        check_params(check, ours.eval_policy, evaluation, f"update {i} evaluation policy")
        check_params(check, ours.critic_target, critic_t, f"update {i} critic target")
        check_params(check, ours.actor_target, actor_t, f"update {i} target policy's target")
        check_adam(check, ours.critic_opt, opts["critic"], f"update {i} critic")
        check_adam(check, ours.actor_opt, opts["actor"], f"update {i} target policy")
        check_adam(check, ours.eval_opt, opts["eval"], f"update {i} evaluation policy")
    assert len(logs["eval"]) == 3


def test_awac_mcep_matches_the_paper(close: Close) -> None:
    """AWAC-MCEP: AWAC's critic and advantage-weighted target policy (lambda 1, weights
    clipped at 1000) and the evaluation policy of MCEP eq. 8 (``awac_ep``: -min(mean_e Q_e,
    1e4) - 0.6 log pi(a_data)), on our AWAC's Gaussian policy, K = 4 updates."""
    check = Checker(close, "AWAC-MCEP")
    cfg = AWACMCEPConfig(updates_per_iteration=1, batch_size=24, hidden=(16, 16), normalize_obs=False)
    ours = AWACMCEP(OBS, -torch.ones(ACT), torch.ones(ACT), cfg, seed=7)
    data, raw = episodes_dataset(2)
    ours.attach(data)
    as_float64(ours)
    rows = qlearning_rows(raw, drop_timeouts=False)
    actor, critic, evaluation = leaves(ours.actor), leaves(ours.critic), leaves(ours.eval_policy)
    critic_t = frozen(critic)
    opts = {"actor": Adam(actor, cfg.actor_lr), "critic": Adam(critic, cfg.critic_lr),
            "eval": Adam(evaluation, cfg.actor_lr)}
    g = torch.Generator().manual_seed(7)
    metrics = capture_updates(ours)
    logs: dict[str, list[list[torch.Tensor]]] = {"critic": [], "actor": [], "eval": []}
    record(ours.critic_step, logs["critic"])
    record(ours.actor_step, logs["actor"])
    record(ours.eval_step, logs["eval"])

    def policy(params: list[torch.Tensor], obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean tanh(net(obs)), log std clamped to [-5, 2]) of CORL's AWAC actor (the log std
        is registered before the network's layers)."""
        log_std, *net = params
        return torch.tanh(mlp(net, obs, torch.relu)), log_std.clamp(-5.0, 2.0)

    def sample(params: list[torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
        mean, log_std = policy(params, obs)
        noise = torch.randn(mean.shape, generator=g)
        return (mean + log_std.exp() * noise).clamp(-1.0, 1.0)

    for i in range(4):
        ours.update()
        b = batch_of(rows, g, cfg.batch_size)
        with torch.no_grad():
            next_a = sample(actor, b["next_obs"])
            next_q = ensemble_q(critic_t, b["next_obs"], next_a, None).min(0).values
            target = b["reward"] + cfg.gamma * (1 - b["terminal"].double()) * next_q
        q_data = ensemble_q(critic, b["obs"], b["action"], None)
        critic_loss = ((q_data - target) ** 2).mean(-1).sum()
        grads = grad(critic_loss, critic)
        opts["critic"].step(grads)
        m = metrics[-1]
        check(m["loss/critic"], critic_loss, f"update {i} critic loss")
        check(logs["critic"][-1], grads, f"update {i} critic gradients")
        with torch.no_grad():  # awac_ep update_actor_tilde: V(s) from one sampled action
            v = ensemble_q(critic, b["obs"], sample(actor, b["obs"]), None).min(0).values
            adv = ensemble_q(critic, b["obs"], b["action"], None).min(0).values - v
            weight = torch.exp(adv / cfg.temperature).clamp(max=cfg.max_weight)
        mean, log_std = policy(actor, b["obs"])
        actor_loss = -(weight * gaussian_log_prob(b["action"], mean, log_std)).mean()
        grads = grad(actor_loss, actor)
        opts["actor"].step(grads)
        check(m["loss/actor"], actor_loss, f"update {i} actor loss")
        check(m["train/weight"], weight.mean(), f"update {i} mean weight")
        check(logs["actor"][-1], grads, f"update {i} actor gradients")
        soft_update(critic_t, critic, cfg.tau)
        # awac_ep update_actor: reparameterized sample, critics averaged and capped at q_max
        a_pi = sample(evaluation, b["obs"])
        q_pi = ensemble_q(frozen(critic), b["obs"], a_pi, None).mean(0).clamp(max=1e4)
        mean, log_std = policy(evaluation, b["obs"])
        eval_loss = (-q_pi - cfg.eval_lambda * gaussian_log_prob(b["action"], mean, log_std)).mean()
        grads = grad(eval_loss, evaluation)
        opts["eval"].step(grads)
        check(m["loss/eval_actor"], eval_loss, f"update {i} evaluation loss")
        check(logs["eval"][-1], grads, f"update {i} evaluation gradients")
        check_params(check, ours.critic, critic, f"update {i} critic")
        check_params(check, ours.actor, actor, f"update {i} target policy")
        check_params(check, ours.eval_policy, evaluation, f"update {i} evaluation policy")
        check_params(check, ours.critic_target, critic_t, f"update {i} critic target")
        check_adam(check, ours.critic_opt, opts["critic"], f"update {i} critic")
        check_adam(check, ours.actor_opt, opts["actor"], f"update {i} target policy")
        check_adam(check, ours.eval_opt, opts["eval"], f"update {i} evaluation policy")


# ---------------------------------------------------------------------------- CRL
def resnet(params: list[torch.Tensor], x: torch.Tensor, depth: int, eps: float) -> torch.Tensor:
    """Wang et al. 2025: a Dense-LayerNorm-swish unit, depth / 4 blocks x + 4 such units, a
    Dense head (JaxGCRL's Encoder/Actor with skip_connections=4, n_hidden = depth + 1)."""
    it = iter(params)

    def unit(h: torch.Tensor) -> torch.Tensor:
        w, b, gain, bias = next(it), next(it), next(it), next(it)
        h = layer_norm(h @ w.T + b, gain, bias, eps)
        return h * torch.sigmoid(h)

    h = unit(x)
    for _ in range(depth // 4):
        y = h
        for _ in range(4):
            y = unit(y)
        h = h + y
    w, b = next(it), next(it)
    return h @ w.T + b


def pairwise(energy: str, phi: torch.Tensor, psi: torch.Tensor) -> torch.Tensor:
    """f(phi_i, psi_j): [B, D] x [B, D] -> [B, B]."""
    diff2 = ((phi[:, None, :] - psi[None, :, :]) ** 2).sum(-1)
    dot = phi @ psi.T
    return {"l2": lambda: -diff2.sqrt(), "norm": lambda: -(diff2 + 1e-6).sqrt(),
            "l2_squared": lambda: -diff2, "dot": lambda: dot,
            "cosine": lambda: dot / (phi.norm(dim=-1)[:, None] * psi.norm(dim=-1)[None, :]),
            }[energy]()


def paired(energy: str, phi: torch.Tensor, psi: torch.Tensor) -> torch.Tensor:
    """f(phi_i, psi_i): [B, D] x [B, D] -> [B]."""
    diff2 = ((phi - psi) ** 2).sum(-1)
    dot = (phi * psi).sum(-1)
    return {"l2": lambda: -diff2.sqrt(), "norm": lambda: -(diff2 + 1e-6).sqrt(),
            "l2_squared": lambda: -diff2, "dot": lambda: dot,
            "cosine": lambda: dot / (phi.norm(dim=-1) * psi.norm(dim=-1))}[energy]()


def infonce(variant: str, logits: torch.Tensor) -> torch.Tensor:
    """JaxGCRL's ``contrastive_loss_fn``: fwd_infonce, bwd_infonce, sym_infonce."""
    diag = torch.diagonal(logits)
    forward = -(diag - torch.logsumexp(logits, 1)).mean()
    backward = -(diag - torch.logsumexp(logits, 0)).mean()
    return {"forward": forward, "backward": backward, "symmetric": forward + backward}[variant]


def crl_critic_phase(cfg: CRLConfig, phi: torch.Tensor, psi: torch.Tensor,
                     params: list[torch.Tensor], opt: Adam) -> dict[str, Any]:
    """JaxGCRL's ``update_critic``: InfoNCE on the B x B energies plus the logsumexp penalty,
    one Adam step of both encoders."""
    logits = pairwise(cfg.energy, phi, psi)
    loss = infonce(cfg.contrastive_loss, logits)
    if cfg.logsumexp_penalty:
        lse = torch.logsumexp(logits + cfg.logsumexp_offset, 1)
        loss = loss + cfg.logsumexp_penalty * (lse ** 2).mean()
    grads = grad(loss, params)
    opt.step(grads)
    b = logits.shape[0]
    eye = torch.eye(b, dtype=torch.bool)
    return {"loss/critic": loss, "train/grad_norm/critic": norm(grads), "critic grads": grads,
            "train/accuracy": (logits.argmax(1) == torch.arange(b)).double().mean(),
            "train/logits_pos": torch.diagonal(logits).mean(),
            "train/logits_neg": logits[~eye].mean()}


def crl_actor_phase(cfg: CRLConfig, actor: list[torch.Tensor], sa: list[torch.Tensor],
                    log_alpha: torch.Tensor, opts: dict[str, Adam], actor_obs: torch.Tensor,
                    state: torch.Tensor, psi: torch.Tensor, noise: torch.Tensor,
                    alpha: torch.Tensor) -> dict[str, Any]:
    """JaxGCRL's ``update_actor_and_alpha``: E[alpha log pi - f(phi(s, a~pi), psi(g))] with phi
    as it stands (frozen), then the temperature, each one Adam step."""
    depth, eps = cfg.actor_depth, cfg.layer_norm_eps
    mean, raw = resnet(actor, actor_obs, depth, eps).chunk(2, -1)
    log_std = -5.0 + 3.5 * (torch.tanh(raw) + 1) if cfg.log_std_tanh else raw.clamp(-20.0, 2.0)
    u = mean + log_std.exp() * noise
    action = torch.tanh(u)
    if cfg.squash_epsilon:  # JaxGCRL: log(1 - tanh(u)^2 + 1e-6)
        log_det = torch.log(1 - action ** 2 + cfg.squash_epsilon)
    else:  # log(1 - tanh(u)^2) = -2 log cosh(u), in a form exact for large |u|
        log_det = -2 * (u.abs() + torch.log1p(torch.exp(-2 * u.abs())) - math.log(2))
    log_prob = (-0.5 * noise ** 2 - log_std - 0.5 * math.log(2 * math.pi) - log_det).sum(-1)
    phi_pi = resnet(frozen(sa), torch.cat([state, action], 1), cfg.critic_depth, eps)
    loss = (alpha * log_prob - paired(cfg.energy, phi_pi, psi.detach())).mean()
    grads = grad(loss, actor)
    opts["actor"].step(grads)
    target_entropy = -0.5 * action.shape[1]
    c = (-log_prob.detach() - target_entropy).mean()
    t_loss = log_alpha.exp() * c if cfg.temperature_on_alpha else log_alpha * c
    t_grads = grad(t_loss, [log_alpha])
    opts["alpha"].step(t_grads)
    return {"loss/actor": loss, "train/grad_norm/actor": norm(grads), "actor grads": grads,
            "train/entropy": -log_prob.mean(), "loss/alpha": t_loss,
            "train/grad_norm/alpha": t_grads[0].abs(), "alpha grads": t_grads}


JAXGCRL = {"energy": "norm", "contrastive_loss": "forward", "logsumexp_penalty": 0.1,
           "actor_first": True, "temperature_on_alpha": True, "log_std_tanh": True,
           "layer_norm_eps": 1e-6, "squash_epsilon": 1e-6, "logsumexp_offset": 1e-6}
CRL_CASES = {
    "jaxgcrl": JAXGCRL,
    "ours": {},
    "dot_symmetric": {"energy": "dot", "contrastive_loss": "symmetric"},
    "l2_squared_backward": {"energy": "l2_squared", "contrastive_loss": "backward",
                            "logsumexp_penalty": 0.0},
    "cosine_forward": {"energy": "cosine", "actor_first": True},
}


@pytest.mark.parametrize("case", list(CRL_CASES))
def test_crl_matches_jaxgcrl(case: str, close: Close) -> None:
    """CRL: critic (energy, InfoNCE variant, logsumexp penalty), actor and temperature, every
    loss term, gradient, parameter and Adam moment over K = 3 updates."""
    check = Checker(close, "CRL")
    state_dim, goal_dim, act_dim, worlds, depth = 4, 2, 2, 3, 4
    spec = EnvSpec(obs_dim=state_dim + goal_dim, action_dim=act_dim,
                   action_low=-torch.ones(act_dim), action_high=torch.ones(act_dim),
                   control_dt=0.05, max_episode_steps=6, task="toy_goal",
                   goal=GoalSpec(columns=(4, 5), achieved=(0, 1), success_distance=0.1))
    cfg = CRLConfig(batch_size=12, buffer_steps=16, learning_starts=0, repr_dim=8,
                    critic_width=16, critic_depth=depth, actor_width=16, actor_depth=depth,
                    init_alpha=0.5, critic_lr=1e-3, actor_lr=1e-3, alpha_lr=1e-2,
                    **CRL_CASES[case])  # type: ignore[arg-type]
    ours = CRL(spec, cfg, num_envs=worlds, seed=11)
    g = torch.Generator().manual_seed(0)
    for t in range(16):  # episodes of 5 steps, per world offset
        ours.buffer.add(torch.randn(worlds, spec.obs_dim, generator=g),
                        torch.rand(worlds, act_dim, generator=g) * 1.8 - 0.9,
                        torch.arange(worlds) + worlds * ((t + torch.arange(worlds)) // 5))
    batches: list[tuple[dict[str, torch.Tensor], torch.Tensor]] = []
    sample = ours.buffer.sample

    def recorded_sample(*args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        batch = sample(*args, **kwargs)
        batches.append((batch, ours.generator.get_state()))
        return batch

    ours.buffer.sample = recorded_sample  # type: ignore[method-assign]
    rows: list[torch.Tensor] = []
    update_once = ours._update_once
    ours._update_once = lambda: rows.append(update_once()) or rows[-1]  # type: ignore[method-assign]
    logs: dict[str, list[list[torch.Tensor]]] = {"critic": [], "actor": [], "alpha": []}
    for name in logs:
        record(getattr(ours, f"{name}_step"), logs[name])

    sa, goal_enc, actor = leaves(ours.sa_encoder), leaves(ours.g_encoder), leaves(ours.actor)
    log_alpha = ours.log_alpha.detach().clone().requires_grad_(True)
    opts = {"critic": Adam(sa + goal_enc, cfg.critic_lr), "actor": Adam(actor, cfg.actor_lr),
            "alpha": Adam([log_alpha], cfg.alpha_lr)}
    eps = cfg.layer_norm_eps

    for i in range(3):
        ours.owed_updates = 1.0
        ours.update()
        batch, generator_state = batches[i]
        noise_gen = torch.Generator()
        noise_gen.set_state(generator_state)
        noise = torch.randn(cfg.batch_size, act_dim, generator=noise_gen)
        state = batch["obs"][:, :state_dim]
        goal = batch["future_obs"][:, :goal_dim]  # the achieved columns (0, 1)
        actor_obs = torch.cat([state, goal], 1)  # goal columns (4, 5) relabelled
        alpha = log_alpha.detach().exp()
        phi = resnet(sa, torch.cat([state, batch["action"]], 1), depth, eps)
        psi = resnet(goal_enc, goal, depth, eps)
        if cfg.actor_first:  # JaxGCRL's update_networks: actor and alpha, then the critic
            out = {**crl_actor_phase(cfg, actor, sa, log_alpha, opts, actor_obs, state, psi,
                                     noise, alpha),
                   **crl_critic_phase(cfg, phi, psi, sa + goal_enc, opts["critic"])}
        else:
            out = {**crl_critic_phase(cfg, phi, psi, sa + goal_enc, opts["critic"]),
                   **crl_actor_phase(cfg, actor, sa, log_alpha, opts, actor_obs, state, psi,
                                     noise, alpha)}
        out["train/alpha"] = alpha
        out["train/goal_offset"] = batch["offset"].double().mean()
        for key, value in zip(crl_module.METRIC_KEYS, rows[i], strict=True):
            check(value, out[key], f"{case} update {i} {key}")
        for name in logs:
            check(logs[name][i], out[f"{name} grads"], f"{case} update {i} {name} gradients")
        check(list(ours.sa_encoder.parameters()) + list(ours.g_encoder.parameters()),
              sa + goal_enc, f"{case} update {i} encoders")
        check(list(ours.actor.parameters()), actor, f"{case} update {i} actor")
        check(ours.log_alpha, log_alpha, f"{case} update {i} log alpha")
        for name in logs:
            check_adam(check, getattr(ours, f"{name}_opt"), opts[name], f"{case} update {i} {name}")


# ---------------------------------------------------------------------------- GRPO
def group_advantages(outcome: torch.Tensor, estimator: str) -> torch.Tensor:
    """[M, G] outcomes -> advantages: DeepSeekMath's (r - mean) / (std + eps) (std over the
    group, 1/G, eps 1e-6 as ours), Dr. GRPO's r - mean, RLOO's r - mean of the others."""
    g = outcome.shape[1]
    mean = outcome.mean(1, keepdim=True)
    if estimator == "grpo":
        std = ((outcome - mean) ** 2).mean(1, keepdim=True).sqrt()
        return (outcome - mean) / (std + 1e-6)
    if estimator == "dr_grpo":
        return outcome - mean
    return outcome - (outcome.sum(1, keepdim=True) - outcome) / (g - 1)


def aggregate(x: torch.Tensor, valid: torch.Tensor, mode: str) -> torch.Tensor:
    """[B, T] per-step values over the valid steps: DAPO's token-level mean, GRPO's mean over
    sequences of each sequence's mean, Dr. GRPO's sum over steps / T then mean."""
    x = torch.where(valid, x, torch.zeros((), dtype=x.dtype))
    n = valid.sum(1).double()
    if mode == "token_mean":
        return x.sum() / n.sum()
    if mode == "seq_mean_token_mean":
        return (x.sum(1) / n.clamp(min=1)).mean()
    assert mode == "seq_mean_token_sum_norm"
    return x.sum(1).mean() / x.shape[1]


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's unbiased KL estimator r - 1 - log r, r = exp(log_ratio)."""
    return torch.exp(log_ratio) - 1 - log_ratio


GRPO_CASES = {
    # DeepSeekMath: symmetric clip, per-sequence mean of per-token terms, k3 KL to the reference
    "grpo": {"advantage": "grpo", "clip_low": 0.2, "clip_high": 0.2,
             "loss_agg": "seq_mean_token_mean", "kl_coef": 0.04, "dynamic_sampling": False},
    # DAPO: clip-higher, token-level loss, dynamic sampling, no KL
    "dapo": {"advantage": "grpo", "clip_low": 0.2, "clip_high": 0.28, "loss_agg": "token_mean",
             "kl_coef": 0.0, "dynamic_sampling": True},
    # Dr. GRPO: no std, token sums over the fixed horizon; with an entropy bonus
    "dr_grpo": {"advantage": "dr_grpo", "loss_agg": "seq_mean_token_sum_norm",
                "entropy_coef": 0.01, "dynamic_sampling": False},
    "rloo": {"advantage": "rloo", "loss_agg": "token_mean", "dynamic_sampling": True,
             "kl_coef": 0.1},
    # GSPO: one ratio per trajectory, the geometric mean of its steps'
    "gspo": {"ratio": "sequence", "clip_low": 0.1, "clip_high": 0.15,
             "dynamic_sampling": False},
}


@pytest.mark.parametrize("case", list(GRPO_CASES))
def test_grpo_matches_the_papers(case: str, close: Close, monkeypatch: pytest.MonkeyPatch
                                 ) -> None:
    """Two batches (groups from rounds of G worlds, early terminations, dynamic sampling),
    2 epochs x 2 minibatches each: 8 steps, every loss term, gradient (after clipping),
    parameter, Adam moment and the observation normalizer."""
    check = Checker(close, "GRPO")
    obs_dim, act_dim, group, worlds, horizon = 3, 2, 4, 8, 5
    cfg = GRPOConfig(group_size=group, num_epochs=2, num_minibatches=2, learning_rate=0.05,
                     max_grad_norm=0.5, actor_hidden=(8, 8), init_log_std=-0.5,
                     **GRPO_CASES[case])  # type: ignore[arg-type]
    ours = GRPO(obs_dim, -torch.ones(act_dim), torch.ones(act_dim), worlds, horizon, cfg,
                seed=13)
    losses: list[dict[str, torch.Tensor]] = []
    loss_fn = grpo_module.grpo_loss

    def recorded_loss(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, metrics = loss_fn(*args, **kwargs)
        losses.append(metrics)
        return loss, metrics

    monkeypatch.setattr(grpo_module, "grpo_loss", recorded_loss)
    grads: list[list[torch.Tensor]] = []
    record(ours.step, grads)
    snapshots: list[tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]] = []
    apply = ours.step.apply

    def snapshot() -> None:
        apply()
        snapshots.append(([p.detach().clone() for p in ours.policy.parameters()],
                          [{k: v.clone() for k, v in ours.optimizer.state[p].items()}
                           for p in ours.policy.parameters()]))

    ours.step.apply = snapshot

    params = leaves(ours.policy)
    reference = frozen(params)
    opt = Adam(params, cfg.learning_rate)
    norm_mean, norm_var, norm_count = torch.zeros(obs_dim), torch.ones(obs_dim), 1e-8
    g = torch.Generator().manual_seed(13)
    env = torch.Generator().manual_seed(1)

    def policy(p: list[torch.Tensor], obs: torch.Tensor, stats: tuple[torch.Tensor, ...] = ()
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, clamped log std) on observations normalized by ``stats`` (mean, var), the
        running ones by default (the log std is registered before the network)."""
        log_std, *net = p
        mean, var = stats or (norm_mean, norm_var)
        x = ((obs - mean) / torch.sqrt(var + 1e-8)).clamp(-10, 10)
        return mlp(net, x, torch.tanh), log_std.clamp(-5.0, 2.0)

    step, scales = 0, []
    for outcomes in ([[1, 1, 1, 1, 0, 2, 1, 3], [2, 0, 1, 1, 5, 5, 5, 5]],
                     [[0, 1, 0, 0, 3, 3, 3, 3], [1, 1, 1, 1, 2, 2, 2, 2], [4, 0, 2, 1, 1, 2, 2, 2]]):
        trajectories: list[dict[str, torch.Tensor]] = []  # the reference's batch
        for outcome in outcomes:
            obs = torch.randn(horizon, worlds, obs_dim, generator=env)
            ends = {1: 1, 6: 3}  # world -> step of its termination
            actions, old = [], []
            for t in range(horizon):
                action = ours.act(obs[t])
                ours.process_env_step(torch.zeros(worlds),
                                      torch.tensor([ends.get(n) == t for n in range(worlds)]),
                                      torch.zeros(worlds, dtype=torch.bool), obs[t])
                noise = torch.randn(worlds, act_dim, generator=g)
                with torch.no_grad():
                    mean, log_std = policy(params, obs[t])
                    a = mean + log_std.exp() * noise
                actions.append(a)
                old.append(gaussian_log_prob(a, mean, log_std))
                check(action, a.clamp(-1, 1), f"{case} collected action")
            ready = ours.end_round(torch.tensor(outcome, dtype=torch.float64))
            steps = torch.arange(horizon)
            valid = torch.stack([steps <= ends.get(n, horizon) for n in range(worlds)])
            grouped = torch.tensor(outcome, dtype=torch.float64).reshape(-1, group)
            adv = group_advantages(grouped, cfg.advantage)
            for m in range(worlds // group):
                informative = bool(grouped[m].max() > grouped[m].min())
                if len(trajectories) == worlds or (cfg.dynamic_sampling and not informative):
                    continue
                for n in range(m * group, (m + 1) * group):
                    trajectories.append({"obs": obs[:, n], "action": torch.stack(actions)[:, n],
                                         "old": torch.stack(old)[:, n], "valid": valid[n],
                                         "adv": adv[m, n - m * group]})
            if ready:
                break
        assert ready and (len(trajectories) == worlds or not cfg.dynamic_sampling)
        batch = {k: torch.stack([tr[k] for tr in trajectories]) for k in trajectories[0]}
        b = batch["adv"].numel()
        size = -(-b // cfg.num_minibatches)
        ours.update()
        for _ in range(cfg.num_epochs):
            for idx in torch.randperm(b, generator=g).split(size):
                mb = {k: v[idx] for k, v in batch.items()}
                mean, log_std = policy(params, mb["obs"])
                logp = gaussian_log_prob(mb["action"], mean, log_std)  # [b, T]
                valid, adv = mb["valid"], mb["adv"]
                log_ratio = logp - mb["old"]
                if cfg.ratio == "sequence":  # GSPO eq. 7
                    n = valid.sum(1).double()
                    seq = torch.where(valid, log_ratio, torch.zeros(())).sum(1) / n
                    r = seq.exp()
                    surrogate = -torch.minimum(r * adv, r.clamp(1 - cfg.clip_low,
                                                                1 + cfg.clip_high) * adv)
                    pg = surrogate.mean()
                    kl_old, clipped = k3(seq.detach()).mean(), (
                        r.clamp(1 - cfg.clip_low, 1 + cfg.clip_high) * adv < r * adv).double().mean()
                else:  # PPO's clipped surrogate per step, the trajectory's advantage
                    r = log_ratio.exp()
                    a = adv[:, None]
                    unclipped, clip = r * a, r.clamp(1 - cfg.clip_low, 1 + cfg.clip_high) * a
                    pg = aggregate(-torch.minimum(unclipped, clip), valid, cfg.loss_agg)
                    kl_old = k3(log_ratio.detach())[valid].mean()
                    clipped = (clip < unclipped)[valid].double().mean()
                entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum().expand_as(logp)
                ent = aggregate(entropy, valid, cfg.loss_agg)
                loss = pg - cfg.entropy_coef * ent
                kl_ref = torch.zeros(())
                if cfg.kl_coef > 0:
                    with torch.no_grad():  # pi_ref: the initial policy, its statistics too
                        ref_mean, ref_log_std = policy(reference, mb["obs"],
                                                       (torch.zeros(obs_dim), torch.ones(obs_dim)))
                        logp_ref = gaussian_log_prob(mb["action"], ref_mean, ref_log_std)
                    kl_ref = aggregate(k3(logp_ref - logp), valid, cfg.loss_agg)
                    loss = loss + cfg.kl_coef * kl_ref
                step_grads = grad(loss, params)
                total = norm(step_grads)
                scale = min(1.0, cfg.max_grad_norm / (float(total) + 1e-6))
                scales.append(scale)
                step_grads = [gr * scale for gr in step_grads]
                opt.step(step_grads)
                ours_m = losses[step]
                what = f"{case} step {step}"
                check(ours_m["loss/policy"], pg, f"{what} policy loss")
                check(ours_m["loss/kl_ref"], kl_ref, f"{what} KL to the reference")
                check(ours_m["loss/entropy"], -ent, f"{what} entropy term")
                check(ours_m["loss/total"], loss, f"{what} total loss")
                check(ours_m["train/kl"], kl_old, f"{what} KL(old || new)")
                check(ours_m["train/clipfrac"], clipped, f"{what} clip fraction")
                check(grads[step], step_grads, f"{what} gradients (clipped)")
                ours_params, ours_adam = snapshots[step]
                check(ours_params, params, f"{what} parameters")
                for i, state in enumerate(ours_adam):
                    check(state["exp_avg"], opt.m[i], f"{what} Adam exp_avg[{i}]")
                    check(state["exp_avg_sq"], opt.v[i], f"{what} Adam exp_avg_sq[{i}]")
                    check(state["step"], float(opt.t), f"{what} Adam step")
                step += 1
        # the normalizer folds the batch's valid observations in after the update (Chan et al.)
        x = batch["obs"][batch["valid"]]
        n, batch_mean = x.shape[0], x.mean(0)
        batch_var = ((x - batch_mean) ** 2).mean(0)
        total_count = norm_count + n
        delta = batch_mean - norm_mean
        norm_var = (norm_var * norm_count + batch_var * n
                    + delta ** 2 * norm_count * n / total_count) / total_count
        norm_mean = norm_mean + delta * n / total_count
        norm_count = total_count
        normalizer = ours.policy.normalizer
        check([normalizer.mean, normalizer.var, normalizer.count],
              [norm_mean, norm_var, torch.tensor(norm_count)], f"{case} normalizer")
    assert step == 8 and min(scales) < 1  # the gradient clip was exercised
    if cfg.clip_high < 1:  # the clipped branch was exercised
        assert any(float(m["train/clipfrac"]) > 0 for m in losses), case
