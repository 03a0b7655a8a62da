"""Helpers every backend shares (action checks, auto-reset merging); the batched-environment
protocol itself (``BatchedEnv``, ``EnvSpec``, ``StepOut``) lives in ``robotrl.types`` and is
re-exported here."""

from __future__ import annotations

import torch

from robotrl.types import (  # noqa: F401 - re-exported: robotrl.envs.base is where users look
    GROUPS,
    BatchedEnv,
    EnvSpec,
    GoalSpec,
    Obs,
    ObsSpec,
    StepOut,
    flatten_groups,
    obs_to,
)


def check_action_shape(action: torch.Tensor, spec: EnvSpec, num_envs: int) -> None:
    """Raise a clear error for an action of the wrong type, shape or dtype (no host sync)."""
    if not isinstance(action, torch.Tensor):
        raise TypeError(
            f"action must be a torch.Tensor of shape [{num_envs}, {spec.action_dim}], "
            f"got {type(action).__name__}"
        )
    if tuple(action.shape) != (num_envs, spec.action_dim):
        raise ValueError(
            f"action has shape {tuple(action.shape)}, expected ({num_envs}, {spec.action_dim}) "
            f"= (num_envs, action_dim) for task {spec.task!r}"
        )
    if not action.is_floating_point():
        raise TypeError(f"action must be a floating-point tensor, got dtype {action.dtype}")


def check_action(action: torch.Tensor, spec: EnvSpec, num_envs: int) -> None:
    """``check_action_shape`` plus NaN/Inf entries (reads a flag on the host: CPU backends)."""
    check_action_shape(action, spec, num_envs)
    if not bool(torch.isfinite(action).all()):
        bad = (~torch.isfinite(action)).any(dim=1).nonzero().flatten().tolist()
        raise ValueError(
            f"action contains NaN or Inf in envs {bad[:10]}{'...' if len(bad) > 10 else ''}; "
            "refusing to feed it to the physics"
        )


def where_done(done: torch.Tensor, reset: Obs, final: Obs) -> Obs:
    """Per group: rows of ``reset`` where ``done`` [N] bool, else ``final``."""
    out = {}
    for name, value in final.items():
        mask = done.to(value.device).reshape(-1, *([1] * (value.dim() - 1)))
        out[name] = torch.where(mask, reset[name], value)
    return out


def end_unstable(unstable: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor,
                 reward: torch.Tensor, obs: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(terminated, truncated, reward, obs) with the worlds in ``unstable`` [N] bool ended: an
    unstable world's state is garbage, so its episode terminates (no bootstrap) with reward 0,
    and non-finite observations become 0 so that they cannot reach the learner."""
    return (terminated | unstable, truncated & ~unstable, reward.masked_fill(unstable, 0.0),
            torch.nan_to_num(obs, nan=0.0, posinf=0.0, neginf=0.0))
