"""JaxGCRL's CRL update per network depth, on one CPU thread: the JAX side of ``crl_depth.py``.

    XLA_FLAGS=--xla_cpu_multi_thread_eigen=false OMP_NUM_THREADS=1 \\
        /work/venvs/jaxgcrl/bin/python benchmarks/crl_jaxgcrl.py \\
        --depths 4 16 64 --width 256 --batch 256 --updates 10 --repeats 3

Runs in its own venv, never robotrl's (it does not import robotrl). Install recipe::

    python3.11 -m venv /work/venvs/jaxgcrl
    /work/venvs/jaxgcrl/bin/pip install jax==0.4.35 jaxlib==0.4.35 brax==0.12.3 mujoco==3.2.7 \\
        mujoco-mjx==3.2.7 'numpy<2' flax==0.10.4 optax==0.2.5
    /work/venvs/jaxgcrl/bin/pip install --no-deps jaxgcrl==0.2.8
    /work/venvs/jaxgcrl/bin/pip install wandb wandb-osh tyro matplotlib==3.8.4 scipy

(``import jaxgcrl`` pulls in ``jaxgcrl.utils.env``, which imports wandb and wandb_osh; pip then
warns that jaxgcrl pins jax 0.4.25 and CUDA wheels, which the CPU run does not need.)

What is timed: one CRL update as ``CRL.train_fn``'s ``update_networks`` does it per minibatch,
i.e. jaxgcrl's own ``update_actor_and_alpha`` (actor + temperature, Adam) then ``update_critic``
(forward InfoNCE + logsumexp penalty, Adam), jitted as one function, with jaxgcrl's ``Actor`` and
two ``Encoder``s (phi(s, a), psi(g)) and its ``CRL`` defaults otherwise (``norm`` energy, repr
dim 64, lr 3e-4). Shapes are JaxGCRL's ``reacher``: state 10, goal 3 (indices 4-6), action 2.
The minibatch is synthetic (random states, actions and future states; the goal is taken from
the future state as ``flatten_batch`` does): replay sampling is not timed. Compilation and one
warm-up update are excluded; each timing is ``--updates`` updates then ``block_until_ready``.
Reported per depth: the median updates/s of ``--repeats`` timings, every timing, the parameters
of the three networks, and CPU seconds per wall second (about 1.0 on one thread).

Depth: jaxgcrl's ``n_hidden`` counts [Dense, (LayerNorm), swish] units and
``skip_connections=k`` adds an identity skip every k units after the first one. With
``n_hidden = depth + 1``, ``skip_connections = 4`` and ``use_ln = True`` each network is one
input unit, ``depth / 4`` residual blocks of 4 x [Dense, LayerNorm, swish] and a Dense head:
the paper's ("1000 Layer Networks for Self-Supervised RL") network and robotrl's ``DeepResNet``
at ``depth``, so ``depth`` here means dense layers inside residual blocks, as in ``crl_depth.py``.
``CRL.train_fn`` passes ``use_ln`` to the encoders but not to the actor; ``--actor-ln`` (default)
gives the actor LayerNorm too, as in the paper and robotrl, ``--no-actor-ln`` is jaxgcrl's own.
"""

from __future__ import annotations

import os


def pin_one_thread() -> None:
    """Single-threaded XLA CPU (no Eigen thread pool for dots/convolutions), CPU backend only;
    must run before jax is imported."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_multi_thread_eigen" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


pin_one_thread()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from importlib.metadata import version  # noqa: E402
from typing import Any  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax.training.train_state import TrainState  # noqa: E402
from jaxgcrl.agents.crl.crl import CRL, TrainingState, Transition  # noqa: E402
from jaxgcrl.agents.crl.losses import update_actor_and_alpha, update_critic  # noqa: E402
from jaxgcrl.agents.crl.networks import Actor, Encoder  # noqa: E402
from jaxgcrl.envs.reacher import Reacher  # noqa: E402

LAYERS_PER_BLOCK = 4
Update = Callable[[TrainingState, jax.Array, Transition], tuple[TrainingState, jax.Array, Any]]


@dataclass(frozen=True)
class Shapes:
    """The dimensions the CRL networks see: state (without goal), goal indices into the state,
    action."""

    state_dim: int
    goal_indices: tuple[int, ...]
    action_dim: int

    @property
    def obs_dim(self) -> int:
        return self.state_dim + len(self.goal_indices)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--depths", type=int, nargs="+", default=[4, 16, 64],
                   help="dense layers in residual blocks of 4 (multiples of 4)")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repr-dim", type=int, default=64)
    p.add_argument("--updates", type=int, default=10, help="updates per timing")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--actor-ln", action=argparse.BooleanOptionalAction, default=True,
                   help="LayerNorm in the actor (jaxgcrl's CRL.train_fn: off)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    bad = [d for d in args.depths if d < LAYERS_PER_BLOCK or d % LAYERS_PER_BLOCK]
    if bad:
        p.error(f"--depths must be positive multiples of {LAYERS_PER_BLOCK}, got {bad}")
    return args


def reacher_shapes() -> Shapes:
    env = Reacher()
    return Shapes(env.state_dim, tuple(int(i) for i in env.goal_indices), env.action_size)


def make_agent(depth: int, width: int, batch: int, repr_dim: int) -> CRL:
    """jaxgcrl's CRL config whose networks are ``depth / 4`` residual blocks (module docstring)."""
    return CRL(batch_size=batch, h_dim=width, n_hidden=depth + 1,
               skip_connections=LAYERS_PER_BLOCK, use_ln=True, repr_dim=repr_dim)


def build_networks(agent: CRL, shapes: Shapes, actor_ln: bool) -> dict[str, nn.Module]:
    """Actor, phi(s, a) and psi(g) as ``CRL.train_fn`` builds them (plus ``actor_ln``)."""
    common = dict(network_width=agent.h_dim, network_depth=agent.n_hidden,
                  skip_connections=agent.skip_connections, use_relu=agent.use_relu)
    return {
        "actor": Actor(action_size=shapes.action_dim, use_ln=actor_ln, **common),
        "sa_encoder": Encoder(repr_dim=agent.repr_dim, use_ln=agent.use_ln, **common),
        "g_encoder": Encoder(repr_dim=agent.repr_dim, use_ln=agent.use_ln, **common),
    }


def init_training_state(agent: CRL, networks: dict[str, nn.Module], shapes: Shapes,
                        key: jax.Array) -> TrainingState:
    """Parameters and Adam states as ``CRL.train_fn`` initializes them."""
    actor_key, sa_key, g_key = jax.random.split(key, 3)
    actor = networks["actor"]
    actor_state = TrainState.create(
        apply_fn=actor.apply, params=actor.init(actor_key, jnp.ones([1, shapes.obs_dim])),
        tx=optax.adam(learning_rate=agent.policy_lr))
    sa_input = jnp.ones([1, shapes.state_dim + shapes.action_dim])
    critic_params = {
        "sa_encoder": networks["sa_encoder"].init(sa_key, sa_input),
        "g_encoder": networks["g_encoder"].init(g_key, jnp.ones([1, len(shapes.goal_indices)])),
    }
    critic_state = TrainState.create(apply_fn=None, params=critic_params,
                                     tx=optax.adam(learning_rate=agent.critic_lr))
    alpha_state = TrainState.create(apply_fn=None,
                                    params={"log_alpha": jnp.asarray(0.0, dtype=jnp.float32)},
                                    tx=optax.adam(learning_rate=agent.alpha_lr))
    return TrainingState(env_steps=jnp.zeros(()), gradient_steps=jnp.zeros(()),
                         actor_state=actor_state, critic_state=critic_state,
                         alpha_state=alpha_state)


def loss_context(agent: CRL, shapes: Shapes) -> dict[str, Any]:
    """The ``context`` dict ``update_networks`` hands the loss functions (the keys they read)."""
    return {
        **vars(agent),
        "state_size": shapes.state_dim,
        "action_size": shapes.action_dim,
        "goal_size": len(shapes.goal_indices),
        "obs_size": shapes.obs_dim,
        "goal_indices": jnp.asarray(shapes.goal_indices),
        "target_entropy": -0.5 * shapes.action_dim,
    }


def make_update(context: dict[str, Any], networks: dict[str, nn.Module]) -> Update:
    """``CRL.train_fn``'s ``update_networks`` (one minibatch: actor + alpha, then critic),
    jitted with the training state donated as the training loop's scan carries it."""

    def update(training_state: TrainingState, key: jax.Array,
               transitions: Transition) -> tuple[TrainingState, jax.Array, Any]:
        key, critic_key, actor_key = jax.random.split(key, 3)
        training_state, actor_metrics = update_actor_and_alpha(
            context, networks, transitions, training_state, actor_key)
        training_state, critic_metrics = update_critic(
            context, networks, transitions, training_state, critic_key)
        training_state = training_state.replace(gradient_steps=training_state.gradient_steps + 1)
        return training_state, key, {**actor_metrics, **critic_metrics}

    return jax.jit(update, donate_argnums=0)


def random_minibatch(shapes: Shapes, batch: int, key: jax.Array) -> Transition:
    """A minibatch shaped as ``flatten_batch`` emits it: observation = [state, goal] with the goal
    read from ``future_state``."""
    state_key, action_key, future_key = jax.random.split(key, 3)
    state = jax.random.normal(state_key, (batch, shapes.state_dim))
    future_state = jax.random.normal(future_key, (batch, shapes.state_dim))
    goal = future_state[:, jnp.asarray(shapes.goal_indices)]
    return Transition(
        observation=jnp.concatenate([state, goal], axis=1),
        action=jax.random.uniform(action_key, (batch, shapes.action_dim), minval=-1.0, maxval=1.0),
        reward=jnp.zeros(batch),
        discount=jnp.ones(batch),
        extras={"state": state, "future_state": future_state},
    )


def count_params(state: TrainingState) -> int:
    trees = (state.actor_state.params, state.critic_state.params)
    return sum(leaf.size for leaf in jax.tree_util.tree_leaves(trees))


def bench_depth(depth: int, shapes: Shapes, args: argparse.Namespace) -> dict[str, Any]:
    """Build, compile, warm up, then time ``args.repeats`` x ``args.updates`` updates."""
    agent = make_agent(depth, args.width, args.batch, args.repr_dim)
    networks = build_networks(agent, shapes, args.actor_ln)
    init_key, data_key, key = jax.random.split(jax.random.PRNGKey(args.seed), 3)
    state = init_training_state(agent, networks, shapes, init_key)
    params = count_params(state)
    minibatch = random_minibatch(shapes, args.batch, data_key)
    update = make_update(loss_context(agent, shapes), networks)

    start = time.perf_counter()
    state, key, _ = jax.block_until_ready(update(state, key, minibatch))
    print(f"depth {depth}: {params} params, compile + first update "
          f"{time.perf_counter() - start:.1f} s", file=sys.stderr)
    state, key, _ = jax.block_until_ready(update(state, key, minibatch))

    rates, cpu_per_wall = [], []
    for _ in range(args.repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.updates):
            state, key, _ = update(state, key, minibatch)
        jax.block_until_ready(state)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        rates.append(args.updates / wall)
        cpu_per_wall.append(cpu / wall)
    print(f"depth {depth}: {statistics.median(rates):.2f} updates/s "
          f"({', '.join(f'{r:.2f}' for r in rates)}), CPU/wall "
          f"{statistics.median(cpu_per_wall):.2f}", file=sys.stderr)
    return {"updates_per_s": statistics.median(rates), "all": rates, "params": params,
            "cpu_per_wall": statistics.median(cpu_per_wall)}


def notes(args: argparse.Namespace) -> str:
    actor = "with" if args.actor_ln else "without (as CRL.train_fn)"
    return (f"one jitted update_actor_and_alpha + update_critic (CRL.update_networks), "
            f"jaxgcrl reacher shapes, synthetic minibatch; depth D = CRL(n_hidden=D+1, "
            f"skip_connections=4, use_ln=True): input unit + D/4 residual blocks of "
            f"4 x [Dense, LayerNorm, swish] + head; actor {actor} LayerNorm; "
            f"XLA_FLAGS={os.environ['XLA_FLAGS']!r}, compile and one warm-up excluded")


def main() -> None:
    args = parse()
    with contextlib.redirect_stdout(sys.stderr):
        shapes = reacher_shapes()
        depths = {str(d): bench_depth(d, shapes, args) for d in args.depths}
    print(json.dumps({"jaxgcrl": version("jaxgcrl"), "jax": jax.__version__, "depths": depths,
                      "width": args.width, "batch": args.batch, "repr_dim": args.repr_dim,
                      "notes": notes(args)}))


if __name__ == "__main__":
    main()
