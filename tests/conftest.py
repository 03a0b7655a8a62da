"""Test-wide settings, the small training configs the end-to-end tests share, and ``PointEnv``,
the pure-torch toy environment the learners' learning checks run on."""

from __future__ import annotations

import ctypes.util
import os
import sys

# Offscreen OpenGL for the tests that render (their child processes inherit it), set here,
# before anything imports MuJoCo, which reads MUJOCO_GL at its first import. Only where an EGL
# library is installed: without one MUJOCO_GL=egl makes `import mujoco` itself fail, which
# failed every test that starts a robotrl process (seen on a GPU machine without libEGL).
if ctypes.util.find_library("EGL"):
    os.environ.setdefault("MUJOCO_GL", "egl")

from collections.abc import Callable, Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from robotrl.config import TrainConfig, from_dict  # noqa: E402
from robotrl.registry import algo_config_class, learner_class  # noqa: E402
from robotrl.types import BatchedEnv, BuildContext, EnvSpec, Obs, ObsSpec, StepOut  # noqa: E402

# One intra-op thread: the tests' tensors are small, and torch's worker threads only contend
# with the simulator's pool and with each other on CI's 2 cores (measured: a 64-block residual
# net export takes 8.7 s with the default threads, 0.5 s with one).
torch.set_num_threads(1)

def pytest_configure(config: pytest.Config) -> None:
    """absl's log handler (dm_control's logging) closes its stream when logging is configured
    again (hydra's ``dictConfig`` closes every handler) unless that stream is ``sys.stderr`` at
    the time: created while pytest captured, its stream was pytest's capture file, closed under
    a later test's ``capsys`` (every later test of that worker then errored, "I/O operation on
    closed file"). It writes to the process's own stderr instead."""
    try:
        from absl import logging as absl_logging
    except ImportError:
        return
    absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__


SMALL_ALGOS: dict[str, dict[str, Any]] = {
    "ppo": {"rollout_steps": 8, "actor_hidden": [32, 32], "critic_hidden": [32, 32]},
    "trpo": {"rollout_steps": 8, "actor_hidden": [32, 32], "critic_hidden": [32, 32],
             "critic_minibatches": 4},
    # small nets, fast targets (tau .05) and high learning rates: InvertedPendulum in 4k steps
    # (the SAC defaults, like Stable-Baselines3's SAC, are still near 100 there after 5k steps)
    "sac": {"collect_steps": 8, "actor_hidden": [64, 64], "critic_hidden": [64, 64],
            "batch_size": 128, "learning_starts": 500, "actor_lr": 3e-3, "critic_lr": 3e-3,
            "alpha_lr": 1e-3, "init_alpha": 0.05, "tau": 0.05},
    "crossq": {"collect_steps": 8, "actor_hidden": [64, 64], "critic_hidden": [128, 128],
               "batch_size": 128, "learning_starts": 500, "init_alpha": 0.05},
    # FastTD3 on 4 worlds: more updates per transition than its many-world default
    "fasttd3": {"collect_steps": 8, "actor_hidden": [64, 64], "critic_hidden": [64, 64],
                "batch_size": 256, "learning_starts": 500, "utd_ratio": 0.5, "v_min": -10.0,
                "v_max": 110.0, "actor_lr": 1e-3, "critic_lr": 1e-3},
}
"""Per-algorithm settings of the fast InvertedPendulum runs."""


def small_config(run_dir: Path, name: str = "ppo", algo: dict[str, Any] | None = None,
                 **over: Any) -> TrainConfig:
    """A fast InvertedPendulum run of algorithm ``name`` (4 worlds, 6 iterations of 32 steps,
    no TensorBoard or progress bar); ``algo`` replaces algorithm keys, ``over`` top-level keys."""
    algo_cfg = {"name": name, **SMALL_ALGOS[name], **(algo or {})}
    data = {
        "algo": algo_cfg,
        "env": {"task": "inverted_pendulum", "options": {}},
        "logger": {"tensorboard": False, "progress": False, "log_interval": 1},
        "num_envs": 4,
        "total_steps": 6 * 32,
        "run_dir": str(run_dir),
        "checkpoint_interval": 1000,
        "eval_episodes": 2,
        **over,
    }
    return from_dict(TrainConfig, data)


@pytest.fixture
def float64_one_thread() -> Iterator[None]:
    """float64 as the default dtype and one torch thread for a test (equivalence tests that
    hold a batched computation to its separate runs within 1e-10), restored after it."""
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    yield
    torch.set_default_dtype(dtype)
    torch.set_num_threads(threads)


@pytest.fixture
def make_config() -> Callable[..., TrainConfig]:
    """``small_config`` as a fixture: ``make_config(run_dir, algo="sac", total_steps=...)``."""
    return small_config


class PointEnv(BatchedEnv):
    """N points in the plane (or in ``dim`` dimensions), pure torch: a stand-in simulator on
    which every learner family learns in seconds, speaking the whole ``BatchedEnv`` protocol.

    - ``policy`` observation: the position [N, dim]; with ``privileged=True`` also a
      ``privileged`` group [N, 1], the fraction of the episode left (what a critic can use to
      value a time-limited episode and the actor never sees).
    - action: a velocity in [-1, 1]^dim (clipped to the bounds); the point moves
      ``speed * action`` per step.
    - reward ``1 - |p|`` after the step (dense; reward terms ``alive`` and ``distance``).
    - terminated when a coordinate leaves [-2, 2] (no bootstrap); truncated after ``horizon``
      steps (only when not terminated); ``info["success"]``: ``|p| < success_distance``.
    - finished worlds restart uniformly in [-1, 1]^dim inside ``step``; ``info["final_obs"]``
      holds their last observation (the other rows equal ``obs``).

    Returns of a 20-step episode (dim 2, speed 0.2; ``point_return``): standing still 4.8 (the
    mean start is 0.77 from the origin), driving there at full speed and staying about 19.
    The state (``get_state``) is the position and the step count, float64 [N, dim + 1], so the
    group runner can restore it; ``state_dict`` adds the reset generator (checkpoints).
    """

    def __init__(self, num_envs: int, dim: int = 2, horizon: int = 20, seed: int = 0,
                 speed: float = 0.2, privileged: bool = False,
                 success_distance: float = 0.1) -> None:
        self.num_envs, self.dim, self.horizon = num_envs, dim, horizon
        self.speed, self.success_distance = speed, success_distance
        self.device = torch.device("cpu")
        groups = {"policy": ObsSpec((dim,))}
        if privileged:
            groups["privileged"] = ObsSpec((1,))
        self.spec = EnvSpec(obs_dim=dim, action_dim=dim, action_low=-torch.ones(dim),
                            action_high=torch.ones(dim), control_dt=0.05,
                            max_episode_steps=horizon, reward_terms=("alive", "distance"),
                            observations=groups, task="point", has_success=True)
        self.gen = torch.Generator().manual_seed(seed)
        self.pos = torch.zeros(num_envs, dim)
        self.t = torch.zeros(num_envs, dtype=torch.long)

    def _start(self) -> torch.Tensor:
        return torch.rand(self.num_envs, self.dim, generator=self.gen) * 2.0 - 1.0

    def _obs(self, pos: torch.Tensor, t: torch.Tensor) -> Obs:
        obs = {"policy": pos.clone()}
        if "privileged" in self.spec.observations:
            obs["privileged"] = (1.0 - t.float() / self.horizon)[:, None]
        return obs

    def reset(self, seed: int | None = None) -> Obs:
        if seed is not None:
            self.gen.manual_seed(seed)
        self.pos, self.t = self._start(), torch.zeros_like(self.t)
        return self.observe()

    def step(self, action: torch.Tensor) -> StepOut:
        if tuple(action.shape) != (self.num_envs, self.dim):
            raise ValueError(f"action has shape {tuple(action.shape)}, expected "
                             f"({self.num_envs}, {self.dim})")
        pos = self.pos + self.speed * action.float().clamp(-1.0, 1.0)
        t = self.t + 1
        distance = pos.norm(dim=-1)
        terminated = (pos.abs() > 2.0).any(dim=-1)
        truncated = (t >= self.horizon) & ~terminated
        final_obs = self._obs(pos, t)
        done = terminated | truncated
        self.pos = torch.where(done[:, None], self._start(), pos)
        self.t = torch.where(done, 0, t)
        info = {"final_obs": final_obs, "success": distance < self.success_distance,
                "reward_terms": {"alive": torch.ones(self.num_envs), "distance": -distance}}
        return StepOut(self.observe(), 1.0 - distance, terminated, truncated, info)

    def observe(self) -> Obs:
        return self._obs(self.pos, self.t)

    def get_state(self) -> torch.Tensor:
        return torch.cat([self.pos.double(), self.t.double()[:, None]], dim=1)

    def set_state(self, state: torch.Tensor, env_ids: torch.Tensor | None = None) -> None:
        ids = torch.arange(self.num_envs) if env_ids is None else env_ids
        pos, t = self.pos.clone(), self.t.clone()  # not in place: they may be inference tensors
        pos[ids], t[ids] = state[:, : self.dim].float(), state[:, self.dim].long()
        self.pos, self.t = pos, t

    def state_dict(self) -> dict[str, Any]:
        return {"pos": self.pos.clone(), "t": self.t.clone(), "generator": self.gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pos, self.t = state["pos"].clone(), state["t"].clone()
        self.gen.set_state(state["generator"])


def point_return(act: Callable[[Obs], torch.Tensor], num_envs: int = 256, seed: int = 123,
                 **env_kwargs: Any) -> float:
    """Mean return of the first episode of ``num_envs`` ``PointEnv`` worlds (fixed starts from
    ``seed``) under ``act`` (e.g. a learner's ``act_deterministic``)."""
    env = PointEnv(num_envs, seed=seed, **env_kwargs)
    obs, total = env.reset(), torch.zeros(num_envs)
    running = torch.ones(num_envs, dtype=torch.bool)
    with torch.no_grad():
        for _ in range(env.horizon):
            out = env.step(act(obs))
            total += out.reward * running
            running &= ~(out.terminated | out.truncated)
            obs = out.obs
    return total.mean().item()


@pytest.fixture
def point_env() -> type[PointEnv]:
    """The ``PointEnv`` class: ``point_env(num_envs, horizon=..., privileged=True)``."""
    return PointEnv


def train_learner(alg: Any, env: BatchedEnv, iterations: int) -> list[dict[str, float]]:
    """What a runner does, ``iterations`` times: ``rollout_steps`` (on-policy) or ``collect_steps`` (off-policy) steps in every world
    (``act``, ``process_env_step`` under inference mode), ``compute_returns`` for on-policy
    learners, then ``update``; returns every update's metrics."""
    obs, history = env.reset(), []
    for i in range(iterations):
        with torch.inference_mode():
            for _ in range(getattr(alg.cfg, "rollout_steps", None) or alg.cfg.collect_steps):
                out = env.step(alg.act(obs))
                alg.process_env_step(out.reward, out.terminated, out.truncated,
                                     out.info["final_obs"])
                obs = out.obs
            if hasattr(alg, "compute_returns"):
                alg.compute_returns(obs)
        history.append(alg.update(progress=i / iterations))
    return history


POINT_ALGOS: dict[str, tuple[dict[str, Any], int, int]] = {
    # name: (algorithm keys, worlds, iterations). Measured: point_return after training, seeds
    # 0/1/2, and seconds on one thread (untrained: 2.4-6.2; standing still 4.8, optimal ~19)
    "ppo": ({"rollout_steps": 16, "actor_hidden": [64, 64], "critic_hidden": [64, 64]},
            64, 10),  # 18.1 / 17.5 / 16.6, 0.6 s
    "trpo": ({"rollout_steps": 16, "actor_hidden": [32, 32], "critic_hidden": [32, 32],
              "critic_minibatches": 4}, 64, 10),  # 18.6 / 18.3 / 18.6, 0.4 s
    # the off-policy learners: 16 worlds, 256 random warm-up transitions, small nets and
    # gamma 0.9 (the episodes are 20 steps)
    "sac": ({"collect_steps": 8, "actor_hidden": [64, 64], "critic_hidden": [64, 64],
             "batch_size": 128, "learning_starts": 256, "utd_ratio": 0.25, "gamma": 0.9,
             "actor_lr": 1e-3, "critic_lr": 1e-3, "init_alpha": 0.05},
            16, 13),  # 18.4 / 18.2 / 18.2, 336 updates, 1.0 s
    "crossq": ({"collect_steps": 8, "actor_hidden": [64, 64], "critic_hidden": [64, 64],
                "batch_size": 64, "learning_starts": 256, "utd_ratio": 0.5, "gamma": 0.9,
                "init_alpha": 0.05},
               16, 13),  # 17.4 / 17.5 / 17.8, 672 updates, 1.7 s
    # the categorical support must hold the values: with gamma 0.99 time-limit bootstrapping
    # takes them to ~100, and a support capped at 25 left the return at 13-15
    "fasttd3": ({"collect_steps": 8, "actor_hidden": [64, 64], "critic_hidden": [64, 64],
                 "batch_size": 128, "learning_starts": 256, "utd_ratio": 0.25, "gamma": 0.9,
                 "v_min": -5.0, "v_max": 15.0, "actor_lr": 1e-3, "critic_lr": 1e-3},
                16, 13),  # 18.1 / 18.4 / 18.1, 336 updates, 0.9 s
}
"""Per-algorithm settings under which each learner family drives ``PointEnv`` to the origin
in about a second."""


@dataclass
class PointRun:
    """What ``learn_point`` measured."""

    before: float
    """``point_return`` of the untrained learner's deterministic policy."""
    after: float
    """``point_return`` after training."""
    history: list[dict[str, float]]
    """Every update's metrics."""
    alg: Any
    """The trained learner."""


def learn_point(name: str, seed: int = 0, iterations: int | None = None,
                privileged: bool = False, **algo: Any) -> PointRun:
    """Train algorithm ``name`` on ``PointEnv`` with its ``POINT_ALGOS`` settings (``algo``
    replaces keys; ``iterations`` 0 measures an untrained learner twice: the control of a
    learning check); ``privileged`` adds the env's ``privileged`` group."""
    keys, worlds, default_iterations = POINT_ALGOS[name]
    cfg = from_dict(algo_config_class(name), {**keys, **algo})
    torch.manual_seed(seed)
    env = PointEnv(worlds, seed=seed, privileged=privileged)
    alg = learner_class(name).build(env.spec, cfg, BuildContext(torch.device("cpu"), worlds))
    before = point_return(alg.act_deterministic, privileged=privileged)
    history = train_learner(alg, env, default_iterations if iterations is None else iterations)
    return PointRun(before, point_return(alg.act_deterministic, privileged=privileged), history,
                    alg)


@pytest.fixture
def bf16_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This CPU reads as one with bfloat16 products (``check_precision`` lets bf16 run): the
    bf16 tests check behaviour, which emulated products give too, only slower."""
    from robotrl.nn import linear

    monkeypatch.setattr(linear, "cpu_fields", lambda: {"flags": "avx2 avx512f avx512_bf16"})


@pytest.fixture
def point_learner() -> Callable[..., PointRun]:
    """``learn_point``: ``run = point_learner("sac")``, then ``run.before``, ``run.after``."""
    return learn_point


def _offline_menagerie() -> Path:
    """A Menagerie-shaped folder holding unitree_go1 and unitree_g1, built once per machine in
    the user cache from mjlab's wheel (``pip download --no-deps``), or the MENAGERIE_ROOT already
    set; skips (fails with ROBOTRL_REQUIRE_ROBOTS=1) when neither can be had."""
    import shutil
    import tempfile

    def unavailable(reason: str) -> None:
        if os.environ.get("ROBOTRL_REQUIRE_ROBOTS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)

    try:
        import mujoco_menagerie  # noqa: F401
    except ImportError:
        unavailable("the robot tasks need mujoco-menagerie: pip install 'robotrl[robots]'")
    given = os.environ.get("MENAGERIE_ROOT")
    if given and all((Path(given) / r).is_dir() for r in ("unitree_go1", "unitree_g1")):
        return Path(given)
    from robotrl.envs.robots import (
        MJLAB_WHEEL,
        download_mjlab_wheel,
        menagerie_root_from_wheel,
    )

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = cache / "robotrl" / f"menagerie-{MJLAB_WHEEL.replace('==', '-')}"
    if not root.is_dir():
        root.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
            try:
                wheel = download_mjlab_wheel(tmp)
            except RuntimeError as err:
                unavailable(f"no MENAGERIE_ROOT, and the robot models' wheel: {err}")
            built = menagerie_root_from_wheel(wheel, Path(tmp) / "root")
            try:  # another test process may have finished first: keep its copy
                built.rename(root)
            except OSError:
                shutil.rmtree(built, ignore_errors=True)
    return root


@pytest.fixture(scope="session")
def menagerie_root() -> Iterator[Path]:
    """MENAGERIE_ROOT set to an offline Menagerie folder for the robot tasks' tests."""
    root = _offline_menagerie()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MENAGERIE_ROOT", str(root))
        yield root
