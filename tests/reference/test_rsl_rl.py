"""PPO against RSL-RL's (``rsl-rl-lib`` 5.5.1, ``rsl_rl.algorithms.PPO``), update for update.

Both learners get the same initial weights (ours copied into RSL-RL's actor and critic
``MLPModel``), collect the same rollout through their own ``act``/``process_env_step``/
``compute_returns`` (RSL-RL's Gaussian sampling patched to return the actions ours drew) and
see the same minibatches (ours' shuffles injected into RSL-RL's storage). Compared in float64
after every one of K = 6 minibatch updates (3 epochs x 2 minibatches): the surrogate, value
(clipped) and entropy terms, the total loss, the closed-form KL, the learning rate the adaptive
schedule set, the gradient norm, the gradients after clipping, the parameters and Adam's
moments and step count; before them the stored values, log-probabilities, returns and
normalized advantages.

What RSL-RL does that ours does differently, set to RSL-RL's side here:
* the adaptive lr reads the closed-form Gaussian KL (``kl_estimator="gaussian"``);
* the actor's and the critic's gradient norms are clipped separately
  (``clip_grad_per_network``);
* Adam's eps is torch's 1e-8 (``adam_eps``);
* the value loss is the squared error where ours is half of it: ``value_coef = 2 *
  value_loss_coef`` (ours' ``loss/value`` compared at twice its value); the value clip is
  RSL-RL's ``clip_param`` (``value_clip = clip``);
* RSL-RL's std is parameterized in log space here (``std_type="log"``, ours' only one);
* a time-out bootstraps with gamma * V(obs_t), the value of the step's own observation, where
  ours uses V(final_obs): ours is handed final_obs = obs_t, the equivalent input;
* RSL-RL shuffles once for all epochs, ours once per epoch: its minibatch generator is run one
  epoch at a time, each with ours' shuffle of that epoch;
* no observation normalization, no reward scaling (RSL-RL has none).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

pytest.importorskip("rsl_rl", reason="pip install rsl-rl-lib==5.5.1")
from rsl_rl.algorithms import PPO as RslPPO  # noqa: E402
from rsl_rl.models import MLPModel  # noqa: E402
from rsl_rl.storage import RolloutStorage  # noqa: E402
from rsl_rl.storage import rollout_storage as rsl_storage_module  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from robotrl.algos.ppo import PPO, PPOConfig  # noqa: E402

OBS, ACT, ENVS, STEPS = 5, 3, 6, 8
EPOCHS, MINIBATCHES = 3, 2
GAMMA, LAM = 0.96875, 0.9375
"""Exact in float32: RSL-RL's GAE multiplies them into ``1.0 - dones.float()``, a float32 mask,
so a gamma that float32 rounds (0.97, 0.99) would be rounded there and nowhere else."""
CLIP, ENT, VALUE_COEF, MAX_NORM = 0.2, 0.01, 1.0, 1.6
LR, DESIRED_KL = 3e-3, 0.004
HIDDEN = (16, 16)


def _rsl_name(ours: str) -> str:
    """Our parameter name -> RSL-RL's, prefixed ``actor.`` or ``critic.``."""
    if ours == "log_std":
        return "actor.distribution.log_std_param"
    head, rest = ours.split(".", 1)
    return f"{'actor' if head == 'actor_head' else 'critic'}.mlp.{rest}"


class _TorchWithShuffles:
    """``torch`` for RSL-RL's storage module: ``randperm`` returns the injected shuffles."""

    def __init__(self, perms: list[torch.Tensor]) -> None:
        self.perms = iter(perms)

    def randperm(self, n: int, **kwargs: Any) -> torch.Tensor:
        perm = next(self.perms)
        assert len(perm) == n
        return perm

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def _build(monkeypatch: pytest.MonkeyPatch) -> tuple[PPO, RslPPO]:
    # RSL-RL's GaussianDistribution turns argument validation off for every Normal; undone after
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args",
                        torch.distributions.Distribution._validate_args)
    torch.manual_seed(0)
    cfg = PPOConfig(
        rollout_steps=STEPS, num_epochs=EPOCHS, num_minibatches=MINIBATCHES, gamma=GAMMA,
        gae_lambda=LAM, clip_low=CLIP, clip_high=CLIP, value_clip=CLIP,
        value_coef=2 * VALUE_COEF, entropy_coef=ENT, max_grad_norm=MAX_NORM, learning_rate=LR,
        lr_schedule="adaptive", desired_kl=DESIRED_KL, actor_hidden=HIDDEN,
        critic_hidden=HIDDEN, activation="elu", normalize_obs=False, reward_scaling=False,
        normalize_advantages=True, kl_estimator="gaussian", clip_grad_per_network=True,
        adam_eps=1e-8,
    )
    ours = PPO(OBS, -torch.ones(ACT), torch.ones(ACT), ENVS, cfg, seed=1)
    with torch.no_grad():  # a std that is not 1, different per dimension
        ours.policy.log_std.copy_(torch.tensor([-0.4, 0.1, 0.3]))
    obs = TensorDict({"policy": torch.zeros(ENVS, OBS)}, batch_size=[ENVS])
    groups = {"actor": ["policy"], "critic": ["policy"]}
    actor = MLPModel(obs, groups, "actor", ACT, hidden_dims=list(HIDDEN), activation="elu",
                     distribution_cfg={"class_name": "rsl_rl.modules.GaussianDistribution",
                                       "init_std": 1.0, "std_type": "log"})
    critic = MLPModel(obs, groups, "critic", 1, hidden_dims=list(HIDDEN), activation="elu")
    storage = RolloutStorage("rl", ENVS, STEPS, obs, [ACT], "cpu")
    theirs = RslPPO(
        actor, critic, storage, num_learning_epochs=EPOCHS, num_mini_batches=MINIBATCHES,
        clip_param=CLIP, gamma=GAMMA, lam=LAM, value_loss_coef=VALUE_COEF, entropy_coef=ENT,
        learning_rate=LR, max_grad_norm=MAX_NORM, optimizer="adam", use_clipped_value_loss=True,
        schedule="adaptive", desired_kl=DESIRED_KL, normalize_advantage_per_mini_batch=False,
    )
    rsl_params = {f"actor.{n}": p for n, p in actor.named_parameters()}
    rsl_params.update({f"critic.{n}": p for n, p in critic.named_parameters()})
    assert set(rsl_params) == {_rsl_name(n) for n, _ in ours.policy.named_parameters()}
    with torch.no_grad():
        for name, p in ours.policy.named_parameters():
            assert rsl_params[_rsl_name(name)].dtype == torch.float64
            rsl_params[_rsl_name(name)].copy_(p)
    return ours, theirs


def _collect(ours: PPO, theirs: RslPPO, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rollout through both learners' acting and GAE: ours samples, RSL-RL's
    ``GaussianDistribution.sample`` returns ours' action; done = terminated or truncated,
    ``time_outs`` = truncated and not terminated (as Isaac Lab and our benchmark give them)."""
    gen = torch.Generator().manual_seed(7)
    td = lambda x: TensorDict({"policy": x}, batch_size=[ENVS])  # noqa: E731
    distribution = theirs.actor.distribution
    timeouts = 0
    obs = torch.randn(ENVS, OBS, generator=gen)
    for t in range(STEPS):
        ours.act(obs)
        monkeypatch.setattr(distribution, "sample", lambda t=t: ours.buffer.action[t].clone())
        with torch.inference_mode():
            theirs.act(td(obs))
        reward = torch.randn(ENVS, generator=gen)
        terminated = torch.rand(ENVS, generator=gen) < 0.15
        truncated = torch.rand(ENVS, generator=gen) < 0.2  # some rows both: termination wins
        timeout = truncated & ~terminated
        timeouts += int(timeout.sum())
        ours.process_env_step(reward, terminated, truncated, final_obs=obs)
        next_obs = torch.randn(ENVS, OBS, generator=gen)
        with torch.inference_mode():
            theirs.process_env_step(td(next_obs), reward, terminated | truncated,
                                    {"time_outs": timeout})
        obs = next_obs
    assert timeouts > 0 and int(ours.buffer.terminated.sum()) > 0
    ours.compute_returns(obs)
    with torch.inference_mode():
        theirs.compute_returns(td(obs))


def test_rollout_and_gae_match_rsl_rl(monkeypatch: pytest.MonkeyPatch,
                                      close: Callable[..., float]) -> None:
    ours, theirs = _build(monkeypatch)
    _collect(ours, theirs, monkeypatch)
    buf, st = ours.buffer, theirs.storage
    rel = close(buf.action, st.actions, "actions")
    rel = max(rel, close(buf.value, st.values.squeeze(-1), "V(obs) at collection"))
    rel = max(rel, close(buf.log_prob, st.actions_log_prob.squeeze(-1), "log pi(a|s)"))
    rel = max(rel, close(buf.returns, st.returns.squeeze(-1), "TD(lambda) returns"))
    rel = max(rel, close(buf.advantages, (st.returns - st.values).squeeze(-1), "GAE advantages"))
    print(f"\nrollout and GAE vs RSL-RL: largest relative difference {rel:.2e}")


def _record_theirs(theirs: RslPPO, monkeypatch: pytest.MonkeyPatch,
                   adam_state: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    """Per optimizer step of RSL-RL's ``PPO.update``: its loss terms and KL read from
    ``update``'s frame when it calls ``optimizer.step()``, the norms its two
    ``clip_grad_norm_`` calls returned, the lr, the clipped gradients, then the parameters and
    Adam's state after the step."""
    steps: list[dict[str, Any]] = []
    optimizer = theirs.optimizer
    optimizer_step, clip = optimizer.step, torch.nn.utils.clip_grad_norm_
    params = {f"actor.{n}": p for n, p in theirs.actor.named_parameters()}
    params.update({f"critic.{n}": p for n, p in theirs.critic.named_parameters()})
    norms: list[torch.Tensor] = []

    def recording_clip(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> Any:
        norms.append(clip(parameters, max_norm, *args, **kwargs).clone())
        return norms[-1]

    def recording_step() -> None:
        frame = sys._getframe(1).f_locals  # PPO.update
        batch = frame["batch"]
        values, old = frame["values"].detach(), batch.values
        moved = (values - old).abs().squeeze(-1)
        step = {
            "advantages": batch.advantages.squeeze(-1).clone(),
            "loss/policy": frame["surrogate_loss"].detach(),
            "loss/value": frame["value_loss"].detach(),
            "loss/entropy": -frame["entropy"].detach().mean(),
            "loss/total": frame["loss"].detach(),
            "train/kl": frame["kl_mean"].clone(),
            "grad_norm": torch.linalg.vector_norm(torch.stack(norms[-2:])),  # actor, critic
            "clipped_norms": [float(n) > MAX_NORM for n in norms[-2:]],
            "value_clipped": float((moved > CLIP).double().mean()),
            "grads": {n: p.grad.clone() for n, p in params.items()},
            "lr": optimizer.param_groups[0]["lr"],
        }
        optimizer_step()
        steps.append({**step, **adam_state(optimizer, params, "critic.mlp.0.weight")})

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording_clip)
    monkeypatch.setattr(optimizer, "step", recording_step)
    return steps


def test_ppo_update_matches_rsl_rl(monkeypatch: pytest.MonkeyPatch, close: Callable[..., float],
                                   record_ppo: Callable[..., list],
                                   peer_adam: Callable[..., dict[str, Any]]) -> None:
    ours, theirs = _build(monkeypatch)
    _collect(ours, theirs, monkeypatch)
    st = theirs.storage
    # ours' shuffles, one per epoch, drawn as buffer.minibatches draws them from its generator;
    # both flatten [T, N] to t * N + n
    gen = torch.Generator()
    gen.set_state(ours.generator.get_state())
    total = STEPS * ENVS
    perms = [torch.randperm(total, generator=gen) for _ in range(EPOCHS)]
    monkeypatch.setattr(rsl_storage_module, "torch", _TorchWithShuffles(perms))
    one_pass = st.mini_batch_generator

    def per_epoch(num_mini_batches: int, num_epochs: int = 8) -> Any:
        for _ in range(num_epochs):
            yield from one_pass(num_mini_batches, 1)

    monkeypatch.setattr(st, "mini_batch_generator", per_epoch)
    with monkeypatch.context() as patch:
        mine = record_ppo(ours, patch, _rsl_name)
        ours.update()
    with monkeypatch.context() as patch:
        theirs_steps = _record_theirs(theirs, patch, peer_adam)
        theirs.update()
    assert len(mine) == len(theirs_steps) == EPOCHS * MINIBATCHES

    worst: dict[str, float] = {}
    for k, (a, b) in enumerate(zip(mine, theirs_steps, strict=True)):
        a = {**a, "loss/value": 2 * a["loss/value"]}  # ours: half the squared error
        for key in ("advantages", "loss/policy", "loss/value", "loss/entropy", "loss/total",
                    "train/kl", "lr", "grad_norm", "grads", "params", "exp_avg", "exp_avg_sq",
                    "step"):
            rel = close(a[key], b[key], f"update {k}: {key}")
            worst[key] = max(worst.get(key, 0.0), rel)
    # the comparison exercised what it claims: the lr moved both ways, each network's norm was
    # clipped at some step and not at another, the value clip bit
    lrs = [LR] + [s["lr"] for s in theirs_steps]
    moves = [b - a for a, b in zip(lrs[:-1], lrs[1:], strict=True)]
    assert min(moves) < 0 < max(moves), lrs
    for i in range(2):
        assert len({s["clipped_norms"][i] for s in theirs_steps}) == 2, i
    assert any(s["value_clipped"] > 0 for s in theirs_steps)
    # RSL-RL keeps the mean its acting forward computed ([N] rows at a time), ours recomputes
    # the update start's in each minibatch's shape: they differ by a few ulp, which torch's
    # closed-form KL rounds away (0.5 * (1 + t1 - 1 - log 1) with t1 ~ 1e-35), so the first
    # minibatch reads exactly 0 on both sides and the adaptive rule (x1.5 where 0 < KL <
    # desired / 2) keeps the lr there
    assert float(mine[0]["train/kl"]) == float(theirs_steps[0]["train/kl"]) == 0.0
    print("\nPPO vs RSL-RL, largest relative difference over 6 updates:")
    for key, rel in worst.items():
        print(f"  {key:16s} {rel:.2e}")
    print("  lr per update:", ", ".join(f"{lr:.3g}" for lr in lrs[1:]))
