"""Brax backend: Brax's own environments (``brax.envs``) behind the batched-env protocol.

    env = BraxEnv("ant", num_envs=4096, device="cuda")       # Brax's Ant, its obs and reward

Unlike ``mjx``, these are Brax's tasks, not robotrl's: Brax's MJCF, observation, reward and
termination (Brax's Ant, say, has a 27-dim observation without contact forces). One jitted call
per step runs ``vmap(env.step)``, counts episode steps (truncation at ``max_episode_steps``,
reported apart from Brax's ``done``, which is termination only: robotrl does Brax's
``EpisodeWrapper`` job itself) and auto-resets finished worlds on device: ``vmap(env.reset)``
with fresh keys and ``where`` (``fresh_reset=True``, a new start per episode as natively), or the
worlds' first start states (``fresh_reset=False``: Brax's ``AutoResetWrapper``, cheaper).
Observations, rewards, flags and the ``reward_*`` metrics reach torch through DLPack
(zero-copy on GPU); actions go back the same way.

``get_state``/``set_state`` snapshot the whole Brax ``State`` pytree of each world (flattened to
float64 columns, exact for its float32/int32/bool leaves) plus the episode step counter.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from robotrl.config import RandomizationConfig, resolve_randomization
from robotrl.envs.base import BatchedEnv, EnvSpec, Obs, StepOut, check_action, check_action_shape
from robotrl.envs.jax_bridge import (
    GPU_LS_ITERATIONS,
    jax,
    jax_device,
    jnp,
    to_jax,
    to_torch,
    with_fields,
)
from robotrl.envs.randomizer import DomainRandomizer, RandomizedEnv, randomization_seed

# robotrl task names that differ from Brax's; every other name goes to Brax as is
ALIASES = {"half_cheetah": "halfcheetah", "humanoid_standup": "humanoidstandup"}
_REWARD_PREFIX = "reward_"


def brax_env_names() -> list[str]:
    """Names ``brax.envs.get_environment`` knows."""
    from brax import envs

    return sorted(getattr(envs, "_envs", {}))


def _make_brax_env(name: str, pipeline: str, options: dict[str, Any]) -> Any:
    import warnings

    from brax import envs

    known = brax_env_names()
    brax_name = ALIASES.get(name, name)
    if brax_name not in known:
        raise ValueError(f"unknown Brax env {name!r}; available: {', '.join(known)}")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Brax System", category=UserWarning)
        return envs.get_environment(brax_name, backend=pipeline, **options)


class BraxEnv(RandomizedEnv, BatchedEnv):
    """``num_envs`` worlds of Brax env ``name`` on ``device``.

    ``pipeline``: Brax's physics backend (``mjx`` default; ``generalized``, ``positional``,
    ``spring``). ``max_episode_steps``: truncation (Brax's default 1000). ``iterations``: the
    ``mjx`` pipeline's solver iterations; None keeps the env's on CPU and takes 1 on a GPU (and at
    most ``GPU_LS_ITERATIONS`` line-search steps, which vmap runs all of), as ``MjxEnv`` does and
    Brax's own Ant does (more iterations make MJX run a ``while_loop`` whose
    condition XLA copies to the host every iteration: Brax's HalfCheetah ran at 0.17M
    env-steps/s on an H100 that way, with ~13 device-to-host copies per step). ``options``: the
    Brax env's constructor arguments (e.g. ``ctrl_cost_weight``).

    ``randomization`` (``mjx`` pipeline only) randomizes each world's Brax ``System`` per episode
    on the device, as the ``mjx`` backend does (``envs/mjx_randomization.py``): the step then
    runs as two jitted calls (physics, then the reset of finished worlds with their new draws).
    """

    def __init__(
        self,
        name: str,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        pipeline: str = "mjx",
        max_episode_steps: int = 1000,
        fresh_reset: bool = True,
        iterations: int | None = None,
        randomization: str | dict[str, Any] | RandomizationConfig | None = None,
        **options: Any,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        self.num_envs = num_envs
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._gpu = self.device.type == "cuda"
        self._jdev = jax_device(self.device)
        self.brax_env = _make_brax_env(name, pipeline, options)
        if iterations is None and self._gpu and pipeline == "mjx":
            iterations = 1
        if iterations is not None:
            if iterations < 1:
                raise ValueError(f"iterations must be >= 1 (None: the default), got {iterations}")
            if pipeline != "mjx":
                raise ValueError(f"iterations applies to pipeline='mjx', not {pipeline!r}")
            env = self.brax_env.unwrapped
            ls = min(int(env.sys.opt.ls_iterations), GPU_LS_ITERATIONS)
            env.sys = env.sys.tree_replace({"opt.iterations": iterations, "opt.ls_iterations": ls})
        self._fresh = fresh_reset
        self._build(max_episode_steps)
        self._key = jax.device_put(jax.random.PRNGKey(seed), self._jdev)
        self._seed = seed
        self._dr: DomainRandomizer | None = None
        dr_cfg = resolve_randomization(randomization)
        if dr_cfg.enabled():
            if pipeline != "mjx":
                raise ValueError(f"randomization needs pipeline='mjx' (per-world MJX model "
                                 f"fields), got pipeline={pipeline!r}")
            self.set_randomization(dr_cfg, resample=True)
        first = self._reset_fn(self._next_keys(), self._model_fields())
        obs_dim = int(first.obs.shape[-1])
        terms = tuple(k[len(_REWARD_PREFIX):] for k in first.metrics if k.startswith(_REWARD_PREFIX))
        self._terms = terms
        low, high = self._action_bounds()
        self.spec = EnvSpec(
            obs_dim=obs_dim, action_dim=int(self.brax_env.action_size), action_low=low,
            action_high=high, control_dt=float(self.brax_env.dt),
            max_episode_steps=max_episode_steps, reward_terms=terms,
            task=name,
        )
        self._state, self._first = first, first
        self._steps = jax.device_put(jnp.zeros(num_envs, jnp.int32), self._jdev)

    # ------------------------------------------------------------------ jitted functions
    def _build(self, max_steps: int) -> None:
        env, fresh = self.brax_env, self._fresh

        def where(mask: jax.Array, a: Any, b: Any) -> Any:
            def pick(x: jax.Array, y: jax.Array) -> jax.Array:
                return jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, y)
            return jax.tree.map(pick, a, b)

        def env_for(fields: dict[str, jax.Array]) -> Any:
            """The env with one world's randomized System (no fields: the env itself)."""
            if not fields:
                return env
            world = copy.copy(env)
            world.sys = with_fields(env.sys, fields)
            return world

        def one_step(state: Any, action: jax.Array, fields: dict[str, jax.Array],
                     kick: jax.Array | None) -> Any:
            if kick is not None:  # a randomization push
                ps = state.pipeline_state
                state = state.replace(pipeline_state=ps.replace(qvel=ps.qvel + kick))
            return env_for(fields).step(state, action)

        def reset(keys: jax.Array, fields: dict[str, jax.Array]) -> Any:
            return jax.vmap(lambda key, f: env_for(f).reset(key))(keys, fields)

        def step(state: Any, first: Any, steps: jax.Array, action: jax.Array, keys: jax.Array,
                 fields: dict[str, jax.Array], kick: jax.Array | None, auto_reset: bool
                 ) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
            nxt = jax.vmap(one_step)(state, action, fields, kick)
            steps = steps + 1
            # Brax's `done` is termination; a world that terminates at the limit is terminated
            terminated = nxt.done > 0.5
            truncated = (steps >= max_steps) & ~terminated
            out = {"final_obs": nxt.obs, "reward": nxt.reward, "terminated": terminated,
                   "truncated": truncated, "metrics": nxt.metrics, "obs": nxt.obs}
            if auto_reset:
                nxt, steps = restart(nxt, first, steps, terminated | truncated, keys, fields)
                out["obs"] = nxt.obs
            return nxt, steps, out

        def restart(state: Any, first: Any, steps: jax.Array, done: jax.Array, keys: jax.Array,
                    fields: dict[str, jax.Array]) -> tuple[Any, jax.Array]:
            start = reset(keys, fields) if fresh else first
            return where(done, start, state), jnp.where(done, 0, steps)

        self._reset_fn = jax.jit(reset)  # runs where the keys live
        self._step_fn = jax.jit(step, static_argnames="auto_reset")
        self._restart_fn = jax.jit(restart)

    def _model_fields(self) -> dict[str, jax.Array]:
        return {} if self._dr is None else self._dr.model_fields()

    def _make_randomizer(self, cfg: RandomizationConfig) -> DomainRandomizer:
        from robotrl.envs.mjx_randomization import MjxRandomizer

        sys = self.brax_env.unwrapped.sys
        # the observation's shape without running a reset (Brax's observation_size runs one)
        obs = jax.eval_shape(self.brax_env.reset, jax.random.PRNGKey(0)).obs
        obs_dim = int(obs.shape[-1])
        return MjxRandomizer(cfg, sys.mj_model, sys, obs_dim, self.num_envs,
                             randomization_seed(self._seed), self.device)

    def _next_keys(self) -> jax.Array:
        keys = jax.random.split(self._key, self.num_envs + 1)
        self._key = keys[0]
        return keys[1:]

    def _action_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        sys = getattr(self.brax_env, "sys", None)
        rng = getattr(sys, "actuator_ctrlrange", None)
        limited = getattr(sys, "actuator_ctrllimited", None)
        n = int(self.brax_env.action_size)
        if rng is None or (limited is not None and not bool(jnp.all(limited))):
            return -torch.ones(n), torch.ones(n)  # Brax's envs act in [-1, 1]
        r = torch.tensor(jax.device_get(rng).tolist(), dtype=torch.float32).reshape(n, 2)
        return r[:, 0].clone(), r[:, 1].clone()

    # ------------------------------------------------------------------ protocol
    def reset(self, seed: int | None = None) -> Obs:
        dr = self._dr
        if seed is not None:
            self._key = jax.device_put(jax.random.PRNGKey(seed), self._jdev)
            if dr is not None:
                dr.gen.manual_seed(randomization_seed(seed))
        if dr is not None:
            dr.on_reset(self._all_worlds())
        self._state = self._first = self._reset_fn(self._next_keys(), self._model_fields())
        self._steps = jnp.zeros_like(self._steps)
        obs = to_torch(self._state.obs).to(torch.float32)
        return {"policy": obs if dr is None else dr.observe(obs.double()).float()}

    def step(self, action: torch.Tensor) -> StepOut:
        if self._gpu:
            check_action_shape(action, self.spec, self.num_envs)
        else:
            check_action(action, self.spec, self.num_envs)
        dr = self._dr
        act, kick = action.detach().to(self.device, torch.float64), None
        if dr is not None:
            act = dr.action(act)
            kick = dr.qvel_kick(int(self.brax_env.unwrapped.sys.nv))
        keys = self._next_keys() if self._fresh else self._key
        self._state, self._steps, out = self._step_fn(
            self._state, self._first, self._steps, to_jax(act.to(torch.float32)), keys,
            self._model_fields(), kick, auto_reset=dr is None)
        terms = {k: to_torch(out["metrics"][_REWARD_PREFIX + k]).to(torch.float32)
                 for k in self._terms}
        terminated = to_torch(out["terminated"]).to(torch.bool)
        truncated = to_torch(out["truncated"]).to(torch.bool)
        final_obs = to_torch(out["final_obs"]).to(torch.float32)
        obs = to_torch(out["obs"]).to(torch.float32)
        if dr is not None:  # new draws for the finished worlds, then their reset with them
            done = terminated | truncated
            final_obs = dr.observe(final_obs.double()).float()
            dr.after_step(to_torch(self._steps).long().masked_fill(done, 0))
            dr.on_reset(done)
            self._state, self._steps = self._restart_fn(
                self._state, self._first, self._steps, to_jax(done), keys, self._model_fields())
            reset_obs = dr.observe(to_torch(self._state.obs).double()).float()
            obs = torch.where(done[:, None], reset_obs, final_obs)
        info = {"final_obs": {"policy": final_obs}, "reward_terms": terms}
        return StepOut({"policy": obs}, to_torch(out["reward"]).to(torch.float32), terminated,
                       truncated, info)

    # ------------------------------------------------------------------ snapshots
    def get_state(self) -> torch.Tensor:
        """[N, S] float64: every leaf of each world's Brax ``State``, then its step count."""
        leaves = jax.tree.leaves(self._state) + [self._steps]
        cols = [to_torch(x).reshape(self.num_envs, -1).to(torch.float64) for x in leaves]
        return torch.cat(cols, dim=1)

    def set_state(self, state: torch.Tensor, env_ids: torch.Tensor | None = None) -> None:
        """Restore worlds ``env_ids`` (all when None) from rows of ``get_state()``."""
        n = self.num_envs
        current = self.get_state()
        ids = torch.arange(n, device=self.device) if env_ids is None else \
            torch.as_tensor(env_ids, device=self.device).long().reshape(-1)
        state = torch.as_tensor(state).detach().to(self.device, torch.float64)
        if tuple(state.shape) != (len(ids), current.shape[1]):
            raise ValueError(f"state has shape {tuple(state.shape)}, expected "
                             f"{(len(ids), current.shape[1])} = (len(env_ids), state size)")
        ids_cpu = ids.cpu()
        if len(ids_cpu) and (int(ids_cpu.min()) < 0 or int(ids_cpu.max()) >= n):
            raise ValueError(f"env_ids must be in [0, {n}), got {ids_cpu.tolist()}")
        if len(ids_cpu.unique()) != len(ids_cpu):
            raise ValueError("env_ids must be unique")
        current[ids] = state
        rows = current.cpu().numpy()  # not a hot path: through the host, any leaf dtype
        leaves, treedef = jax.tree.flatten(self._state)
        new, col = [], 0
        for x in leaves + [self._steps]:
            size = x.size // n
            block = rows[:, col:col + size].reshape(x.shape)
            col += size
            if not jnp.issubdtype(x.dtype, jnp.inexact):
                block = block.round()
            new.append(jax.device_put(block.astype(x.dtype), self._jdev))
        self._state = jax.tree.unflatten(treedef, new[:-1])
        self._steps = new[-1]

    def state_dict(self) -> dict[str, Any]:
        """Every world's state (``get_state``), the first states and the reset key."""
        first = jax.tree.leaves(self._first)
        return {"randomization": None if self._dr is None else self._dr.state_dict(),
                "state": self.get_state().cpu(),
                "first": [torch.from_numpy(jax.device_get(x).copy()) for x in first],
                "key": torch.from_numpy(jax.device_get(jax.random.key_data(self._key))
                                        if jnp.issubdtype(self._key.dtype, jax.dtypes.prng_key)
                                        else jax.device_get(self._key).copy())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load_randomization(state.get("randomization"))
        self.set_state(state["state"])
        leaves, treedef = jax.tree.flatten(self._first)
        self._first = jax.tree.unflatten(
            treedef, [jax.device_put(t.numpy(), self._jdev) for t in state["first"]])
        self._key = jax.device_put(state["key"].numpy(), self._jdev)
