"""Per-step cost of the observation container: plain ``dict[str, Tensor]`` vs ``TensorDict``.

Times, per control step of N worlds, what the training loop does with an observation: build it
from the groups a backend computes, move it to the learner's device, pick reset rows where
worlds finished (``where_done``), and write it into a [T, N, ...] rollout. Both containers do the
same tensor work; the difference is the container's own overhead. Printed as microseconds per
step and as a share of a measured native HalfCheetah step of the same N, so it reads directly as
lost env-steps/s.

    python benchmarks/obs_container.py [--num-envs 128] [--repeats 5]   # needs: pip install tensordict
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import robotrl.envs as E
from robotrl.envs.base import obs_to, where_done

GROUPS = {"policy": 17, "privileged": 29}
"""HalfCheetah's policy width and its privileged group (3 base velocities + 8 bodies + 9 geoms)."""


def time_per_step(fn, steps: int) -> float:  # noqa: ANN001
    """Microseconds per call of ``fn(t)`` over ``steps`` calls."""
    start = time.perf_counter()
    for t in range(steps):
        fn(t)
    return (time.perf_counter() - start) / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=128)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    try:
        from tensordict import TensorDict
    except ImportError:
        raise SystemExit("this benchmark compares with TensorDict: pip install tensordict") from None
    torch.set_num_threads(1)
    n, horizon = args.num_envs, 16
    raw = {k: torch.randn(n, d) for k, d in GROUPS.items()}
    reset = {k: torch.randn(n, d) for k, d in GROUPS.items()}
    done = torch.rand(n) < 0.01
    store = {k: torch.zeros(horizon, n, d) for k, d in GROUPS.items()}
    td_store = TensorDict({k: v.clone() for k, v in store.items()}, batch_size=[horizon, n])

    def plain(t: int) -> None:
        obs = obs_to({k: v for k, v in raw.items()}, "cpu")
        obs = where_done(done, reset, obs)
        for k, v in obs.items():
            store[k][t % horizon].copy_(v)

    def tensordict(t: int) -> None:
        obs = TensorDict({k: v for k, v in raw.items()}, batch_size=[n]).to("cpu")
        obs = obs.apply(lambda v, r: torch.where(done[:, None], r, v),
                        TensorDict(reset, batch_size=[n]))
        td_store[t % horizon] = obs

    env = E.make("halfcheetah", n, seed=0)
    action = torch.zeros(n, 6)
    env.reset(seed=0)
    step_us = time_per_step(lambda t: env.step(action), 300)
    rows = {"dict": [], "TensorDict": []}
    for _ in range(args.repeats):  # interleaved, so machine noise hits both alike
        rows["dict"].append(time_per_step(plain, args.steps))
        rows["TensorDict"].append(time_per_step(tensordict, args.steps))
    print(f"native HalfCheetah step, {n} worlds: {step_us:.0f} us")
    for name, times in rows.items():
        med = statistics.median(times)
        print(f"{name:>10}: median {med:6.1f} us/step (min {min(times):.1f}), "
              f"{100 * med / step_us:.1f}% of an env step")
    ratio = statistics.median(rows["TensorDict"]) / statistics.median(rows["dict"])
    print(f"TensorDict / dict: {ratio:.1f}x")


if __name__ == "__main__":
    main()
