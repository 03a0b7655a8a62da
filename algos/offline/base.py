"""What every offline learner shares: config fields, the dataset view, the update loop, acting,
export and checkpoints. An algorithm adds its networks and ``_update_once``.

The offline runner calls, in order:

    learner = Algo.build(spec, cfg, ctx)       # networks sized for the task
    learner.attach(dataset)                    # the data: statistics, device copy
    metrics = learner.update(progress)         # cfg.updates_per_iteration gradient updates
    action = learner.act_deterministic(obs)    # evaluation in the simulator

The dataset is viewed once, at ``attach``, as a packed table on the learner's device with
normalized observations, actions scaled to [-1, 1] and the algorithm's reward transform, so a
batch is one indexing op and no update touches the host.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from robotrl.data.dataset import Dataset
from robotrl.nn.actor import DeterministicActor
from robotrl.nn.linear import PRECISIONS, check_precision, precision_autocast
from robotrl.nn.mlp import ACTIVATIONS, mlp
from robotrl.nn.normalizer import RunningNormalizer
from robotrl.optim import GradientStep, summarize_updates
from robotrl.types import Obs, policy_obs

if TYPE_CHECKING:
    from robotrl.types import BuildContext, EnvSpec


@dataclasses.dataclass
class OfflineConfig:
    """Fields every offline algorithm has; defaults are the papers' MuJoCo settings."""

    updates_per_iteration: int = 1000
    """Gradient updates per runner iteration (the checkpoint and eval intervals count
    iterations; ``total_steps`` counts gradient updates for offline algorithms)."""
    batch_size: int = 256
    """Transitions per gradient update."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak rate of target networks."""
    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""
    critic_lr: float = 3e-4
    """Adam learning rate of the critics (and value function)."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of every network."""
    activation: str = "relu"
    """Hidden activation: relu, tanh, elu, silu or gelu."""
    normalize_obs: bool = True
    """Standardize observations by the dataset's mean and std (TD3+BC's state normalization);
    the statistics are baked into exported actors."""
    precision: str = "float32"
    """float32 (the networks' own dtype, float64 in the reference tests), or bf16: the updates
    run under autocast to bfloat16 (hidden layers' products in bfloat16; heads, parameters,
    gradients and Adam's state in float32, ``robotrl.nn.linear.HEAD_MAX_OUT``), about twice
    the products per second on CPUs with AVX512-BF16 or AMX and on GPUs
    (``benchmarks/offline_speed.py``); refused on a CPU without bfloat16 products, where it
    would be about 10x slower (``robotrl.nn.linear.check_precision``)."""

    def __post_init__(self) -> None:
        self.hidden = tuple(int(w) for w in self.hidden)
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.activation!r}; known: "
                             f"{', '.join(ACTIVATIONS)}")
        check_choice("precision", self.precision, PRECISIONS)
        for name in ("updates_per_iteration", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")


def check_choice(name: str, value: str, known: tuple[str, ...]) -> None:
    """Raise naming the known values when a named-variant field holds an unknown one."""
    if value not in known:
        raise ValueError(f"unknown {name} {value!r}; known: {', '.join(known)}")


def check_log_std_range(bounds: Any) -> tuple[float, float]:
    """A (low, high) log-std range as floats; raises unless low < high."""
    low, high = (float(b) for b in bounds)
    if not low < high:
        raise ValueError(f"log_std_range must be (low, high) with low < high, got {bounds}")
    return low, high


class TanhActor(nn.Module):
    """Deterministic policy a = tanh(net(obs)) in [-1, 1]^A (TD3+BC, ReBRAC, BC)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...],
                 activation: str = "relu") -> None:
        super().__init__()
        self.net = mlp(obs_dim, hidden, act_dim, activation, ortho_init=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [B, O] -> action [B, A]."""
        return torch.tanh(self.net(obs))


class GaussianActor(nn.Module):
    """N(tanh(net(obs)), exp(log_std)) with a state-independent log std (IQL's and AWAC's
    policies); the deterministic action is the mean, inside [-1, 1].

    The parameter ``log_std`` [A] (zeros at init) gives the log std through one of two maps into
    ``log_std_range``: clamped (IQL's reference code and CORL; no gradient past the bounds) or,
    with ``sigmoid_log_std``, low + (high - low) sigmoid(log_std) (d3rlpy's ``NormalPolicy``
    with ``use_std_parameter``; starts at the middle of the range).
    """

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...],
                 activation: str = "relu", log_std_range: tuple[float, float] = (-5.0, 2.0),
                 sigmoid_log_std: bool = False) -> None:
        super().__init__()
        self.net = mlp(obs_dim, hidden, act_dim, activation, ortho_init=False)
        self.log_std = nn.Parameter(torch.zeros(act_dim))
        self.log_std_range = (float(log_std_range[0]), float(log_std_range[1]))
        self.sigmoid_log_std = sigmoid_log_std

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The mean action [B, A]."""
        return torch.tanh(self.net(obs))

    def current_log_std(self) -> torch.Tensor:
        """The log std [A] of the distribution (the parameter mapped into the range)."""
        low, high = self.log_std_range
        if self.sigmoid_log_std:
            return low + torch.sigmoid(self.log_std) * (high - low)
        return self.log_std.clamp(low, high)

    def std(self) -> torch.Tensor:
        return self.current_log_std().exp()

    def log_prob(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """log pi(action | obs): [B] for obs [B, O], action [B, A]."""
        log_std = self.current_log_std()
        z = (action - self(obs)) / log_std.exp()
        return (-0.5 * z.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def sample(self, obs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Actions [B, A] drawn from the policy, clipped to [-1, 1]."""
        mean = self(obs)
        noise = torch.randn(mean.shape, device=mean.device, dtype=mean.dtype, generator=generator)
        return (mean + self.std() * noise).clamp(-1.0, 1.0)


class OfflineLearner:
    """The shared part of every offline algorithm; see the module docstring.

    Subclasses set ``NAME``, ``METRIC_KEYS`` (the first two, the main loss and its gradient
    norm, are present on every update and checked for NaN/Inf), build their networks in
    ``__init__`` (registering them in ``self.modules`` and their optimizers in
    ``self.optimizers`` for checkpoints), set ``self.actor`` (obs -> action in [-1, 1]) and
    implement ``_update_once(batch)``.

    Attributes:
        data: the attached dataset view (``None`` before ``attach``).
        normalizer: observation statistics (identity before ``attach`` or when disabled).
        generator: drives batch sampling and every random draw of the updates.
        num_updates: gradient updates done.
    """

    NAME: ClassVar[str] = "offline"
    METRIC_KEYS: ClassVar[tuple[str, ...]] = ()
    NEEDS_NEXT_ACTION: ClassVar[bool] = False
    """Batches carry ``next_action`` [B, A]: the dataset's action at s' (the row's own action
    on an episode's last row, where the data has none)."""

    def __init__(self, obs_dim: int, action_low: torch.Tensor, action_high: torch.Tensor,
                 cfg: OfflineConfig, device: str | torch.device = "cpu",
                 seed: int | None = None) -> None:
        self.cfg = cfg
        self.device = dev = torch.device(device)
        check_precision(dev, cfg.precision)
        self.dtype = torch.get_default_dtype()
        """Floating dtype of the networks and of the attached data (the default dtype at
        construction: float32, or float64 in the reference-equivalence tests)."""
        low = torch.as_tensor(action_low, dtype=self.dtype)
        high = torch.as_tensor(action_high, dtype=self.dtype)
        if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
            raise ValueError(f"{self.NAME} needs finite action bounds (actions live in [-1, 1])")
        self.action_low, self.action_high = low.to(dev), high.to(dev)
        self.center, self.half_range = (high + low).to(dev) / 2, (high - low).to(dev) / 2
        self.obs_dim, self.act_dim = obs_dim, low.numel()
        self.normalizer = RunningNormalizer(obs_dim, eps=1e-6, clip=1e6).to(dev)
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        self.generator = torch.Generator(device=dev)
        self.generator.manual_seed(seed)
        self.data: Dataset | None = None
        self.next_actions: torch.Tensor | None = None
        self.num_updates = 0
        self.modules: dict[str, nn.Module] = {"normalizer": self.normalizer}
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.actor: nn.Module

    @classmethod
    def build(cls, spec: EnvSpec, cfg: Any, ctx: BuildContext) -> OfflineLearner:
        """The learner for a task with ``spec`` (observation width, action bounds)."""
        return cls(spec.obs_dim, spec.action_low, spec.action_high, cfg, ctx.device)

    @classmethod
    def observations(cls, cfg: Any) -> tuple[str, ...]:
        return ("policy",)

    def step(self, name: str, optimizer: torch.optim.Optimizer) -> GradientStep:
        """A ``GradientStep`` for one of this learner's losses."""
        return GradientStep(self.NAME, name, optimizer)

    # ------------------------------------------------------------------ data
    def reward_transform(self, data: Dataset) -> tuple[float, float]:
        """(scale, shift) applied to rewards at ``attach``: r <- scale r + shift."""
        return 1.0, 0.0

    def attach(self, data: Dataset) -> None:
        """View ``data`` for learning: on this device, observations normalized, actions in
        [-1, 1], rewards transformed (``reward_transform``)."""
        data.check_spec(self.obs_dim, self.act_dim)
        data = data.to(self.device)
        if self.cfg.normalize_obs:
            obs = data.observations.double()
            with torch.no_grad():
                self.normalizer.mean.copy_(obs.mean(0))
                self.normalizer.var.copy_(obs.var(0, unbiased=False))
                self.normalizer.count.fill_(obs.shape[0])
        scale, shift = self.reward_transform(data)
        action = ((data.actions.to(self.dtype) - self.center) / self.half_range).clamp(-1.0, 1.0)
        rewards = data.rewards.to(self.dtype) * scale + shift
        table = torch.cat([self._norm(data.observations), action, rewards[:, None],
                           self._norm(data.next_observations), data.table[:, -2:].to(self.dtype)],
                          dim=1)
        self.data = Dataset.from_table(table, data.episode_starts, self.obs_dim, self.act_dim,
                                       data.card)
        if self.NEEDS_NEXT_ACTION:
            rows = torch.arange(len(data), device=self.device)
            last = torch.zeros(len(data), dtype=torch.bool, device=self.device)
            last[data.episode_ends() - 1] = True
            self.next_actions = action[torch.where(last, rows, rows + 1).clamp(max=len(data) - 1)]

    def sample(self) -> dict[str, torch.Tensor]:
        """A batch of ``cfg.batch_size`` rows of the attached view (see ``Dataset.sample``)."""
        assert self.data is not None
        data = self.data
        idx = torch.randint(len(data), (self.cfg.batch_size,), device=self.device,
                            generator=self.generator)
        batch = data.unpack(data.table[idx])
        if self.next_actions is not None:
            batch["next_action"] = self.next_actions[idx]
        return batch

    def _norm(self, obs: torch.Tensor) -> torch.Tensor:
        obs = obs.to(self.dtype)
        return self.normalizer(obs) if self.cfg.normalize_obs else obs

    # ------------------------------------------------------------------ acting
    @torch.no_grad()
    def act_deterministic(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """The policy's deterministic action [N, A] in the env's bounds; records nothing."""
        x = self._norm(policy_obs(obs).to(self.device))
        return self.center + self.half_range * self.eval_actor()(x)

    def act(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """Offline learners act deterministically (they never collect)."""
        return self.act_deterministic(obs)

    def process_env_step(self, *args: Any) -> None:
        raise RuntimeError(f"{self.NAME} learns from a dataset; it does not collect")

    def eval_actor(self) -> nn.Module:
        """The module that acts (MCEP swaps in its evaluation policy): obs -> [-1, 1]^A."""
        return self.actor

    def export_actor(self) -> DeterministicActor:
        """Frozen ``act_deterministic``: normalizer, network, tanh, bounds."""
        net = self.eval_actor().net
        return DeterministicActor(net, self.obs_dim, self.action_low, self.action_high, "tanh",
                                  self.normalizer if self.cfg.normalize_obs else None)

    # ------------------------------------------------------------------ learning
    def _update_once(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def update(self, progress: float = 0.0) -> dict[str, float]:
        """``cfg.updates_per_iteration`` gradient updates on batches of the attached dataset; returns the
        ``METRIC_KEYS`` averaged over them (metrics of delayed updates over those that ran).

        Raises:
            NonFiniteError: a loss or gradient became NaN/Inf (checked once per call).
        """
        if self.data is None:
            raise RuntimeError(f"{self.NAME}.update() before attach(dataset)")
        nan = torch.full((), math.nan, device=self.device)
        rows = []
        for _ in range(self.cfg.updates_per_iteration):
            with precision_autocast(self.device, self.cfg.precision):
                metrics = self._update_once(self.sample())
            self.num_updates += 1
            rows.append(torch.stack([metrics.get(k, nan).float() for k in self.METRIC_KEYS]))
        out = summarize_updates(torch.stack(rows), self.METRIC_KEYS, self.NAME,
                                self.METRIC_KEYS[0].split("/")[-1],
                                self.num_updates - self.cfg.updates_per_iteration + 1, self.num_updates)
        out["train/updates"] = float(self.num_updates)
        return out

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"modules": {k: m.state_dict() for k, m in self.modules.items()},
                "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
                "generator": self.generator.get_state(), "num_updates": self.num_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, module in self.modules.items():
            module.load_state_dict(state["modules"][key])
        for key, opt in self.optimizers.items():
            opt.load_state_dict(state["optimizers"][key])
        self.generator.set_state(state["generator"].cpu())
        self.num_updates = int(state["num_updates"])
