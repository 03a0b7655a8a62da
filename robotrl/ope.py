"""Off-policy evaluation: a policy's value estimated from a dataset alone.

Fitted Q evaluation (FQE; Le, Voloshin & Yue, ICML 2019; the strongest simple baseline in Fu et
al.'s "Benchmarks for Deep Off-Policy Evaluation", ICLR 2021): regress Q(s, a) on
``r + gamma * (1 - terminated) * Q'(s', pi(s'))`` over the dataset's transitions, Q' a slowly
tracking (Polyak) copy, then average ``Q(s0, pi(s0))`` over the dataset's episode starts. The
estimate is the policy's expected *discounted* return from the data's initial states; compare
it with the same quantity measured in the simulator (``runners.evaluation.evaluate`` with
``gamma``), never with the undiscounted episode return.

The policy is deterministic and fixed, so its actions at every successor and start state are
computed once, before the regression; each update is then one critic step. Rewards are divided
by their standard deviation for the regression and the estimate scaled back.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable

import torch

from robotrl.data.dataset import Dataset
from robotrl.nn.ensemble import EnsembleQ
from robotrl.nn.target import polyak, td_target
from robotrl.optim import adam

ActFn = Callable[[torch.Tensor], torch.Tensor]
"""Flat observations [B, obs_dim] -> deterministic actions [B, act_dim]."""


@dataclasses.dataclass
class FQEConfig:
    """Fitted Q evaluation settings (critics as Fu et al. 2021: 256x256, Adam 3e-4)."""

    updates: int = 10_000
    """Critic gradient steps."""
    gamma: float = 0.99
    """Discount of the estimated value."""
    batch_size: int = 256
    lr: float = 3e-4
    hidden: tuple[int, ...] = (256, 256)
    tau: float = 0.05
    """Polyak rate of the target critic. 10x the usual 0.005: the value propagates about
    ``updates x tau`` Bellman backups, and a gamma-0.99 value needs hundreds of them."""
    members: int = 2
    """Independent critics regressed side by side; the estimate is their mean and their spread
    (``estimate_std``) says how settled the regression is."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.updates < 1 or self.batch_size < 1 or self.members < 1:
            raise ValueError(f"updates, batch_size and members must be >= 1: {self}")
        if not 0.0 <= self.gamma < 1.0:
            raise ValueError(f"gamma must be in [0, 1), got {self.gamma}")


def _batched(act: ActFn, x: torch.Tensor, chunk: int = 65_536) -> torch.Tensor:
    with torch.inference_mode():
        return torch.cat([act(x[i:i + chunk]) for i in range(0, len(x), chunk)]).clone()


def fitted_q_evaluation(act: ActFn, dataset: Dataset, cfg: FQEConfig | None = None,
                        on_progress: Callable[[int, float], None] | None = None,
                        ) -> dict[str, float]:
    """FQE estimate of ``act``'s discounted value from ``dataset``'s episode starts.

    Returns ``estimate`` (mean over members and starts), ``estimate_std`` (between members),
    ``starts`` (episode starts averaged over), ``td_loss`` (the last 1,000 updates' mean, in
    reward-std units). ``on_progress(update, td_loss)`` is called every 1,000 updates.
    """
    cfg = cfg or FQEConfig()
    device = dataset.device
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    obs, nxt = dataset.observations, dataset.next_observations
    scale = float(dataset.rewards.std().clamp_min(1e-6))
    reward, terminated = dataset.rewards / scale, dataset.terminations
    next_act = _batched(act, nxt)
    starts = obs[dataset.episode_starts]
    start_act = _batched(act, starts)
    q = EnsembleQ(obs.shape[1], next_act.shape[1], cfg.hidden, cfg.members).to(device)
    target = copy.deepcopy(q).requires_grad_(False)
    opt = adam(q.parameters(), cfg.lr)
    losses = torch.zeros((), device=device)
    td_loss = math.nan
    for step in range(1, cfg.updates + 1):
        i = torch.randint(0, len(dataset), (cfg.batch_size,), device=device, generator=gen)
        with torch.no_grad():
            # [E, B]: each member its own target
            y = td_target(reward[i], terminated[i], target(nxt[i], next_act[i]), cfg.gamma)
        loss = (q(obs[i], dataset.actions[i]) - y).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        polyak(target, q, cfg.tau)
        losses += loss.detach()
        if step % 1000 == 0 or step == cfg.updates:
            td_loss = float(losses) / (step % 1000 or 1000)
            losses.zero_()
            if not math.isfinite(td_loss):
                raise FloatingPointError(f"FQE diverged at update {step}: TD loss {td_loss}")
            if on_progress is not None:
                on_progress(step, td_loss)
    with torch.inference_mode():
        values = q(starts, start_act).mean(dim=1) * scale  # [E]
    return {"estimate": float(values.mean()), "estimate_std": float(values.std(unbiased=False)),
            "starts": int(len(starts)), "td_loss": td_loss, "gamma": cfg.gamma,
            "updates": cfg.updates}
