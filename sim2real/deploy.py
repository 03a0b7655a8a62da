"""A fixed-rate control loop around an exported policy, with safety limits and timing stats.

For an ONNX policy it needs only numpy and onnxruntime (no torch) unless ``SimSource`` is used,
so it runs on a robot's computer as is; pt2 and TorchScript exports run in torch.

    policy = load_policy("policy.onnx")                 # or .pt2 / .pt; one intra-op thread
    source = SimSource(policy.metadata["task"])         # or any ObservationSource (a robot)
    cfg = DeployConfig(hz=500, seconds=10, max_delta=0.1)
    report = run_loop(policy, source, cfg, policy.low, policy.high)
    print(format_report(report))

Every tick (absolute deadlines ``t0 + k / hz``, so errors do not accumulate): read an
observation, run the model, limit the action, write it. Safety, in order:

1. watchdog: an observation that is missing (``read()`` returned None), late (``read()`` took
   longer than ``obs_timeout``) or not finite, or a non-finite model output, is not acted on;
   the loop holds the last good action, and after ``hold_steps`` consecutive trips (or at
   once with ``safe_action="default"``) commands ``default_action`` (zeros unless set);
2. rate limit: no entry changes by more than ``max_delta`` from the previous command (the first
   command is limited from ``default_action``);
3. clipping to the action bounds from the model's metadata.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

SAFE_ACTIONS: tuple[str, ...] = ("last", "default")
"""What the watchdog commands: the last good action (then the default), or the default."""
TRIP_REASONS: tuple[str, ...] = ("missing", "late", "nonfinite_obs", "nonfinite_action")
"""Why a watchdog trip happened, as counted in the report."""


@runtime_checkable
class ObservationSource(Protocol):
    """Where observations come from and actions go: the simulator or a real robot."""

    def read(self) -> np.ndarray | None:
        """The latest observation, [obs_dim] float32, or None if there is none yet.

        Should return promptly: the loop cannot interrupt a blocking read, it can only count
        one that took longer than ``obs_timeout`` as late afterwards.
        """

    def write(self, action: np.ndarray) -> None:
        """Send ``action`` [act_dim] float32 (already limited) to the actuators."""


@dataclasses.dataclass
class DeployConfig:
    """Rate, duration and safety limits of the control loop."""

    hz: float = 500.0
    """Control rate (ticks per second)."""
    seconds: float = 10.0
    """Duration of the run (``round(seconds * hz)`` ticks)."""
    max_delta: float = 0.0
    """Largest change of any action entry from one tick to the next (rate limit); 0 disables."""
    obs_timeout: float = 0.0
    """Seconds ``read()`` may take before its observation counts as late; 0: half a period."""
    safe_action: str = "last"
    """Watchdog action: "last" (hold the last good one, then the default) or "default"."""
    default_action: tuple[float, ...] = ()
    """Safe default action (clipped to the bounds); empty: zeros."""
    hold_steps: int = 100
    """Consecutive watchdog ticks the last good action is held before the default replaces it."""
    spin: float = 2e-4
    """Busy-wait the last this many seconds before a tick (``time.sleep`` overshoots ~0.1 ms)."""
    threads: int = 1
    """Intra-op threads of the exported policy (onnxruntime or torch; 1: one core, no hand-offs)."""

    def __post_init__(self) -> None:
        self.default_action = tuple(float(v) for v in self.default_action)
        if self.safe_action not in SAFE_ACTIONS:
            raise ValueError(f"unknown safe_action {self.safe_action!r}; "
                             f"allowed: {', '.join(SAFE_ACTIONS)}")
        for name in ("hz", "seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("max_delta", "obs_timeout", "spin"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.hold_steps < 0 or self.threads < 1:
            raise ValueError(f"need hold_steps >= 0 and threads >= 1, got {self.hold_steps}, "
                             f"{self.threads}")


class ExportedPolicy:
    """An exported robotrl policy: ``obs [obs_dim] -> action [act_dim]`` float32.

    Attributes:
        metadata: the file's robotrl metadata (``robotrl.sim2real.export.build_metadata``).
        obs_dim, act_dim: widths; low, high: [act_dim] float32 action bounds.
    """

    def __init__(self, metadata: dict[str, Any]) -> None:
        self.metadata = meta = metadata
        self.obs_dim, self.act_dim = int(meta["obs_dim"]), int(meta["action_dim"])
        self.low = np.asarray(meta["action_low"], dtype=np.float32)
        self.high = np.asarray(meta["action_high"], dtype=np.float32)
        self._buffer = np.zeros((1, self.obs_dim), dtype=np.float32)

    def _run(self, batch: np.ndarray) -> np.ndarray:
        """[1, obs_dim] -> [1, act_dim]."""
        raise NotImplementedError

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """``obs`` [obs_dim] -> action [act_dim] float32."""
        if np.shape(obs) != (self.obs_dim,):
            raise ValueError(f"observation has shape {np.shape(obs)}, the policy takes "
                             f"({self.obs_dim},)")
        self._buffer[0] = obs
        return self._run(self._buffer)[0]


class OnnxPolicy(ExportedPolicy):
    """An ONNX export in onnxruntime (no torch needed)."""

    def __init__(self, path: str, threads: int = 1) -> None:
        import onnxruntime as ort

        from robotrl.sim2real.export import decode_onnx_metadata

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        super().__init__(decode_onnx_metadata(self.session.get_modelmeta().custom_metadata_map,
                                              path))
        self._input_name = self.metadata["input_name"]
        self._outputs = [self.metadata["output_name"]]

    def _run(self, batch: np.ndarray) -> np.ndarray:
        return self.session.run(self._outputs, {self._input_name: batch})[0]


class TorchPolicy(ExportedPolicy):
    """A pt2 (``torch.export``) or TorchScript export run by torch on the CPU."""

    def __init__(self, path: str, threads: int = 1) -> None:
        import torch

        from robotrl.sim2real.export import read_metadata
        from robotrl.sim2real.verify import load_torch_module

        metadata = read_metadata(path)
        super().__init__(metadata)
        fmt = metadata.get("format") or ("pt2" if str(path).endswith(".pt2") else "torchscript")
        torch.set_num_threads(threads)
        self._torch = torch
        self.module = load_torch_module(str(path), fmt)

    def _run(self, batch: np.ndarray) -> np.ndarray:
        with self._torch.no_grad():
            return self.module(self._torch.from_numpy(batch)).numpy()


def load_policy(path: str, threads: int = 1) -> ExportedPolicy:
    """The exported policy at ``path``: ONNX in onnxruntime, pt2/TorchScript archives in torch."""
    import zipfile

    return (TorchPolicy if zipfile.is_zipfile(path) else OnnxPolicy)(path, threads)


class SimSource:
    """One simulated world as an ``ObservationSource``: ``write`` steps the physics.

    Simulated time advances ``control_dt`` per write, whatever the loop rate. Episodes reset
    automatically; ``returns`` collects the finished ones.
    """

    def __init__(self, task: str, seed: int = 0, **overrides: Any) -> None:
        """Args: ``task`` a ``robotrl.envs`` task; ``overrides`` its config fields."""
        import torch

        from robotrl.envs import make

        self._torch = torch
        self.env = make(task, 1, num_threads=1, seed=seed, **overrides)
        self._obs = self.env.reset(seed=seed)["policy"][0].numpy()
        self._return = 0.0
        self.returns: list[float] = []
        """Returns of the finished episodes."""

    def read(self) -> np.ndarray:
        return self._obs

    def write(self, action: np.ndarray) -> None:
        out = self.env.step(self._torch.from_numpy(np.asarray(action, np.float32)[None]))
        self._obs = out.obs["policy"][0].numpy()
        self._return += float(out.reward[0])
        if bool(out.terminated[0] | out.truncated[0]):
            self.returns.append(self._return)
            self._return = 0.0


def limit_action(action: np.ndarray, previous: np.ndarray, low: np.ndarray, high: np.ndarray,
                 max_delta: float) -> tuple[np.ndarray, bool, bool]:
    """``action`` [A] moved at most ``max_delta`` from ``previous`` (0: no limit), then clipped
    to [low, high]; returns (command [A] float32, rate limit acted, clip acted)."""
    limited = action
    if max_delta > 0:
        limited = np.clip(action, previous - max_delta, previous + max_delta)
    command = np.clip(limited, low, high).astype(np.float32)
    return command, bool((limited != action).any()), bool((command != limited).any())


def wait_until(deadline: float, spin: float) -> None:
    """Return at ``deadline`` (``time.perf_counter`` seconds): sleep, then spin the last bit."""
    remaining = deadline - time.perf_counter()
    if remaining > spin:
        time.sleep(remaining - spin)
    while time.perf_counter() < deadline:
        pass


def _percentiles(x: np.ndarray) -> dict[str, float]:
    if x.size == 0:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    p50, p99 = np.percentile(x, [50, 99])
    return {"p50": float(p50) * 1e3, "p99": float(p99) * 1e3, "max": float(x.max()) * 1e3}


def run_loop(
    policy: Callable[[np.ndarray], np.ndarray],
    source: ObservationSource,
    cfg: DeployConfig,
    low: np.ndarray,
    high: np.ndarray,
) -> dict[str, Any]:
    """Run ``round(cfg.seconds * cfg.hz)`` ticks; see the module docstring for the safety rules.

    Args:
        policy: obs [obs_dim] float32 -> action [act_dim] (a ``load_policy`` result).
        source: where observations come from and actions go.
        cfg: rate, duration and limits.
        low, high: [act_dim] action bounds.

    Returns:
        ``ticks``, ``hz``, ``wall_s``; ``model_ms``, ``period_ms``, ``jitter_ms`` (each
        ``{p50, p99, max}`` in milliseconds; jitter is ``|period - 1/hz|``);
        ``missed_deadlines`` (ticks whose command was written after the next tick was due);
        ``watchdog_trips`` and ``watchdog`` {reason: count}; ``rate_limited`` and ``clipped``
        (ticks where that limit changed the command); ``actions`` [ticks, act_dim].
    """
    low = np.asarray(low, dtype=np.float32)
    high = np.asarray(high, dtype=np.float32)
    default = np.zeros_like(low) if not cfg.default_action else np.asarray(
        cfg.default_action, dtype=np.float32)
    if default.shape != low.shape:
        raise ValueError(f"default_action has {default.size} entries, the action {low.size}")
    default = np.clip(default, low, high)
    period = 1.0 / cfg.hz
    timeout = cfg.obs_timeout or period / 2
    ticks = max(1, round(cfg.seconds * cfg.hz))
    model_s, starts = np.empty(ticks), np.empty(ticks)
    actions = np.empty((ticks, low.size), dtype=np.float32)
    trips = dict.fromkeys(TRIP_REASONS, 0)
    n_model = missed = rate_limited = clipped = consecutive = 0
    previous, last_good = default.copy(), None
    t0 = time.perf_counter()
    due = t0
    for k in range(ticks):
        wait_until(due, cfg.spin)
        start = time.perf_counter()
        starts[k] = start
        obs = source.read()
        reason = None
        if obs is None:
            reason = "missing"
        elif time.perf_counter() - start > timeout:
            reason = "late"
        elif not np.isfinite(obs).all():
            reason = "nonfinite_obs"
        else:
            before = time.perf_counter()
            proposal = np.asarray(policy(obs), dtype=np.float32)
            model_s[n_model] = time.perf_counter() - before
            n_model += 1
            if not np.isfinite(proposal).all():
                reason = "nonfinite_action"
        if reason is None:
            consecutive = 0
            last_good = proposal
        else:
            trips[reason] += 1
            consecutive += 1
            hold = cfg.safe_action == "last" and last_good is not None
            proposal = last_good if hold and consecutive <= cfg.hold_steps else default
        action, was_rate_limited, was_clipped = limit_action(proposal, previous, low, high,
                                                             cfg.max_delta)
        rate_limited += was_rate_limited
        clipped += was_clipped
        source.write(action)
        actions[k] = action
        previous = action
        # absolute schedule: the next tick is due one period after this one was due; a tick
        # that overran skips the slots it ate instead of bursting to catch up
        due += period
        done = time.perf_counter()
        if done > due:
            late_by = math.floor((done - due) / period) + 1
            missed += 1
            due += (late_by - 1) * period
    wall = time.perf_counter() - t0
    periods = np.diff(starts)
    return {
        "ticks": ticks,
        "hz": cfg.hz,
        "wall_s": wall,
        "model_ms": _percentiles(model_s[:n_model]),
        "period_ms": _percentiles(periods),
        "jitter_ms": _percentiles(np.abs(periods - period)),
        "missed_deadlines": missed,
        "watchdog_trips": sum(trips.values()),
        "watchdog": trips,
        "rate_limited": rate_limited,
        "clipped": clipped,
        "actions": actions,
    }


def format_report(report: dict[str, Any]) -> str:
    """Human-readable summary of ``run_loop``'s report."""
    def ms(stats: dict[str, float]) -> str:
        return f"p50 {stats['p50']:.3f}  p99 {stats['p99']:.3f}  max {stats['max']:.3f} ms"

    trips = ", ".join(f"{k} {v}" for k, v in report["watchdog"].items())
    return "\n".join([
        f"{report['ticks']} ticks at {report['hz']:g} Hz in {report['wall_s']:.2f} s",
        f"  model call   {ms(report['model_ms'])}",
        f"  loop period  {ms(report['period_ms'])}",
        f"  jitter       {ms(report['jitter_ms'])}",
        f"  missed deadlines {report['missed_deadlines']}, watchdog trips "
        f"{report['watchdog_trips']} ({trips}), rate-limited {report['rate_limited']}, "
        f"clipped {report['clipped']}",
    ])
