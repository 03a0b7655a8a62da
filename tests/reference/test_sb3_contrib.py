"""Reference equivalence with sb3-contrib: TRPO (``robotrl.algos.trpo``) and CrossQ
(``robotrl.algos.crossq``, ``robotrl.nn.batch_renorm``), update for update, in float64.

Both sides get the same weights, the same data (a rollout injected into the peer's buffer; a
replay batch returned by both sides' ``sample``) and the same noise (ours draws it from its
generator; the peer's draws are replaced by the recorded values), then every loss term,
gradient, parameter, normalization statistic and optimizer moment is compared after each of
K updates. Our functions are wrapped to record what they compute, never replaced.

Our deliberate differences, each set to sb3-contrib's value here:

- TRPO: ``reverse_kl`` (it bounds KL(new || old)); ``value_coef=2`` (its critic loss is the
  plain mean squared error); ``max_kl`` and ``cg_damping`` times the action dimension (its KL is
  averaged over action dimensions, ours summed: the same step, our CG direction divided by A);
  ``fvp_fraction=1`` (its ``sub_sampling_factor=1``). Its CG starts from ``1e-4 * randn``; the
  injected noise is ours, zero.
- CrossQ: ``renorm_variant="sb3_contrib"`` (its Batch Renormalization normalizes with the
  unbiased batch variance and corrects by a shifted mean and scaled variance);
  ``renorm_warmup`` its ``renorm_warmup_steps`` + 1 (it compares its count of forwards before
  adding one); ``alpha_adam_beta1=0.9`` (its temperature optimizer is torch's default Adam);
  ``squash_epsilon=1e-6`` (its log-determinant ``log(1 - tanh(u)^2 + 1e-6)``).

The peer's float32 casts are lifted, nothing else of it changed: ``preprocess_obs`` keeps a
float64 observation, CrossQ's ``BatchRenorm1d`` (float32 whatever the default dtype) is cast to
float64, and TRPO's actions are float32-representable (its rollout buffer hands them out as
float32).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

INSTALL = "sb3-contrib is not installed: pip install -e '.[dev]' (or pip install sb3-contrib)"
pytest.importorskip("sb3_contrib", reason=INSTALL)

import gymnasium as gym  # noqa: E402
import sb3_contrib.common.utils as sb3c_utils  # noqa: E402
import sb3_contrib.trpo.trpo as sb3_trpo  # noqa: E402
import stable_baselines3.common.policies as sb3_policies  # noqa: E402
import torch.distributions.normal as torch_normal  # noqa: E402
from sb3_contrib import TRPO as PeerTRPO  # noqa: E402
from sb3_contrib import CrossQ as PeerCrossQ  # noqa: E402
from sb3_contrib.common.torch_layers import BatchRenorm1d  # noqa: E402
from stable_baselines3.common.logger import Logger  # noqa: E402
from stable_baselines3.common.type_aliases import ReplayBufferSamples  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

import robotrl.algos.trpo as our_trpo  # noqa: E402
import robotrl.nn.squashed_gaussian as our_squashed  # noqa: E402
from robotrl.algos.crossq import CrossQ, CrossQConfig  # noqa: E402
from robotrl.algos.trpo import TRPO, TRPOConfig  # noqa: E402
from robotrl.nn.batch_renorm import BatchRenorm  # noqa: E402


class _Spaces(gym.Env):
    """Spaces only: the peers are built on it, their data is injected."""

    def __init__(self, obs_dim: int, act_dim: int) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float64)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        return np.zeros(self.observation_space.shape), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(self.observation_space.shape), 0.0, False, False, {}


class _Proxy:
    """A module stand-in: ``overrides`` first, everything else from ``module``."""

    def __init__(self, module: Any, **overrides: Any) -> None:
        self._module, self._overrides = module, overrides

    def __getattr__(self, name: str) -> Any:
        return self._overrides[name] if name in self._overrides else getattr(self._module, name)


class _Checker:
    """``close`` with the largest relative difference kept per kind of quantity."""

    def __init__(self, close: Callable[..., float]) -> None:
        self.close, self.worst = close, {}

    def __call__(self, kind: str, ours: Any, theirs: Any, what: str) -> None:
        self.worst[kind] = max(self.worst.get(kind, 0.0), self.close(ours, theirs, what))

    def report(self, title: str) -> None:
        print(f"\n{title}: largest relative difference " +
              ", ".join(f"{k} {v:.1e}" for k, v in self.worst.items()))


def _calls() -> dict[str, list[Any]]:
    return {}


def _record(calls: dict[str, list[Any]], key: str, value: Any) -> None:
    calls.setdefault(key, []).append(value)


def _snapshot(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in params.items()}


@pytest.fixture(autouse=True)
def peer_in_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    """The peers' ``preprocess_obs`` casts a Box observation to float32 (``obs.float()``):
    here a float64 one passes as it is."""
    preprocess = sb3_policies.preprocess_obs

    def keep_dtype(obs: torch.Tensor, space: Any, normalize_images: bool = True) -> Any:
        if (isinstance(space, gym.spaces.Box) and obs.dtype == torch.float64
                and not sb3_policies.is_image_space(space)):
            return obs
        return preprocess(obs, space, normalize_images=normalize_images)

    monkeypatch.setattr(sb3_policies, "preprocess_obs", keep_dtype)


# =============================================================================== TRPO
OBS, ACT, ENVS, STEPS, MINIBATCHES, HIDDEN, TRPO_K = 5, 2, 4, 16, 4, (16, 16), 4


def _trpo_names(ours: TRPO) -> dict[str, str]:
    """Our parameter name -> sb3-contrib's (``MlpPolicy``, separate pi and vf networks)."""
    names = {"log_std": "log_std", "actor_head.4.weight": "action_net.weight",
             "actor_head.4.bias": "action_net.bias", "critic_head.4.weight": "value_net.weight",
             "critic_head.4.bias": "value_net.bias"}
    for i in (0, 2):
        for kind in ("weight", "bias"):
            names[f"actor_head.{i}.{kind}"] = f"mlp_extractor.policy_net.{i}.{kind}"
            names[f"critic_head.{i}.{kind}"] = f"mlp_extractor.value_net.{i}.{kind}"
    assert set(names) == {n for n, _ in ours.policy.named_parameters()}
    return names


def _build_trpo(target_kl: float, line_search_steps: int, damping: float, cg_iters: int
                ) -> tuple[TRPO, PeerTRPO]:
    lr, epochs, gamma, lam = 3e-3, 3, 0.97, 0.9
    torch.manual_seed(0)
    cfg = TRPOConfig(
        rollout_steps=STEPS, gamma=gamma, gae_lambda=lam, max_kl=target_kl * ACT, cg_iters=cg_iters,
        cg_damping=damping * ACT, reverse_kl=True, fvp_fraction=1.0,
        line_search_steps=line_search_steps, backtrack=0.8, critic_lr=lr, critic_epochs=epochs,
        critic_minibatches=MINIBATCHES, value_coef=2.0, normalize_advantages=True,
        actor_hidden=HIDDEN, critic_hidden=HIDDEN, activation="tanh", init_log_std=-0.3,
        min_action_std=0.0, normalize_obs=False, reward_scaling=False)
    ours = TRPO(OBS, -torch.ones(ACT), torch.ones(ACT), ENVS, cfg, seed=1)
    assert ours.buffer.obs.dtype == torch.float64  # the learner follows the default dtype
    peer = PeerTRPO(
        "MlpPolicy", DummyVecEnv([lambda: _Spaces(OBS, ACT)] * ENVS), learning_rate=lr,
        n_steps=STEPS, batch_size=STEPS * ENVS // MINIBATCHES, gamma=gamma, gae_lambda=lam,
        cg_max_steps=cg_iters, cg_damping=damping, line_search_shrinking_factor=0.8,
        line_search_max_iter=line_search_steps, n_critic_updates=epochs,
        normalize_advantage=True, target_kl=target_kl, sub_sampling_factor=1, device="cpu",
        seed=0, policy_kwargs={"net_arch": {"pi": list(HIDDEN), "vf": list(HIDDEN)},
                               "activation_fn": nn.Tanh})
    peer.set_logger(Logger(folder=None, output_formats=[]))
    names, theirs = _trpo_names(ours), dict(peer.policy.named_parameters())
    with torch.no_grad():
        for name, p in ours.policy.named_parameters():
            assert theirs[names[name]].dtype == p.dtype == torch.float64
            theirs[names[name]].copy_(p)
    return ours, peer


def _inject_rollout(ours: TRPO, peer: PeerTRPO, gen: torch.Generator, widen: bool) -> None:
    """A rollout of the current policy into both buffers, then each side's GAE (ours:
    ``compute_returns``; the peer: ``compute_returns_and_advantage``). Observations, rewards
    and terminations are random; with ``widen`` the reward grows with the sampled noise's
    square, so the step raises the std, where the exact KL exceeds its quadratic model and the
    line search shrinks the step."""
    obs = torch.randn(STEPS, ENVS, OBS, generator=gen) * 1.5
    last_obs = torch.randn(ENVS, OBS, generator=gen)
    reward = torch.randn(STEPS, ENVS, generator=gen)
    terminated = torch.rand(STEPS, ENVS, generator=gen) < 0.1
    with torch.no_grad():
        dist = ours.policy.dist(obs)
        noise = torch.randn(dist.loc.shape, generator=gen)
        action = (dist.loc + dist.scale * noise).float().double()  # float32-representable
        log_prob = dist.log_prob(action).sum(-1)
        value = ours.policy.value(obs)
    if widen:
        reward = reward * 0.1 + noise.square().sum(-1)
    for t in range(STEPS):
        ours.buffer.add(obs[t], action[t], log_prob[t], value[t], reward[t], terminated[t],
                        torch.zeros(ENVS, dtype=torch.bool))
    ours.compute_returns(last_obs)
    rb = peer.rollout_buffer
    rb.reset()
    starts = np.zeros((STEPS, ENVS))
    starts[1:] = terminated[:-1].numpy()
    # float64 arrays in place of its float32 ones (it keeps the dtype it is given)
    rb.observations, rb.actions, rb.rewards = obs.numpy(), action.numpy(), reward.numpy()
    rb.episode_starts, rb.values, rb.log_probs = starts, value.numpy(), log_prob.numpy()
    rb.advantages, rb.returns = np.zeros((STEPS, ENVS)), np.zeros((STEPS, ENVS))
    rb.pos, rb.full = STEPS, True
    with torch.no_grad():
        rb.compute_returns_and_advantage(peer.policy.predict_values(last_obs),
                                         terminated[-1].numpy())


def _peer_index(ours_flat: torch.Tensor) -> np.ndarray:
    """Our flat sample index (t N + n) as the peer's (n T + t: it swaps env and step)."""
    return ((ours_flat % ENVS) * STEPS + ours_flat // ENVS).numpy()


def _instrument_trpo(ours: TRPO, peer: PeerTRPO, mp: pytest.MonkeyPatch,
                     calls: dict[str, dict[str, list[Any]]], perms: list[np.ndarray]) -> None:
    """Record what both sides compute into ``calls["ours"]`` / ``calls["peer"]``; inject the
    peer's CG start (zero, ours) and its minibatch order (``perms``, one per draw)."""
    ours_params, peer_params = dict(ours.policy.named_parameters()), \
        dict(peer.policy.named_parameters())
    cg, fvp_of, surrogate, kl_of = (our_trpo.conjugate_gradient, our_trpo.fisher_vector_product,
                                    our_trpo.surrogate_loss, ours._kl)

    def ours_cg(mvp: Callable, b: torch.Tensor, iters: int) -> Any:
        x, residual = cg(mvp, b, iters)
        _record(calls["ours"], "cg", (b.clone(), x.clone()))
        return x, residual

    def ours_fvp(kl: torch.Tensor, params: list[torch.Tensor], damping: float) -> Callable:
        fvp = fvp_of(kl, params, damping)

        def recorded(v: torch.Tensor) -> torch.Tensor:
            out = fvp(v)
            _record(calls["ours"], "fvp", (v.detach().clone(), out.detach().clone()))
            return out
        return recorded

    def ours_surrogate(logp_new: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor) -> Any:
        loss, metrics = surrogate(logp_new, logp_old, adv)
        _record(calls["ours"], "surrogate", (loss.detach().clone(), _snapshot(ours_params)))
        return loss, metrics

    def ours_kl(old: Any, new: Any) -> torch.Tensor:
        out = kl_of(old, new)
        _record(calls["ours"], "kl", out.detach().clone())
        return out

    class CriticStep:  # our GradientStep, recording the loss it steps on
        def __init__(self, step: Any) -> None:
            self.step = step

        def __getattr__(self, name: str) -> Any:
            return getattr(self.step, name)

        def __call__(self, loss: torch.Tensor, where: str = "") -> torch.Tensor:
            _record(calls["ours"], "value_loss", loss.detach().clone())
            return self.step(loss, where)

    mp.setattr(our_trpo, "conjugate_gradient", ours_cg)
    mp.setattr(our_trpo, "fisher_vector_product", ours_fvp)
    mp.setattr(our_trpo, "surrogate_loss", ours_surrogate)
    mp.setattr(ours, "_kl", ours_kl)
    mp.setattr(ours, "critic_step", CriticStep(ours.critic_step))
    ours.critic_optimizer.register_step_pre_hook(lambda opt, args, kwargs: _record(
        calls["ours"], "value_grad",
        {n: p.grad.clone() for n, p in ours_params.items() if n.startswith("critic_head.")}))

    solver, hvp, actor_grad, kl_divergence = (sb3_trpo.conjugate_gradient_solver,
                                              peer.hessian_vector_product,
                                              peer._compute_actor_grad, sb3_trpo.kl_divergence)
    mse = torch.nn.functional.mse_loss

    def peer_cg(mvp: Callable, b: torch.Tensor, max_iter: int) -> torch.Tensor:
        x = solver(mvp, b, max_iter=max_iter)
        _record(calls["peer"], "cg", (b.clone(), x.clone()))
        return x

    def peer_hvp(params: Any, grad_kl: torch.Tensor, vector: torch.Tensor,
                 retain_graph: bool = True) -> torch.Tensor:
        out = hvp(params, grad_kl, vector, retain_graph=retain_graph)
        _record(calls["peer"], "fvp", (vector.detach().clone(), out.detach().clone()))
        return out

    def peer_actor_grad(kl_div: torch.Tensor, objective: torch.Tensor) -> Any:
        _record(calls["peer"], "objective", objective.detach().clone())
        return actor_grad(kl_div, objective)

    def peer_kl(dist_true: Any, dist_pred: Any) -> torch.Tensor:
        out = kl_divergence(dist_true, dist_pred)
        _record(calls["peer"], "kl", out.mean().detach().clone())
        _record(calls["peer"], "trial_params", _snapshot(peer_params))
        return out

    def peer_mse(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = mse(*args, **kwargs)
        _record(calls["peer"], "value_loss", out.detach().clone())
        return out

    mp.setattr(sb3_trpo, "conjugate_gradient_solver", peer_cg)
    mp.setattr(sb3c_utils, "th", _Proxy(torch, randn_like=torch.zeros_like))  # the CG start
    mp.setattr(peer, "hessian_vector_product", peer_hvp)
    mp.setattr(peer, "_compute_actor_grad", peer_actor_grad)
    mp.setattr(sb3_trpo, "kl_divergence", peer_kl)
    mp.setattr(sb3_trpo, "F", _Proxy(torch.nn.functional, mse_loss=peer_mse))
    mp.setattr(np.random, "permutation", lambda n: perms.pop(0))
    peer.policy.optimizer.register_step_pre_hook(lambda opt, args, kwargs: _record(
        calls["peer"], "value_grad",
        {n: p.grad.clone() for n, p in peer_params.items() if p.grad is not None}))


# the wide regions need a small damping (else the quadratic model overestimates the KL and the
# full step always passes) and 6 CG iterations: with 10 on the nearly singular F, the last
# products carry the two sides' different rounding to 1e-9
@pytest.mark.parametrize(("target_kl", "line_search_steps", "damping", "cg_iters"),
                         [(0.01, 10, 0.1, 10), (0.3, 3, 3e-3, 6), (0.3, 1, 3e-3, 6)],
                         ids=["full-step", "backtrack", "reject"])
def test_trpo_matches_sb3_contrib(close: Callable[..., float], monkeypatch: pytest.MonkeyPatch,
                                  target_kl: float, line_search_steps: int, damping: float,
                                  cg_iters: int) -> None:
    """K updates of TRPO against ``sb3_contrib.TRPO``: GAE; the surrogate and its gradient;
    every Fisher-vector product of CG, its solution and the step size from the KL bound
    (``s^T F s``); every line-search trial (parameters, exact KL) and which one is accepted
    (the full step; a shrunk one; none); the value regression's loss and gradients per
    minibatch; after each update every parameter and the critic's Adam state."""
    ours, peer = _build_trpo(target_kl, line_search_steps, damping, cg_iters)
    names = _trpo_names(ours)
    ours_params, peer_params = dict(ours.policy.named_parameters()), \
        dict(peer.policy.named_parameters())
    ours_actor = [n for n in ours_params if not n.startswith("critic_head.")]
    peer_actor = [n for n in peer_params if "value" not in n]  # sb3-contrib's own filter

    def split(flat: torch.Tensor, side: str) -> dict[str, torch.Tensor]:
        """A flat actor vector as one tensor per our parameter name."""
        order, params = (ours_actor, ours_params) if side == "ours" else (peer_actor, peer_params)
        parts = dict(zip(order, flat.split([params[n].numel() for n in order]), strict=True))
        return {n: parts[n if side == "ours" else names[n]].view_as(ours_params[n])
                for n in ours_actor}

    def check_flat(kind: str, a: torch.Tensor, b: torch.Tensor, what: str) -> None:
        sa, sb = split(a, "ours"), split(b, "peer")
        for n in ours_actor:
            check(kind, sa[n], sb[n], f"{what} {n}")

    calls: dict[str, dict[str, list[Any]]] = {}
    perms: list[np.ndarray] = []
    _instrument_trpo(ours, peer, monkeypatch, calls, perms)
    check, gen, total, accepted = _Checker(close), torch.Generator().manual_seed(7), \
        STEPS * ENVS, []
    for k in range(TRPO_K):
        what = f"update {k}"
        calls.update(ours=_calls(), peer=_calls())
        _inject_rollout(ours, peer, gen, widen=target_kl > 0.01)
        rb = peer.rollout_buffer
        check("gae", ours.buffer.advantages, torch.as_tensor(rb.advantages), f"{what}: GAE")
        check("gae", ours.buffer.returns, torch.as_tensor(rb.returns), f"{what}: returns")
        # the minibatch order ours will draw (its generator, one permutation per value epoch),
        # handed to the peer in its index order, after the policy step's unshuffled batch
        g = torch.Generator().set_state(ours.generator.get_state())
        perms[:] = [_peer_index(torch.arange(total)),
                    *(_peer_index(torch.randperm(total, generator=g))
                      for _ in range(ours.cfg.critic_epochs))]
        metrics = ours.update()
        peer.train()
        logged = dict(peer.logger.name_to_value)
        co, cp = calls["ours"], calls["peer"]
        assert not perms, f"{what}: the peer drew another number of permutations"

        # the surrogate at the old parameters, its gradient g, CG's solution of F s = g
        (old_loss, _), *trials_ours = co["surrogate"]
        check("surrogate", -old_loss, cp["objective"][0], f"{what}: surrogate objective")
        ((g_ours, s_ours),), ((g_peer, s_peer),) = co["cg"], cp["cg"]
        check_flat("gradient", g_ours, g_peer, f"{what}: surrogate gradient")
        check_flat("CG", s_ours * ACT, s_peer, f"{what}: CG direction")
        # every Fisher-vector product (the peer's first is of its zero start): CG's, then
        # s^T F s, whence the step size sqrt(2 max_kl / s^T F s). Ours is A times the peer's F
        # (summed, not averaged KL), so its CG vectors are the same and its solution 1/A times.
        fvp_ours, fvp_peer = co["fvp"], cp["fvp"][1:]
        assert len(fvp_ours) == len(fvp_peer) == ours.cfg.cg_iters + 1, what
        for i, ((v_o, f_o), (v_p, f_p)) in enumerate(zip(fvp_ours, fvp_peer, strict=True)):
            step = i == len(fvp_ours) - 1
            check_flat("FVP", v_o * (ACT if step else 1), v_p, f"{what}: FVP {i} vector")
            check_flat("FVP", f_o / (1 if step else ACT), f_p, f"{what}: FVP {i} F v")
        # the line search: the same trials (parameters, exact KL), the same one accepted
        kl_ours, kl_peer = co["kl"], cp["kl"]
        assert len(kl_ours) == len(kl_peer), \
            f"{what}: {len(kl_ours) - 1} line-search trials (ours) != {len(kl_peer) - 1}"
        for i, (a, b) in enumerate(zip(kl_ours, kl_peer, strict=True)):
            check("KL", a / ACT, b, f"{what}: KL at trial {i - 1}")
        for i, ((_, p_o), p_p) in enumerate(zip(trials_ours, cp["trial_params"][1:],
                                                strict=True)):
            for n in ours_actor:
                check("line search", p_o[n], p_p[names[n]], f"{what}: trial {i} {n}")
        success = bool(logged["train/is_line_search_success"])
        accepted.append(len(kl_ours) - 2 if success else None)
        assert metrics["train/line_search_accepted"] == float(success), what
        assert metrics["train/step_fraction"] == pytest.approx(
            0.8 ** accepted[-1] if success else 0.0, rel=1e-12), what
        check("surrogate", -metrics["loss/policy"], logged["train/policy_objective"],
              f"{what}: objective after the step")
        check("surrogate", metrics["train/improvement"],
              logged["train/policy_objective"] - cp["objective"][0].item(),
              f"{what}: improvement")
        check("KL", metrics["train/kl"] / ACT, logged["train/kl_divergence_loss"],
              f"{what}: accepted KL")
        check("metrics", metrics["train/action_std"], logged["train/std"], f"{what}: std")
        check("metrics", metrics["train/explained_variance"],
              logged["train/explained_variance"], f"{what}: explained variance")
        # the value regression: every minibatch's loss and gradients
        assert len(co["value_loss"]) == len(cp["value_loss"]) == \
            ours.cfg.critic_epochs * MINIBATCHES, what
        for i, (a, b) in enumerate(zip(co["value_loss"], cp["value_loss"], strict=True)):
            check("value loss", a, b, f"{what}: value loss, minibatch {i}")
        for i, (g_o, g_p) in enumerate(zip(co["value_grad"], cp["value_grad"], strict=True)):
            assert set(g_p) == {names[n] for n in g_o}, f"{what}: the peer steps {set(g_p)}"
            for n, grad in g_o.items():
                check("value gradient", grad, g_p[names[n]], f"{what}: {n}, minibatch {i}")
        check("value loss", 2 * metrics["loss/value"], logged["train/value_loss"],
              f"{what}: mean value loss (half squared error, ours)")
        # after the update: every parameter, the critic's Adam state
        for n, p in ours_params.items():
            check("parameters", p, peer_params[names[n]], f"{what}: {n}")
        state = peer.policy.optimizer.state
        for n in (n for n in ours_params if n.startswith("critic_head.")):
            for key in ("exp_avg", "exp_avg_sq", "step"):
                check("Adam", ours.critic_optimizer.state[ours_params[n]][key],
                      state[peer_params[names[n]]][key], f"{what}: Adam {key} of {n}")
        assert not any(state[peer_params[names[n]]] for n in ours_actor), what
    if line_search_steps == 10:  # a narrow region: the full step every time
        assert accepted == [0] * TRPO_K, accepted
    elif line_search_steps == 3:  # a wide one: steps shrunk, all accepted
        assert None not in accepted and max(accepted) > 0, accepted
    else:  # one trial: the full step, rejected (the policy kept) or accepted
        assert None in accepted and 0 in accepted, accepted
    check.report(f"TRPO {target_kl}, {line_search_steps} trials, accepted {accepted}")


# =============================================================================== CrossQ
Q_OBS, Q_ACT, BATCH, DELAY, CROSSQ_K = 4, 2, 32, 2, 6
ACTOR_HIDDEN, CRITIC_HIDDEN, CRITICS = (16, 16), (24, 24), 2
PEER_WARMUP = 1
"""sb3-contrib's renorm_warmup_steps: 2 plain forwards, then renormalization (the critics from
update 3, the actor, trained every DELAY updates, at update 6)."""
_BRN = {"weight": "scale", "bias": "bias", "running_mean": "ra_mean", "running_var": "ra_var",
        "steps": "steps"}
"""Our ``BatchRenorm`` tensors -> sb3-contrib's ``BatchRenorm1d``."""
Layout = dict[str, tuple[list[str], Callable, Callable]]
"""Our tensor name -> (the peer's names, how theirs combine into ours, how ours splits)."""


def _ours_tensors(ours: CrossQ) -> dict[str, torch.Tensor]:
    return {f"{prefix}.{name}": t for prefix, module in (("actor", ours.actor),
                                                         ("critic", ours.critic))
            for name, t in [*module.named_parameters(), *module.named_buffers()]}


def _peer_tensors(peer: PeerCrossQ) -> dict[str, torch.Tensor]:
    return dict([*peer.policy.named_parameters(), *peer.policy.named_buffers()])


def _crossq_layout(ours: CrossQ, peer: PeerCrossQ) -> Layout:
    """Our actor's output layer is the peer's ``mu`` and ``log_std`` layers stacked; our
    critics one ensemble (linear weights [E, in, out], everything else [E, 1, H]), the peer's
    ``qf0``, ``qf1`` separate ``nn.Sequential``s."""
    layout: Layout = {}
    last = 3 * len(ACTOR_HIDDEN) + 1
    for name in _ours_tensors(ours):
        part, _, rest = name.partition(".net.")
        index, kind = int(rest.split(".")[0]), rest.split(".")[1]
        norm = isinstance(getattr(ours, part).net[index], BatchRenorm)
        peer_kind = _BRN[kind] if norm else kind
        qf = [f"critic.qf{e}.{index}.{peer_kind}" for e in range(CRITICS)]
        if part == "actor" and index == last:
            layout[name] = ([f"actor.mu.{kind}", f"actor.log_std.{kind}"], torch.cat,
                            lambda t: list(t.chunk(2)))
        elif part == "actor":
            layout[name] = ([f"actor.latent_pi.{index}.{peer_kind}"], lambda ts: ts[0],
                            lambda t: [t])
        elif kind == "steps":
            layout[name] = (qf, lambda ts: ts[0], lambda t: [t] * CRITICS)
        elif not norm and kind == "weight":
            layout[name] = (qf, lambda ts: torch.stack([t.T for t in ts]),
                            lambda t: [m.T for m in t.unbind(0)])
        else:
            layout[name] = (qf, lambda ts: torch.stack(ts)[:, None],
                            lambda t: [m[0] for m in t.unbind(0)])
    covered = {n for names, _, _ in layout.values() for n in names}
    assert covered == set(_peer_tensors(peer)), covered ^ set(_peer_tensors(peer))
    return layout


def _build_crossq() -> tuple[CrossQ, PeerCrossQ, Layout]:
    """Tanh networks: with ReLU a unit active on every sample of a batch gives its bias a
    gradient that is zero up to rounding (normalization removes any shift), which Adam turns
    into a step of lr * rounding / eps; the two sides' rounding then differ by 1e-10 after one
    update and by 1e-8 after six."""
    lr, gamma, momentum, eps = 3e-3, 0.97, 0.01, 1e-3
    torch.manual_seed(0)
    cfg = CrossQConfig(
        batch_size=BATCH, buffer_size=BATCH, learning_starts=0, gamma=gamma, actor_lr=lr,
        critic_lr=lr, alpha_lr=lr, actor_update_interval=DELAY, num_critics=CRITICS,
        actor_hidden=ACTOR_HIDDEN, critic_hidden=CRITIC_HIDDEN, activation="tanh",
        init_alpha=1.0, autotune_alpha=True, adam_beta1=0.5, alpha_adam_beta1=0.9,
        renorm_momentum=momentum, renorm_eps=eps, renorm_warmup=PEER_WARMUP + 1,
        renorm_variant="sb3_contrib", squash_epsilon=1e-6)
    ours = CrossQ(Q_OBS, -torch.ones(Q_ACT), torch.ones(Q_ACT), 1, cfg, seed=1)
    peer = PeerCrossQ(
        "MlpPolicy", DummyVecEnv([lambda: _Spaces(Q_OBS, Q_ACT)]), learning_rate=lr,
        buffer_size=BATCH, learning_starts=0, batch_size=BATCH, gamma=gamma,
        policy_delay=DELAY, ent_coef="auto", target_entropy="auto", device="cpu", seed=0,
        policy_kwargs={"net_arch": {"pi": list(ACTOR_HIDDEN), "qf": list(CRITIC_HIDDEN)},
                       "activation_fn": nn.Tanh, "n_critics": CRITICS,
                       "batch_norm_momentum": momentum, "batch_norm_eps": eps,
                       "renorm_warmup_steps": PEER_WARMUP})
    peer.set_logger(Logger(folder=None, output_formats=[]))
    peer.policy.double()  # the same Parameter objects, which its optimizers hold
    layout = _crossq_layout(ours, peer)
    theirs = _peer_tensors(peer)
    with torch.no_grad():
        for name, tensor in _ours_tensors(ours).items():
            peer_names, combine, split = layout[name]
            assert combine([theirs[n] for n in peer_names]).shape == tensor.shape, name
            if not name.endswith(".steps"):
                for n, part in zip(peer_names, split(tensor), strict=True):
                    theirs[n].copy_(part)
    return ours, peer, layout


def _crossq_batch(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Transitions whose observation columns drive Batch Renormalization's corrections past
    their bounds (a mean far from the running one: d clipped; a tight column: r below 1/3; a
    wide one: r above 3) and keep others inside them."""
    scale, shift = torch.tensor([1.0, 0.2, 5.0, 1.0]), torch.tensor([0.0, 8.0, 0.0, -1.0])
    obs = torch.randn(BATCH, Q_OBS, generator=gen) * scale + shift
    return {"obs": obs, "action": torch.rand(BATCH, Q_ACT, generator=gen) * 1.98 - 0.99,
            "reward": torch.randn(BATCH, generator=gen),
            "next_obs": obs + 0.3 * torch.randn(BATCH, Q_OBS, generator=gen) * scale,
            "terminated": torch.rand(BATCH, generator=gen) < 0.15,
            "truncated": torch.zeros(BATCH, dtype=torch.bool)}


def _watch_corrections(peer: PeerCrossQ) -> dict[str, set[str]]:
    """The regimes of r and d the peer's renormalizing forwards meet, per network (from each
    layer's input and running statistics before the forward)."""
    seen: dict[str, set[str]] = {"critic": set(), "actor": set()}

    def watch(part: str) -> Callable:
        def hook(layer: BatchRenorm1d, args: tuple[torch.Tensor, ...]) -> None:
            if not layer.training or not layer.steps > layer.warmup_steps:
                return
            x, running_std = args[0].detach(), (layer.ra_var + layer.eps).sqrt()
            r = (x.var(0) + layer.eps).sqrt() / running_std
            d = ((x.mean(0) - layer.ra_mean) / running_std).abs()
            regimes = {"r low": r < 1 / layer.rmax, "r high": r > layer.rmax,
                       "r inside": (r > 1 / layer.rmax) & (r < layer.rmax),
                       "d clipped": d > layer.dmax, "d inside": d < layer.dmax}
            seen[part] |= {label for label, hit in regimes.items() if bool(hit.any())}
        return hook

    for part in seen:
        for layer in getattr(peer, part).modules():
            if isinstance(layer, BatchRenorm1d):
                layer.register_forward_pre_hook(watch(part))
    return seen


def test_crossq_matches_sb3_contrib(close: Callable[..., float],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """K updates of CrossQ against ``sb3_contrib.CrossQ`` on the same batches and actor noise:
    the critic (joint (s, a) / (s', a') batch), actor and temperature losses, every gradient
    each optimizer steps on, and after each update every parameter, Batch Renormalization
    statistic and step count, Adam moment and log(alpha). The policy delay, the plain warm-up
    forwards, the renormalization and its r/d clipping (both regimes of each) are exercised."""
    ours, peer, layout = _build_crossq()
    # the actor's noise: ours draws it from its generator (recorded), the peer gets the same
    noise: list[torch.Tensor] = []

    def recorded_randn(*args: Any, **kwargs: Any) -> torch.Tensor:
        noise.append(torch.randn(*args, **kwargs))
        return noise[-1].clone()

    def injected(shape: Any, dtype: torch.dtype, device: Any) -> torch.Tensor:
        assert noise and tuple(noise[0].shape) == tuple(shape) and noise[0].dtype == dtype
        return noise.pop(0)

    monkeypatch.setattr(our_squashed, "torch", _Proxy(torch, randn=recorded_randn))
    monkeypatch.setattr(torch_normal, "_standard_normal", injected)
    # the batch: both replay buffers' sample return it (ours needs rows to sample from)
    batch: dict[str, torch.Tensor] = {}
    rows = _crossq_batch(torch.Generator().manual_seed(0))
    ours.buffer.add(*(rows[k].float() for k in ("obs", "action", "reward", "next_obs")),
                    rows["terminated"], rows["truncated"])
    monkeypatch.setattr(ours.buffer, "sample", lambda size, generator: dict(batch))
    monkeypatch.setattr(peer.replay_buffer, "sample", lambda size, env=None: ReplayBufferSamples(
        batch["obs"], batch["action"], batch["next_obs"], batch["terminated"][:, None].double(),
        batch["reward"][:, None]))
    # the gradients each optimizer steps on
    ours_params = {**{n: t for n, t in _ours_tensors(ours).items() if t.requires_grad},
                   "log_alpha": ours.log_alpha}
    peer_params = {**dict(peer.policy.named_parameters()), "log_alpha": peer.log_ent_coef}
    optimizers = {"critic": (ours.critic_opt, peer.critic.optimizer),
                  "actor": (ours.actor_opt, peer.actor.optimizer),
                  "alpha": (ours.alpha_opt, peer.ent_coef_optimizer)}
    grads: dict[tuple[str, str], list[dict[str, torch.Tensor]]] = {}

    def record(key: tuple[str, str], named: dict[str, torch.Tensor]) -> Callable:
        def hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            stepped = {id(p) for group in opt.param_groups for p in group["params"]}
            grads.setdefault(key, []).append({n: p.grad.clone() for n, p in named.items()
                                              if id(p) in stepped})
        return hook

    for key, (o, p) in optimizers.items():
        o.register_step_pre_hook(record((key, "ours"), ours_params))
        p.register_step_pre_hook(record((key, "peer"), peer_params))

    def theirs_of(name: str, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        if name == "log_alpha":
            return tensors["log_alpha"].reshape(())
        names, combine, _ = layout[name]
        return combine([tensors[n] for n in names])

    regimes = _watch_corrections(peer)
    check, gen = _Checker(close), torch.Generator().manual_seed(3)
    for k in range(1, CROSSQ_K + 1):
        what, actor_step = f"update {k}", k % DELAY == 0
        batch.update(_crossq_batch(gen))
        grads.clear()
        peer.logger.name_to_value.clear()
        ours.owed_updates += 1
        metrics = ours.update()
        drawn = len(noise)
        peer.train(gradient_steps=1, batch_size=BATCH)
        logged = dict(peer.logger.name_to_value)
        assert drawn == 1 + actor_step and not noise, f"{what}: noise drawn {drawn}, left {noise}"
        check("losses", metrics["loss/critic"], logged["train/critic_loss"], f"{what}: critic")
        check("losses", metrics["train/alpha"], logged["train/ent_coef"], f"{what}: alpha")
        assert ("loss/actor" in metrics) == ("train/actor_loss" in logged) == actor_step, what
        if actor_step:
            check("losses", metrics["loss/actor"], logged["train/actor_loss"], f"{what}: actor")
            check("losses", metrics["loss/alpha"], logged["train/ent_coef_loss"],
                  f"{what}: temperature")
        for key in optimizers:
            steps_o, steps_p = grads.get((key, "ours"), []), grads.get((key, "peer"), [])
            assert len(steps_o) == len(steps_p) == int(key == "critic" or actor_step), what
            for g_o, g_p in zip(steps_o, steps_p, strict=True):
                for n, g in g_o.items():
                    check("gradients", g, theirs_of(n, g_p), f"{what}: {key} gradient of {n}")
        theirs = _peer_tensors(peer)
        for n, t in _ours_tensors(ours).items():
            if n.endswith(".steps"):
                assert {int(theirs[m]) for m in layout[n][0]} == {int(t)}, f"{what}: {n}"
            else:
                kind = "statistics" if ".running_" in n else "parameters"
                check(kind, t, theirs_of(n, theirs), f"{what}: {n}")
        check("parameters", ours.log_alpha, peer.log_ent_coef[0], f"{what}: log alpha")
        for key, (o, p) in optimizers.items():
            for n, param in ours_params.items():
                if not o.state.get(param):
                    continue
                names = ["log_alpha"] if n == "log_alpha" else layout[n][0]
                states = [p.state[peer_params[m]] for m in names]
                assert {float(s["step"]) for s in states} == {float(o.state[param]["step"])}
                for moment in ("exp_avg", "exp_avg_sq"):
                    check("Adam", o.state[param][moment],
                          theirs_of(n, {m: s[moment] for m, s in zip(names, states,
                                                                     strict=True)}),
                          f"{what}: {key} Adam {moment} of {n}")
    assert int(ours.actor.net[0].steps) == CROSSQ_K // DELAY
    assert int(ours.critic.net[0].steps) == CROSSQ_K
    full = {"r low", "r high", "r inside", "d clipped", "d inside"}
    assert regimes == {"critic": full, "actor": full}, regimes
    check.report("CrossQ")
