"""PPO and its GAE against Stable-Baselines3 (``stable_baselines3.PPO``), update for update.

Both learners get the same initial weights (ours copied into SB3's ``MlpPolicy``), the same
rollout (collected by ours' ``act``/``process_env_step``; SB3's buffer gets the equivalent
inputs, as its ``collect_rollouts`` would have built them) and the same minibatch order (ours'
shuffles, injected into SB3's ``RolloutBuffer.get``). Compared in float64 after every one of
K = 12 minibatch updates (3 epochs x 4 minibatches): the normalized advantages, policy, value,
entropy and total loss, clip fraction, approx-KL, gradient norm, gradients after clipping,
parameters and Adam's moments and step count.

What SB3 does that ours does differently, set to SB3's side here:
* advantages standardized per minibatch (``normalize_advantages_per_minibatch``);
* clip fraction = share of ratios outside the clip range (``clipfrac_outside_range``);
* value loss = the MSE where ours is half of it: ``value_coef = 2 * vf_coef`` (and ours'
  ``loss/value`` is compared at twice its value);
* fixed learning rate (``lr_schedule="fixed"``), no value clipping (SB3's default
  ``clip_range_vf=None``; SB3's clipped variant, the loss of the clipped prediction alone, is
  not one ours offers), no observation or reward normalization (``VecNormalize`` is separate).
Adam's eps (1e-5), the free log std, the global gradient-norm clip and the k3 approx-KL are
the same on both sides. Truncation: SB3 adds gamma * V(terminal_observation) to the reward of a
truncated step and cuts the recursion; ours keeps V(final_obs) as that step's bootstrap value.

To run SB3 in float64 (its buffers allocate float32, cast sampled actions to float32 and its
policy casts observations with ``.float()``) the test gives ``stable_baselines3.common.buffers``
a numpy whose ``float32`` is float64 and SB3's policies a ``preprocess_obs`` that keeps the dtype.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

sb3 = pytest.importorskip("stable_baselines3", reason="pip install stable-baselines3==2.9.2")
gym = pytest.importorskip("gymnasium", reason="pip install gymnasium")

from stable_baselines3.common import buffers as sb3_buffers  # noqa: E402
from stable_baselines3.common import policies as sb3_policies  # noqa: E402
from stable_baselines3.common.logger import Logger  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

from robotrl.algos.ppo import PPO, PPOConfig  # noqa: E402

OBS, ACT, ENVS, STEPS = 5, 3, 4, 8
EPOCHS, MINIBATCHES = 3, 4
GAMMA, LAM, CLIP, ENT, VF, MAX_NORM, LR = 0.97, 0.9, 0.2, 0.01, 0.5, 2.0, 3e-3
HIDDEN = (16, 16)

NAMES = {
    "log_std": "log_std",
    "actor_head.0.weight": "mlp_extractor.policy_net.0.weight",
    "actor_head.0.bias": "mlp_extractor.policy_net.0.bias",
    "actor_head.2.weight": "mlp_extractor.policy_net.2.weight",
    "actor_head.2.bias": "mlp_extractor.policy_net.2.bias",
    "actor_head.4.weight": "action_net.weight",
    "actor_head.4.bias": "action_net.bias",
    "critic_head.0.weight": "mlp_extractor.value_net.0.weight",
    "critic_head.0.bias": "mlp_extractor.value_net.0.bias",
    "critic_head.2.weight": "mlp_extractor.value_net.2.weight",
    "critic_head.2.bias": "mlp_extractor.value_net.2.bias",
    "critic_head.4.weight": "value_net.weight",
    "critic_head.4.bias": "value_net.bias",
}
"""Our parameter -> SB3's ``ActorCriticPolicy`` parameter."""


class _Spaces(gym.Env):
    """Only the spaces SB3 builds its policy and buffer from; the test feeds the data."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float64)
    action_space = gym.spaces.Box(-1.0, 1.0, (ACT,), np.float64)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        return np.zeros(OBS), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(OBS), 0.0, False, False, {}


class _Float64Numpy:
    """numpy for SB3's buffers module: ``float32`` is float64 and ``random.permutation``
    returns the injected shuffles, one per ``RolloutBuffer.get`` (one per epoch)."""

    float32 = np.float64

    def __init__(self) -> None:
        self.perms: Iterator[np.ndarray] = iter(())
        self.random = SimpleNamespace(permutation=self._permutation)

    def _permutation(self, n: int) -> np.ndarray:
        perm = next(self.perms)
        assert len(perm) == n
        return perm

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)


def _ours_cfg() -> PPOConfig:
    return PPOConfig(
        rollout_steps=STEPS, num_epochs=EPOCHS, num_minibatches=MINIBATCHES, gamma=GAMMA,
        gae_lambda=LAM, clip_low=CLIP, clip_high=CLIP, value_clip=0.0, value_coef=2 * VF,
        entropy_coef=ENT, max_grad_norm=MAX_NORM, learning_rate=LR, lr_schedule="fixed",
        actor_hidden=HIDDEN, critic_hidden=HIDDEN, activation="tanh", normalize_obs=False,
        reward_scaling=False, normalize_advantages=True,
        normalize_advantages_per_minibatch=True, clipfrac_outside_range=True,
    )


def _build(monkeypatch: pytest.MonkeyPatch) -> tuple[PPO, Any, _Float64Numpy]:
    """Ours and SB3's PPO with the same hyperparameters and ours' initial weights in both."""
    fake_np = _Float64Numpy()
    monkeypatch.setattr(sb3_buffers, "np", fake_np)
    monkeypatch.setattr(sb3_policies, "preprocess_obs",
                        lambda obs, space, normalize_images=True: obs)
    torch.manual_seed(0)
    ours = PPO(OBS, -torch.ones(ACT), torch.ones(ACT), ENVS, _ours_cfg(), seed=1)
    with torch.no_grad():  # a std that is not 1, different per dimension
        ours.policy.log_std.copy_(torch.tensor([-0.4, 0.1, 0.3]))
    venv = DummyVecEnv([_Spaces] * ENVS)
    theirs = sb3.PPO(
        "MlpPolicy", venv, learning_rate=LR, n_steps=STEPS, batch_size=STEPS * ENVS // MINIBATCHES,
        n_epochs=EPOCHS, gamma=GAMMA, gae_lambda=LAM, clip_range=CLIP, clip_range_vf=None,
        normalize_advantage=True, ent_coef=ENT, vf_coef=VF, max_grad_norm=MAX_NORM,
        policy_kwargs={"net_arch": {"pi": list(HIDDEN), "vf": list(HIDDEN)},
                       "activation_fn": torch.nn.Tanh},
        device="cpu", seed=0,
    )
    theirs.set_logger(Logger(folder=None, output_formats=[]))
    sb3_params = dict(theirs.policy.named_parameters())
    assert set(sb3_params) == set(NAMES.values())
    with torch.no_grad():
        for name, p in ours.policy.named_parameters():
            assert sb3_params[NAMES[name]].dtype == torch.float64
            sb3_params[NAMES[name]].copy_(p)
    return ours, theirs, fake_np


def _collect(ours: PPO, theirs: Any) -> dict[str, torch.Tensor]:
    """One rollout through ours' ``act``/``process_env_step``/``compute_returns``, and the
    inputs SB3's ``collect_rollouts`` would give its buffer for the same steps: the reward of a
    step truncated (and not terminated) plus gamma * V(terminal observation), episode starts
    = the previous step's done, then ``compute_returns_and_advantage``."""
    gen = torch.Generator().manual_seed(7)
    buf, policy = theirs.rollout_buffer, theirs.policy
    buf.reset()
    done = torch.ones(ENVS, dtype=torch.bool)
    truncations = 0
    for t in range(STEPS):
        obs = torch.randn(ENVS, OBS, generator=gen)
        ours.act(obs)
        reward = torch.randn(ENVS, generator=gen)
        terminated = torch.rand(ENVS, generator=gen) < 0.15
        truncated = torch.rand(ENVS, generator=gen) < 0.2  # some rows both: termination wins
        final_obs = torch.randn(ENVS, OBS, generator=gen)
        ours.process_env_step(reward, terminated, truncated, final_obs)
        action = ours.buffer.action[t]
        with torch.no_grad():
            value, log_prob, _ = policy.evaluate_actions(obs, action)
            timeout = truncated & ~terminated  # Gymnasium's TimeLimit.truncated in SB3's infos
            sb3_reward = reward + GAMMA * policy.predict_values(final_obs).flatten() * timeout
        truncations += int(timeout.sum())
        buf.add(obs.numpy(), action.numpy(), sb3_reward.numpy(), done.numpy(), value, log_prob)
        done = terminated | truncated
    assert truncations > 0 and int(ours.buffer.terminated.sum()) > 0
    last_obs = torch.randn(ENVS, OBS, generator=gen)
    ours.compute_returns(last_obs)
    with torch.no_grad():
        buf.compute_returns_and_advantage(policy.predict_values(last_obs), done.numpy())
    return {"value": torch.from_numpy(buf.values), "log_prob": torch.from_numpy(buf.log_probs),
            "advantages": torch.from_numpy(buf.advantages),
            "returns": torch.from_numpy(buf.returns)}


def test_gae_with_termination_and_truncation_matches_sb3(
        monkeypatch: pytest.MonkeyPatch, close: Callable[..., float]) -> None:
    ours, theirs, _ = _build(monkeypatch)
    sb3_rollout = _collect(ours, theirs)
    buf = ours.buffer
    close(buf.value, sb3_rollout["value"], "V(obs) at collection")
    close(buf.log_prob, sb3_rollout["log_prob"], "log pi(a|s) at collection")
    rel = close(buf.advantages, sb3_rollout["advantages"], "GAE advantages")
    rel = max(rel, close(buf.returns, sb3_rollout["returns"], "TD(lambda) returns"))
    print(f"\nGAE vs SB3: largest relative difference {rel:.2e}")


def _record_theirs(theirs: Any, monkeypatch: pytest.MonkeyPatch,
                   adam_state: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    """Per optimizer step of SB3's ``PPO.train``: its loss terms read from ``train``'s frame
    when it calls ``optimizer.step()``, the norm ``clip_grad_norm_`` returned, the clipped
    gradients, then the parameters and Adam's state after the step."""
    steps: list[dict[str, Any]] = []
    optimizer = theirs.policy.optimizer
    optimizer_step, clip = optimizer.step, torch.nn.utils.clip_grad_norm_
    params = dict(theirs.policy.named_parameters())
    norms: list[torch.Tensor] = []

    def recording_clip(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> Any:
        norms.append(clip(parameters, max_norm, *args, **kwargs).clone())
        return norms[-1]

    def recording_step() -> None:
        frame = sys._getframe(1).f_locals  # PPO.train
        step = {
            "advantages": frame["advantages"].clone(),
            "loss/policy": frame["policy_loss"].detach(),
            "loss/value": frame["value_loss"].detach(),
            "loss/entropy": frame["entropy_loss"].detach(),
            "loss/total": frame["loss"].detach(),
            "train/kl": float(frame["approx_kl_div"]),
            "train/clipfrac": frame["clip_fraction"],
            "grad_norm": norms[-1],
            "grads": {n: p.grad.clone() for n, p in params.items()},
            "lr": optimizer.param_groups[0]["lr"],
        }
        optimizer_step()
        steps.append({**step, **adam_state(optimizer, params, "log_std")})

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording_clip)
    monkeypatch.setattr(optimizer, "step", recording_step)
    return steps


def test_ppo_update_matches_sb3(monkeypatch: pytest.MonkeyPatch, close: Callable[..., float],
                                record_ppo: Callable[..., list],
                                peer_adam: Callable[..., dict[str, Any]]) -> None:
    ours, theirs, fake_np = _build(monkeypatch)
    _collect(ours, theirs)
    buf, sb3_buf = ours.buffer, theirs.rollout_buffer
    # the same buffer content: SB3's values, log-probs, advantages and returns are ours
    for ours_key, sb3_key in (("value", "values"), ("log_prob", "log_probs"),
                              ("advantages", "advantages"), ("returns", "returns")):
        setattr(sb3_buf, sb3_key, getattr(buf, ours_key).numpy().copy())
    # ours' shuffles (drawn by buffer.minibatches from ours' generator, one per epoch), in SB3's
    # flattening: ours flattens [T, N] to t * N + n, SB3's swap_and_flatten to n * T + t
    gen = torch.Generator()
    gen.set_state(ours.generator.get_state())
    total = STEPS * ENVS
    perms = [torch.randperm(total, generator=gen) for _ in range(EPOCHS)]
    fake_np.perms = iter([((p % ENVS) * STEPS + p // ENVS).numpy() for p in perms])

    with monkeypatch.context() as patch:
        mine = record_ppo(ours, patch, NAMES.__getitem__)
        metrics = ours.update()
    with monkeypatch.context() as patch:
        theirs_steps = _record_theirs(theirs, patch, peer_adam)
        theirs.train()
    assert len(mine) == len(theirs_steps) == EPOCHS * MINIBATCHES

    worst: dict[str, float] = {}
    for k, (a, b) in enumerate(zip(mine, theirs_steps, strict=True)):
        a = {**a, "loss/value": 2 * a["loss/value"]}  # ours: half the MSE
        for key in ("advantages", "loss/policy", "loss/value", "loss/entropy", "loss/total",
                    "train/kl", "train/clipfrac", "grad_norm", "lr", "grads", "params",
                    "exp_avg", "exp_avg_sq", "step"):
            rel = close(a[key], b[key], f"update {k}: {key}")
            worst[key] = max(worst.get(key, 0.0), rel)
    sb3_logged = theirs.logger.name_to_value
    close(metrics["train/explained_variance"], sb3_logged["train/explained_variance"],
          "explained variance")
    # the comparison exercised what it claims: clipped ratios and clipped gradient norms
    assert any(0 < s["train/clipfrac"] < 1 for s in theirs_steps)
    norms = [float(s["grad_norm"]) for s in theirs_steps]
    assert min(norms) < MAX_NORM < max(norms), norms
    print("\nPPO vs SB3, largest relative difference over 12 updates:")
    for key, rel in worst.items():
        print(f"  {key:16s} {rel:.2e}")
