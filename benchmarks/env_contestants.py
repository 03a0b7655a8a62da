"""The contestants ``env_throughput.py`` times, each stepping the same pre-generated actions.

``Ours`` (robotrl's native env), ``BatchStep`` (its ``mujoco.batch.Batch`` with no task layer),
``RawRollout`` (``mujoco.rollout``: the physics-only ceiling) and ``VecPeer`` over the
Gymnasium and SB3 vector envs that ``gym_vector`` and ``sb3_vector`` make. Why each is built
as it is: benchmarks/README.md.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import mujoco
import mujoco.rollout
import numpy as np
import torch
from mujoco.batch import Batch, SimulationError

POOL = 40
"""Pre-generated action batches each contestant cycles through."""
ROLLOUT_CHUNK = 20
"""Control steps per ``mujoco.rollout`` call, and between restarts of the two physics baselines."""


def action_pool(n: int, act_dim: int, seed: int = 0) -> np.ndarray:
    """[POOL, n, act_dim] float32 uniform in [-1, 1]; the same seed gives every contestant the same."""
    return np.random.default_rng(seed).uniform(-1, 1, (POOL, n, act_dim)).astype(np.float32)


class Contestant(Protocol):
    def step(self) -> int:
        """Do one unit of work; return the env-steps it made."""

    def close(self) -> None: ...


class VecPeer:
    """An env of ``n`` worlds (or a vector env of ``n`` sub-envs) stepped with the pool's
    actions in turn."""

    def __init__(self, env: Any, n: int, actions: Any) -> None:
        self.env, self.n, self.i = env, n, 0
        self.actions = actions

    def step(self) -> int:
        self.env.step(self.actions[self.i % POOL])
        self.i += 1
        return self.n

    def close(self) -> None:
        self.env.close()


class Ours(VecPeer):
    """``robotrl.envs.make(task, n)`` stepped with auto-reset."""

    def __init__(self, task: str, n: int) -> None:
        import robotrl.envs as renvs

        env = renvs.make(task, n)
        super().__init__(env, n, torch.from_numpy(action_pool(n, env.spec.action_dim)))
        # fresh samples of the reset distribution, where the physics baselines restart every
        # ROLLOUT_CHUNK steps: they have no resets, and a fallen Humanoid left on the floor
        # costs twice the physics of a standing one (random actions end its episodes in ~24)
        self.reset_rows = self.env.batch.state.copy()
        self.reset_state = self.env.get_state().cpu().numpy().copy()  # mjSTATE_FULLPHYSICS


class BatchStep:
    """A copy of ours' ``Batch`` (same threads and persistence) stepped with no task layer.

    Restarts from ours' reset states every ``ROLLOUT_CHUNK`` steps, as ``RawRollout`` does.
    """

    def __init__(self, ours: Ours) -> None:
        src = ours.env.batch
        self.batch = Batch(ours.env.model, src.nsim, src.nthread, persistent=src.persistent)
        self.rows = ours.reset_rows
        self.ctrl = self.batch.bind("ctrl")
        self.frame_skip = ours.env.task.frame_skip
        self.actions = action_pool(src.nsim, ours.env.model.nu)
        self.n, self.i = src.nsim, 0

    def step(self) -> int:
        if self.i % ROLLOUT_CHUNK == 0:
            self.batch.state[:] = self.rows
        self.ctrl[:] = self.actions[self.i % POOL]
        self.i += 1
        try:
            self.batch.step(nstep=self.frame_skip)
        except SimulationError:
            pass  # those worlds kept their state; the benchmark goes on
        return self.n

    def close(self) -> None:
        pass


class RawRollout:
    """``mujoco.rollout.Rollout``: the physics-only ceiling on the same model and threads.

    Each call runs ``ROLLOUT_CHUNK`` control steps from ours' reset states.
    """

    def __init__(self, ours: Ours) -> None:
        env = ours.env
        model, n, fs = env.model, env.num_envs, env.task.frame_skip
        nthread = env.batch.nthread
        self.runner = mujoco.rollout.Rollout(nthread=nthread if nthread > 1 else 0)
        self.data = [mujoco.MjData(model) for _ in range(max(nthread, 1))]
        self.models = [model] * n
        self.nstep = fs * ROLLOUT_CHUNK
        # mujoco.rollout takes mjSTATE_FULLPHYSICS; ours' state appends USERDATA last (a
        # task's episode variables: the robots' commands), which the physics never reads
        physics = mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_FULLPHYSICS)
        self.initial = np.ascontiguousarray(ours.reset_state[:, :physics])
        acts = action_pool(n, model.nu).astype(np.float64).transpose(1, 0, 2)  # [n, POOL, nu]
        self.controls = [  # [n, nstep, nu]: each control step's action held for fs substeps
            np.ascontiguousarray(np.repeat(acts[:, k:k + ROLLOUT_CHUNK], fs, axis=1))
            for k in range(0, POOL - ROLLOUT_CHUNK + 1, ROLLOUT_CHUNK)
        ]
        self.state = np.empty((n, self.nstep, self.initial.shape[1]))
        self.sensordata = np.empty((n, self.nstep, model.nsensordata))
        self.n, self.i = n, 0

    def step(self) -> int:
        self.runner.rollout(
            self.models, self.data, self.initial, self.controls[self.i % len(self.controls)],
            skip_checks=True, nstep=self.nstep, state=self.state, sensordata=self.sensordata,
        )
        self.i += 1
        return self.n * ROLLOUT_CHUNK

    def close(self) -> None:
        self.runner.close()


def gym_vector(gym_id: str, k: int, subprocess_envs: bool) -> Any:
    import gymnasium as gym

    fns = [functools.partial(gym.make, gym_id)] * k
    same_step = gym.vector.AutoresetMode.SAME_STEP
    # forkserver, as SB3's default: forking a process that runs thread pools is unsafe
    if subprocess_envs:
        env = gym.vector.AsyncVectorEnv(fns, autoreset_mode=same_step, context="forkserver")
    else:
        env = gym.vector.SyncVectorEnv(fns, autoreset_mode=same_step)
    env.reset(seed=0)
    return env


def sb3_vector(gym_id: str, k: int, subprocess_envs: bool) -> Any:
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    fns = [functools.partial(gym.make, gym_id)] * k
    env = SubprocVecEnv(fns, start_method="forkserver") if subprocess_envs else DummyVecEnv(fns)
    env.seed(0)
    env.reset()
    return env
