"""SAC and FastTD3 against their references, update for update, in float64.

* ``test_sac_matches_sb3``: our SAC and ``stable_baselines3.SAC`` with the same sizes, the same
  initial actor, critics, target critics and log(alpha), the same replay batches (SB3's
  ``replay_buffer.sample`` returns ours) and the same Gaussian noise (SB3's
  ``Normal.rsample`` draws ours). After each of K updates: critic, actor and temperature
  losses, the alpha used, every gradient, every parameter (targets and log(alpha) included)
  and every Adam moment and step count.
* ``test_fasttd3_td3_parts_match_sb3``: the TD3 parts FastTD3 keeps, against
  ``stable_baselines3.TD3`` (whose critics are scalar, FastTD3's categorical): target policy
  smoothing (the actions fed to the target critics), the delayed actor update (which updates
  step the actor), the actor loss from the critics' expected value, its gradients, the actor
  and its Adam moments, and the Polyak step of the target critics (SB3's ``polyak_update``).
* ``test_fasttd3_matches_rederivation``: FastTD3 against an independent float64
  re-derivation of the FastTD3 authors' update (github.com/younggyoseo/FastTD3,
  ``fast_td3/train.py`` ``update_main``/``update_pol``/``soft_update``, ``fast_td3.py``
  ``DistributionalQNetwork.projection``): the categorical projection of the Bellman target,
  clipped double Q on distributions, the cross-entropy loss, the actor loss, AdamW, the
  target critics; every loss, gradient, parameter and AdamW moment after each of K updates.

Our learners run their real ``update()``; only their replay sampling is replaced by the fixed
batches (so the learner's generator draws nothing but the policy noise, which the test replays
from a copy of the generator and injects into the peer).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from robotrl.algos.fasttd3 import FastTD3, FastTD3Config
from robotrl.algos.sac import SAC, SACConfig

SB3_REASON = "Stable-Baselines3 is not installed: pip install stable-baselines3 gymnasium"
OBS_DIM, ACT_DIM, BATCH, K = 5, 2, 32, 4
LOW, HIGH = (-2.0, -1.0), (2.0, 3.0)
"""Action bounds: both sides store and learn from actions squashed into (-1, 1)."""
LR, GAMMA, TAU = 1e-3, 0.99, 0.1

Tensor = torch.Tensor
View = Callable[[Tensor], Tensor]
"""What to read of a parameter: itself, its gradient, an optimizer moment."""


# ---------------------------------------------------------------------------- shared helpers
def make_batches(seed: int) -> list[dict[str, Tensor]]:
    """K replay batches (float64); some rows terminated, some truncated, some both."""
    g = torch.Generator().manual_seed(seed)

    def normal(*shape: int, scale: float = 1.0) -> Tensor:
        return torch.randn(*shape, generator=g) * scale

    return [{"obs": normal(BATCH, OBS_DIM, scale=2.0),
             "action": torch.rand(BATCH, ACT_DIM, generator=g) * 1.9 - 0.95,
             "reward": normal(BATCH, scale=2.0),
             "next_obs": normal(BATCH, OBS_DIM, scale=2.0),
             "terminated": torch.rand(BATCH, generator=g) < 0.3,
             "truncated": torch.rand(BATCH, generator=g) < 0.3} for _ in range(K)]


def feed(learner: Any, batches: list[dict[str, Tensor]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``learner.buffer.sample`` hand out ``batches`` in order (rows stored too, so the
    learner's "replay holds a batch" guard passes)."""
    learner.buffer.add(**batches[0])
    queue = list(batches)

    def sample(batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        assert batch_size == BATCH
        return queue.pop(0)

    monkeypatch.setattr(learner.buffer, "sample", sample)


def replay_noise(learner: Any, count: int) -> list[Tensor]:
    """The next ``count`` standard normal [BATCH, ACT_DIM] draws of ``learner.generator``
    (from a copy: the learner still draws them itself)."""
    g = torch.Generator()
    g.set_state(learner.generator.get_state())
    return [torch.randn(BATCH, ACT_DIM, generator=g) for _ in range(count)]


class StepRecorder:
    """Snapshots the gradients an optimizer is about to apply (a step pre-hook)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.steps: list[dict[int, Tensor]] = []
        optimizer.register_step_pre_hook(self._record)

    def _record(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        self.steps.append({id(p): p.grad.detach().clone()
                           for group in optimizer.param_groups for p in group["params"]})

    def grad(self, step: int) -> View:
        return lambda p: self.steps[step][id(p)]

    def state(self, key: str) -> View:
        """An optimizer state entry per parameter (the scalar step count spread over the
        parameter's shape, so layouts map it as the moments)."""
        return lambda p: self.optimizer.state[p][key].to(p.dtype).expand_as(p)


def named(module: nn.Module, view: View = lambda p: p) -> dict[str, Tensor]:
    return {name: view(p) for name, p in module.named_parameters()}


Layout = Callable[[View], Any]
"""A network's parameters (or their gradients, moments) in our layout, read through a view."""


def compare_step(close: Callable[..., float], what: str, at: str, step: int,
                 ours: tuple[Layout, StepRecorder], theirs: tuple[Layout, StepRecorder]) -> float:
    """The gradient of optimizer step ``step``, the parameters, and the Adam moments and step
    counts of one network on both sides; returns the largest relative difference."""
    (mine, rec_mine), (peer, rec_peer) = ours, theirs
    worst = max(close(mine(rec_mine.grad(step)), peer(rec_peer.grad(step)),
                      f"{what} gradient at {at}"),
                close(mine(lambda p: p), peer(lambda p: p), f"{what} after {at}"))
    for key in ("exp_avg", "exp_avg_sq", "step"):
        worst = max(worst, close(mine(rec_mine.state(key)), peer(rec_peer.state(key)),
                                 f"{what} Adam {key} after {at}"))
    return worst


def linears(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def ensemble_layout(members: list[list[nn.Linear]], view: View) -> dict[str, Tensor]:
    """Separate per-member Linear layers in ``EnsembleQ``'s layout: ``net.{2j}.weight``
    [E, in, out], ``net.{2j}.bias`` [E, 1, out]."""
    out = {}
    for j in range(len(members[0])):
        out[f"net.{2 * j}.weight"] = torch.stack([view(m[j].weight).T for m in members])
        out[f"net.{2 * j}.bias"] = torch.stack([view(m[j].bias)[None] for m in members])
    return out


@torch.no_grad()
def load_members(members: list[list[nn.Linear]], ensemble: nn.Module) -> None:
    """Copy ``EnsembleQ`` weights into separate Linear layers, member e into ``members[e]``."""
    src = named(ensemble)
    for e, layers in enumerate(members):
        for j, lin in enumerate(layers):
            lin.weight.copy_(src[f"net.{2 * j}.weight"][e].T)
            lin.bias.copy_(src[f"net.{2 * j}.bias"][e, 0])


@torch.no_grad()
def perturb(module: nn.Module, seed: int) -> None:
    """Move the target critics away from the critics, so the Polyak step is visible."""
    g = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.add_(0.1 * torch.randn(p.shape, generator=g))


def _sb3(monkeypatch: pytest.MonkeyPatch) -> None:
    """Import SB3 (or skip) and keep its observations float64: its ``preprocess_obs`` casts
    Box observations with ``.float()`` (float32), which the float64 comparison must not."""
    pytest.importorskip("gymnasium", reason=SB3_REASON)
    pytest.importorskip("stable_baselines3", reason=SB3_REASON)
    from stable_baselines3.common import policies

    monkeypatch.setattr(policies, "preprocess_obs",
                        lambda obs, space, normalize_images=True: obs.to(torch.float64))


def _env() -> Any:
    """A Gymnasium env with our observation size and action bounds (SB3 builds from it)."""
    import gymnasium as gym
    from gymnasium import spaces

    class BoxEnv(gym.Env):
        observation_space = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float64)
        action_space = spaces.Box(np.array(LOW, np.float32), np.array(HIGH, np.float32))

        def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
            return np.zeros(OBS_DIM), {}

        def step(self, action: Any) -> Any:
            return np.zeros(OBS_DIM), 0.0, False, False, {}

    return BoxEnv()


def sb3_samples(batch: dict[str, Tensor]) -> Any:
    """``batch`` as SB3's replay buffer returns it: ``dones`` = done and not a time-out, where
    its VecEnv sets done = terminated or truncated and ``TimeLimit.truncated`` = truncated and
    not terminated (so dones = terminated: truncated rows bootstrap, as ours)."""
    from stable_baselines3.common.type_aliases import ReplayBufferSamples

    done = batch["terminated"] | batch["truncated"]
    timeout = batch["truncated"] & ~batch["terminated"]
    dones = done.double() * (1 - timeout.double())
    return ReplayBufferSamples(batch["obs"], batch["action"], batch["next_obs"], dones[:, None],
                               batch["reward"][:, None])


def sb3_logged(model: Any) -> dict[str, float]:
    """The values SB3's ``train`` logged in its last call (then cleared)."""
    values = dict(model.logger.name_to_value)
    model.logger.dump()
    return values


# ---------------------------------------------------------------------------- SAC
def sb3_sac_actor(actor: Any, view: View) -> dict[str, Tensor]:
    """SB3's SAC actor (latent_pi, mu, log_std) in our ``SquashedGaussianActor`` layout (one
    output layer: the means' rows, then the log stds')."""
    hidden = linears(actor.latent_pi)
    out = {}
    for i, lin in enumerate(hidden):
        out[f"net.{2 * i}.weight"], out[f"net.{2 * i}.bias"] = view(lin.weight), view(lin.bias)
    n = 2 * len(hidden)
    out[f"net.{n}.weight"] = torch.cat([view(actor.mu.weight), view(actor.log_std.weight)])
    out[f"net.{n}.bias"] = torch.cat([view(actor.mu.bias), view(actor.log_std.bias)])
    return out


@torch.no_grad()
def load_sb3_sac_actor(actor: Any, ours: nn.Module) -> None:
    src, hidden = named(ours), linears(actor.latent_pi)
    for i, lin in enumerate(hidden):
        lin.weight.copy_(src[f"net.{2 * i}.weight"])
        lin.bias.copy_(src[f"net.{2 * i}.bias"])
    n = 2 * len(hidden)
    weight, bias = src[f"net.{n}.weight"], src[f"net.{n}.bias"]
    actor.mu.weight.copy_(weight[:ACT_DIM]), actor.mu.bias.copy_(bias[:ACT_DIM])
    actor.log_std.weight.copy_(weight[ACT_DIM:]), actor.log_std.bias.copy_(bias[ACT_DIM:])


def sb3_critic(critic: Any, view: View = lambda p: p) -> dict[str, Tensor]:
    return ensemble_layout([linears(q) for q in critic.q_networks], view)


def test_sac_matches_sb3(close: Callable[..., float], monkeypatch: pytest.MonkeyPatch) -> None:
    _sb3(monkeypatch)
    from stable_baselines3 import SAC as PeerSAC
    from stable_baselines3.common.logger import Logger

    torch.manual_seed(0)
    hidden = (32, 32)
    cfg = SACConfig(batch_size=BATCH, buffer_size=BATCH, learning_starts=0, gamma=GAMMA,
                    tau=TAU, actor_lr=LR, critic_lr=LR, alpha_lr=LR, init_alpha=0.5,
                    actor_hidden=hidden, critic_hidden=hidden,
                    squash_epsilon=1e-6)  # SB3's SquashedDiagGaussianDistribution epsilon
    ours = SAC(OBS_DIM, torch.tensor(LOW), torch.tensor(HIGH), 1, cfg, seed=7)
    perturb(ours.critic_target, seed=3)
    peer = PeerSAC("MlpPolicy", _env(), learning_rate=LR, buffer_size=BATCH, learning_starts=0,
                   batch_size=BATCH, tau=TAU, gamma=GAMMA, ent_coef="auto_0.5",
                   target_entropy="auto", policy_kwargs={"net_arch": list(hidden)},
                   device="cpu")
    peer.set_logger(Logger(None, []))
    load_sb3_sac_actor(peer.actor, ours.actor)
    load_members([linears(q) for q in peer.critic.q_networks], ours.critic)
    load_members([linears(q) for q in peer.critic_target.q_networks], ours.critic_target)
    assert peer.target_entropy == ours.target_entropy == -ACT_DIM
    worst = max(close(named(ours.actor), sb3_sac_actor(peer.actor, lambda p: p), "initial actor"),
                close(named(ours.critic), sb3_critic(peer.critic), "initial critic"),
                close(named(ours.critic_target), sb3_critic(peer.critic_target),
                      "initial target critic"),
                close(ours.log_alpha, peer.log_ent_coef[0], "initial log alpha"))

    batches = make_batches(seed=1)
    feed(ours, batches, monkeypatch)
    peer_batches = [sb3_samples(b) for b in batches]
    monkeypatch.setattr(peer.replay_buffer, "sample",
                        lambda batch_size, env=None: peer_batches.pop(0))
    # ours draws per update the next-action noise, then the actor's; SB3 the actor's first
    noise = replay_noise(ours, 2 * K)
    peer_noise = [z for t in range(K) for z in (noise[2 * t + 1], noise[2 * t])]

    def standard_normal(shape: Any, dtype: torch.dtype, device: Any) -> Tensor:
        z = peer_noise.pop(0)
        assert tuple(shape) == tuple(z.shape) and dtype == z.dtype
        return z.clone()

    monkeypatch.setattr(torch.distributions.normal, "_standard_normal", standard_normal)

    parts: dict[str, tuple[tuple[Layout, StepRecorder], tuple[Layout, StepRecorder]]] = {
        "critic": ((lambda v: named(ours.critic, v), StepRecorder(ours.critic_opt)),
                   (lambda v: sb3_critic(peer.critic, v), StepRecorder(peer.critic.optimizer))),
        "actor": ((lambda v: named(ours.actor, v), StepRecorder(ours.actor_opt)),
                  (lambda v: sb3_sac_actor(peer.actor, v), StepRecorder(peer.actor.optimizer))),
        "log alpha": ((lambda v: v(ours.log_alpha), StepRecorder(ours.alpha_opt)),
                      (lambda v: v(peer.log_ent_coef).reshape(()),
                       StepRecorder(peer.ent_coef_optimizer))),
    }
    for t in range(K):
        ours.owed_updates = 1.0
        metrics = ours.update()
        peer.train(gradient_steps=1, batch_size=BATCH)
        logged = sb3_logged(peer)
        at = f"update {t + 1}"
        for key, peer_key in (("loss/critic", "train/critic_loss"),
                              ("loss/actor", "train/actor_loss"),
                              ("loss/alpha", "train/ent_coef_loss"),
                              ("train/alpha", "train/ent_coef")):
            worst = max(worst, close(metrics[key], logged[peer_key], f"{key} at {at}"))
        for name, (mine, theirs) in parts.items():
            worst = max(worst, compare_step(close, name, at, t, mine, theirs))
        worst = max(worst, close(named(ours.critic_target), sb3_critic(peer.critic_target),
                                 f"target critic after {at}"))
    assert not peer_noise and not peer_batches, "SB3 did not consume the injected noise/batches"
    print(f"\nSAC vs SB3: {K} updates, largest relative difference {worst:.3e}")


# ---------------------------------------------------------------------------- FastTD3
def td3_config(**overrides: Any) -> FastTD3Config:
    fields: dict[str, Any] = dict(
        batch_size=BATCH, buffer_size=BATCH, learning_starts=0, gamma=GAMMA, tau=TAU,
        actor_lr=LR, critic_lr=LR, actor_hidden=(32, 16), critic_hidden=(32, 16, 8),
        num_atoms=21, v_min=-5.0, v_max=5.0,
        policy_noise=0.2, noise_clip=0.3,  # large enough that the clip acts
        init_scale=1.0,  # a saturating tanh: the action clamp acts
        actor_update_interval=2)
    fields.update(overrides)
    return FastTD3Config(**fields)


class _ExpectedValue(nn.Module):
    """Categorical logits [B, K] -> E[Z] [B, 1] on ``support``: a scalar critic SB3 can use."""

    def __init__(self, logits: nn.Module, support: Tensor) -> None:
        super().__init__()
        self.logits = logits
        self.register_buffer("support", support.clone())

    def forward(self, x: Tensor) -> Tensor:
        return (self.logits(x).softmax(-1) * self.support).sum(-1, keepdim=True)


class _InjectNormal(TorchFunctionMode):
    """``Tensor.normal_(mean, std)`` (SB3 TD3's smoothing noise) fills ``mean + std * z`` with
    the next injected standard normal ``z``."""

    def __init__(self, queue: list[Tensor]) -> None:
        super().__init__()
        self.queue = queue

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.normal_:
            tensor, mean, std = args[0], *args[1:3]
            z = self.queue.pop(0)
            assert z.shape == tensor.shape
            return tensor.copy_(z * std + mean)
        return func(*args, **kwargs)


def test_fasttd3_td3_parts_match_sb3(close: Callable[..., float],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """SB3's TD3 critics are scalar and learn by MSE, FastTD3's are categorical and learn by
    cross-entropy (compared with ``test_fasttd3_matches_rederivation``); here the critics are
    frozen on both sides (learning rate 0 ours; SB3's critic optimizer holds none of them) and
    SB3's are our categorical critics read as their expected value, so everything the TD3
    schedule drives can be compared. Both members equal: SB3's actor reads critic 1 alone,
    ours the minimum, equal then. SB3's tau also moves its target actor, which FastTD3 does not
    have (it smooths the live actor); SB3 runs with tau 1, which makes its target actor the
    live actor at every critic update (it copies the actor right after each actor step), and
    our target critics' Polyak step (tau 0.1, every critic update as the FastTD3 authors; SB3
    moves them on actor updates only) is checked against SB3's ``polyak_update``."""
    _sb3(monkeypatch)
    from stable_baselines3 import TD3 as PeerTD3
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.torch_layers import create_mlp
    from stable_baselines3.common.utils import polyak_update

    torch.manual_seed(0)
    cfg = td3_config(normalize_obs=False, weight_decay=0.0, critic_lr=0.0,
                     critic_hidden=(32, 32), actor_hidden=(32, 32))
    ours = FastTD3(OBS_DIM, torch.tensor(LOW), torch.tensor(HIGH), 1, cfg, seed=7)
    with torch.no_grad():  # identical twins: min over the members == member 1
        for p in ours.critic.parameters():
            p[1].copy_(p[0])
    ours.critic_target.load_state_dict(ours.critic.state_dict())
    perturb(ours.critic_target, seed=3)
    peer = PeerTD3("MlpPolicy", _env(), learning_rate=LR, buffer_size=BATCH, learning_starts=0,
                   batch_size=BATCH, tau=1.0, gamma=GAMMA, policy_delay=cfg.actor_update_interval,
                   target_policy_noise=cfg.policy_noise, target_noise_clip=cfg.noise_clip,
                   policy_kwargs={"net_arch": list(cfg.actor_hidden)}, device="cpu")
    peer.set_logger(Logger(None, []))
    for critic in (peer.critic, peer.critic_target):
        nets = [_ExpectedValue(nn.Sequential(*create_mlp(OBS_DIM + ACT_DIM, cfg.num_atoms,
                                                         list(cfg.critic_hidden))),
                               ours.support) for _ in critic.q_networks]
        for e, net in enumerate(nets):
            critic.add_module(f"qf{e}", net)
        critic.q_networks = nets
        load_members([linears(q) for q in nets], ours.critic)
    peer.critic.optimizer = torch.optim.Adam([nn.Parameter(torch.zeros(1))], lr=0.0)
    with torch.no_grad():
        for mine, theirs in ((ours.actor, peer.actor.mu), (ours.actor, peer.actor_target.mu)):
            for a, b in zip(linears(mine), linears(theirs), strict=True):
                b.weight.copy_(a.weight), b.bias.copy_(a.bias)

    def peer_actor(view: View) -> dict[str, Tensor]:
        return {f"{2 * i}.{k}": view(getattr(lin, k))
                for i, lin in enumerate(linears(peer.actor.mu)) for k in ("weight", "bias")}

    worst = close(named(ours.actor), peer_actor(lambda p: p), "initial actor")
    batches = make_batches(seed=1)
    feed(ours, batches, monkeypatch)
    peer_batches = [sb3_samples(b) for b in batches]
    monkeypatch.setattr(peer.replay_buffer, "sample",
                        lambda batch_size, env=None: peer_batches.pop(0))
    noise = replay_noise(ours, K)  # one smoothing draw per update
    target_inputs: dict[str, list[Tensor]] = {"ours": [], "peer": []}
    ours.critic_target.register_forward_pre_hook(
        lambda m, args: target_inputs["ours"].append(args[1].clone()))
    peer.critic_target.register_forward_pre_hook(
        lambda m, args: target_inputs["peer"].append(args[1].clone()))
    rec_ours, rec_peer = StepRecorder(ours.actor_opt), StepRecorder(peer.actor.optimizer)
    expected_target = copy.deepcopy(ours.critic_target)
    actor_steps: dict[str, list[int]] = {"ours": [], "peer": []}
    for t in range(K):
        ours.owed_updates = 1.0
        metrics = ours.update()
        queue = [noise[t]]
        with _InjectNormal(queue):
            peer.train(gradient_steps=1, batch_size=BATCH)
        assert not queue, "SB3 TD3 did not draw the smoothing noise"
        logged = sb3_logged(peer)
        at = f"update {t + 1}"
        worst = max(worst, close(target_inputs["ours"][t], target_inputs["peer"][t],
                                 f"smoothed target action at {at}"))
        for side, rec in (("ours", rec_ours), ("peer", rec_peer)):
            if len(rec.steps) > len(actor_steps[side]):
                actor_steps[side].append(t + 1)
        assert actor_steps["ours"] == actor_steps["peer"], f"actor update schedule at {at}"
        assert ("loss/actor" in metrics) == ("train/actor_loss" in logged), at
        if "loss/actor" in metrics:
            worst = max(worst, close(metrics["loss/actor"], logged["train/actor_loss"],
                                     f"actor loss at {at}"),
                        compare_step(close, "actor", at, len(rec_ours.steps) - 1,
                                     (lambda v: named(ours.actor, v), rec_ours),
                                     (peer_actor, rec_peer)))
        worst = max(worst, close(named(ours.actor), peer_actor(lambda p: p), f"actor after {at}"))
        polyak_update(ours.critic.parameters(), expected_target.parameters(), cfg.tau)
        worst = max(worst, close(named(ours.critic_target), named(expected_target),
                                 f"target critic after {at}"))
    assert actor_steps["ours"] == list(range(2, K + 1, 2))
    assert not peer_batches
    print(f"\nFastTD3 TD3 parts vs SB3 TD3: {K} updates, largest relative difference {worst:.3e}")


# ---------------------------------------------------------------------------- re-derivation
class RefNets(nn.Module):
    """The FastTD3 authors' networks: an MLP actor ending in tanh, two separate categorical
    critics on cat(obs, action); plain ``nn.Linear`` layers (nothing from robotrl)."""

    def __init__(self, cfg: FastTD3Config) -> None:
        super().__init__()

        def mlp(widths: list[int]) -> nn.Sequential:
            layers: list[nn.Module] = []
            for i in range(len(widths) - 1):
                layers += [nn.Linear(widths[i], widths[i + 1]), nn.ReLU()]
            return nn.Sequential(*layers[:-1])

        self.actor = mlp([OBS_DIM, *cfg.actor_hidden, ACT_DIM])
        self.qnet1, self.qnet2 = (mlp([OBS_DIM + ACT_DIM, *cfg.critic_hidden, cfg.num_atoms])
                                  for _ in range(2))

    def policy(self, obs: Tensor) -> Tensor:
        return torch.tanh(self.actor(obs))


def ref_projection(next_dist: Tensor, rewards: Tensor, bootstrap: Tensor, gamma: float,
                   v_min: float, v_max: float, num_atoms: int) -> Tensor:
    """``DistributionalQNetwork.projection`` as the FastTD3 authors write it (floor/ceil
    neighbours, the integer case moved to a neighbour, ``index_add_`` on the flat rows)."""
    support = torch.linspace(v_min, v_max, num_atoms)
    delta_z = (v_max - v_min) / (num_atoms - 1)
    batch_size = rewards.shape[0]
    target_z = (rewards[:, None] + bootstrap[:, None] * gamma * support).clamp(v_min, v_max)
    b = (target_z - v_min) / delta_z
    low, up = torch.floor(b).long(), torch.ceil(b).long()
    is_int = low == up
    low_mask, up_mask = is_int & (low > 0), is_int & (low == 0)
    low = torch.where(low_mask, low - 1, low)
    up = torch.where(up_mask, up + 1, up)
    proj = torch.zeros_like(next_dist)
    offset = (torch.arange(batch_size) * num_atoms)[:, None].expand(batch_size, num_atoms)
    proj.view(-1).index_add_(0, (low + offset).reshape(-1), (next_dist * (up - b)).reshape(-1))
    proj.view(-1).index_add_(0, (up + offset).reshape(-1), (next_dist * (b - low)).reshape(-1))
    return proj


def ref_normalize(x: Tensor, mean: Tensor, var: Tensor, eps: float, clip: float) -> Tensor:
    """Our documented observation normalization (``RunningNormalizer``), from its statistics."""
    return ((x - mean) / (var + eps).sqrt()).clamp(-clip, clip)


def test_fasttd3_matches_rederivation(close: Callable[..., float],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    cfg = td3_config(weight_decay=0.1)
    ours = FastTD3(OBS_DIM, torch.tensor(LOW), torch.tensor(HIGH), 1, cfg, seed=7)
    perturb(ours.critic_target, seed=3)
    assert ours.normalizer is not None
    stats = torch.Generator().manual_seed(5)
    ours.normalizer.update(torch.randn(64, OBS_DIM, generator=stats) * 3 + 1)
    ours.normalizer.clip = 1.0  # some entries clip
    norm = ours.normalizer

    ref, ref_target = RefNets(cfg), RefNets(cfg)
    with torch.no_grad():
        for a, b in zip(linears(ours.actor), linears(ref.actor), strict=True):
            b.weight.copy_(a.weight), b.bias.copy_(a.bias)
    for nets, critic in ((ref, ours.critic), (ref_target, ours.critic_target)):
        load_members([linears(nets.qnet1), linears(nets.qnet2)], critic)
    ref_critic_params = [*ref.qnet1.parameters(), *ref.qnet2.parameters()]
    q_opt = torch.optim.AdamW(ref_critic_params, lr=cfg.critic_lr,
                              weight_decay=cfg.weight_decay, foreach=False)
    pi_opt = torch.optim.AdamW(ref.actor.parameters(), lr=cfg.actor_lr,
                               weight_decay=cfg.weight_decay, foreach=False)

    def ref_critics(nets: RefNets, view: View = lambda p: p) -> dict[str, Tensor]:
        return ensemble_layout([linears(nets.qnet1), linears(nets.qnet2)], view)

    worst = max(close(named(ours.critic), ref_critics(ref), "initial critic"),
                close(named(ours.critic_target), ref_critics(ref_target), "initial target"))
    batches = make_batches(seed=1)
    feed(ours, batches, monkeypatch)
    noise = replay_noise(ours, K)
    critics = ((lambda v: named(ours.critic, v), StepRecorder(ours.critic_opt)),
               (lambda v: ref_critics(ref, v), StepRecorder(q_opt)))
    actors = ((lambda v: named(ours.actor, v), StepRecorder(ours.actor_opt)),
              (lambda v: named(ref.actor, v), StepRecorder(pi_opt)))
    support = torch.linspace(cfg.v_min, cfg.v_max, cfg.num_atoms)
    exercised = dict.fromkeys(("normalizer clip", "noise clip", "action clamp", "support clip",
                               "min picks each member"), False)

    def value(logits: Tensor) -> Tensor:
        return torch.sum(F.softmax(logits, dim=1) * support, dim=1)

    for t in range(K):
        ours.owed_updates = 1.0
        metrics = ours.update()
        at = f"update {t + 1}"
        # ---- the authors' update_main, float64
        data = batches[t]
        obs, next_obs = (ref_normalize(data[k], norm.mean, norm.var, norm.eps, norm.clip)
                         for k in ("obs", "next_obs"))
        # the authors' flags: dones = terminated or truncated (the env auto-resets on both),
        # truncations = time-outs of episodes that did not terminate (MuJoCo Playground's
        # Brax EpisodeWrapper: truncation = time-limit * (1 - done)); bootstrap = not terminated
        dones = data["terminated"] | data["truncated"]
        truncations = data["truncated"] & ~data["terminated"]
        bootstrap = (truncations | ~dones).double()
        with torch.no_grad():
            clipped_noise = noise[t].mul(cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
            next_actions = ref.policy(next_obs) + clipped_noise
            exercised["action clamp"] |= bool((next_actions.abs() > 1).any())
            next_actions = next_actions.clamp(-1.0, 1.0)
            x = torch.cat([next_obs, next_actions], 1)
            proj1, proj2 = (ref_projection(F.softmax(q(x), dim=1), data["reward"], bootstrap,
                                           cfg.gamma, cfg.v_min, cfg.v_max, cfg.num_atoms)
                            for q in (ref_target.qnet1, ref_target.qnet2))
            v1, v2 = (torch.sum(p * support, dim=1) for p in (proj1, proj2))
            target_dist = torch.where(v1[:, None] < v2[:, None], proj1, proj2)
        exercised["normalizer clip"] |= bool((obs.abs() == norm.clip).any())
        exercised["noise clip"] |= bool((noise[t].abs() * cfg.policy_noise > cfg.noise_clip).any())
        z = data["reward"][:, None] + bootstrap[:, None] * cfg.gamma * support
        exercised["support clip"] |= bool(((z < cfg.v_min) | (z > cfg.v_max)).any())
        # (terminated rows tie: both members project onto r alone, the same distribution)
        exercised["min picks each member"] |= bool((v1 < v2).any()) and bool((v1 > v2).any())
        x = torch.cat([obs, data["action"]], 1)
        qf_loss = sum(-torch.sum(target_dist * F.log_softmax(q(x), dim=1), dim=1).mean()
                      for q in (ref.qnet1, ref.qnet2))
        q_opt.zero_grad(set_to_none=True)
        qf_loss.backward()
        q_opt.step()
        worst = max(worst, close(metrics["loss/critic"], qf_loss, f"critic loss at {at}"),
                    compare_step(close, "critic", at, t, *critics))
        # ---- update_pol on the second, fourth, ... update
        assert ("loss/actor" in metrics) == ((t + 1) % cfg.actor_update_interval == 0), at
        if (t + 1) % cfg.actor_update_interval == 0:
            x = torch.cat([obs, ref.policy(obs)], 1)
            actor_loss = -torch.minimum(value(ref.qnet1(x)), value(ref.qnet2(x))).mean()
            pi_opt.zero_grad(set_to_none=True)
            actor_loss.backward()
            pi_opt.step()
            worst = max(worst, close(metrics["loss/actor"], actor_loss, f"actor loss at {at}"),
                        compare_step(close, "actor", at, (t + 1) // cfg.actor_update_interval - 1,
                                     *actors))
        # ---- soft_update(qnet, qnet_target, tau)
        with torch.no_grad():
            src = [p.data for p in (*ref.qnet1.parameters(), *ref.qnet2.parameters())]
            tgt = [p.data for p in (*ref_target.qnet1.parameters(),
                                    *ref_target.qnet2.parameters())]
            torch._foreach_mul_(tgt, 1.0 - cfg.tau)
            torch._foreach_add_(tgt, src, alpha=cfg.tau)
        worst = max(worst, close(named(ours.critic_target), ref_critics(ref_target),
                                 f"target critic after {at}"),
                    close(named(ours.actor), named(ref.actor), f"actor after {at}"))
    assert len(actors[0][1].steps) == len(actors[1][1].steps) == K // cfg.actor_update_interval
    assert all(exercised.values()), f"a branch was not exercised: {exercised}"
    print(f"\nFastTD3 vs re-derivation: {K} updates, largest relative difference {worst:.3e}")
