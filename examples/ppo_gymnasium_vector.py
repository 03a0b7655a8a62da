"""A CleanRL-style single-file PPO over any Gymnasium vector env: robotrl's simulator or
Gymnasium's own, chosen by the one line in ``make_envs``; everything else is the plain
Gymnasium vector API and its vector wrappers.

    python examples/ppo_gymnasium_vector.py --sim robotrl --task hopper --total-steps 200000
    python examples/ppo_gymnasium_vector.py --sim gymnasium --task hopper --total-steps 200000

Both use Gymnasium's default autoreset (NEXT_STEP: the step after an episode's end returns the
next episode's first observation, with reward 0, and ignores its action); that step is left
out of the loss, and a time-limit truncation bootstraps from the value of the final
observation. Prints env-steps/s and the mean return of the last 20 episodes.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque

import gymnasium as gym
import numpy as np
import torch
from torch import nn

GYM_IDS = {"hopper": "Hopper-v5", "halfcheetah": "HalfCheetah-v5", "walker2d": "Walker2d-v5",
           "ant": "Ant-v5", "swimmer": "Swimmer-v5", "inverted_pendulum": "InvertedPendulum-v5"}


def make_envs(sim: str, task: str, num_envs: int, seed: int) -> gym.vector.VectorEnv:
    if sim == "robotrl":  # the only line that differs
        from robotrl.envs import as_gymnasium_vector, make

        envs = as_gymnasium_vector(make(task, num_envs, seed=seed), autoreset_mode="next_step")
    else:
        envs = gym.make_vec(GYM_IDS[task], num_envs=num_envs, vectorization_mode="sync")
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    envs = gym.wrappers.vector.ClipAction(envs)
    envs = gym.wrappers.vector.NormalizeObservation(envs)
    envs = gym.wrappers.vector.TransformObservation(envs, lambda o: np.clip(o, -10, 10))
    envs = gym.wrappers.vector.NormalizeReward(envs, gamma=0.99)
    return gym.wrappers.vector.TransformReward(envs, lambda r: np.clip(r, -10, 10))


def mlp(inp: int, out: int, scale: float) -> nn.Sequential:
    layers = [nn.Linear(inp, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, out)]
    for layer in layers[::2]:
        nn.init.orthogonal_(layer.weight, np.sqrt(2) if layer is not layers[-1] else scale)
        nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


class Agent(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int) -> None:
        super().__init__()
        self.critic = mlp(obs_dim, 1, 1.0)
        self.actor = mlp(obs_dim, act_dim, 0.01)
        self.log_std = nn.Parameter(torch.zeros(act_dim))

    def dist(self, obs: torch.Tensor) -> torch.distributions.Normal:
        return torch.distributions.Normal(self.actor(obs), self.log_std.exp())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sim", choices=["robotrl", "gymnasium"], default="robotrl")
    p.add_argument("--task", choices=sorted(GYM_IDS), default="hopper")
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--num-steps", type=int, default=128, help="rollout length per env")
    p.add_argument("--total-steps", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the summary as JSON here")
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    gamma, lam, epochs, minibatches, clip, lr = 0.99, 0.95, 10, 32, 0.2, 3e-4

    envs = make_envs(a.sim, a.task, a.num_envs, a.seed)
    n, t_len = a.num_envs, a.num_steps
    obs_dim = envs.single_observation_space.shape[0]
    act_dim = envs.single_action_space.shape[0]
    agent = Agent(obs_dim, act_dim)
    opt = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5)
    buf_obs = torch.zeros(t_len, n, obs_dim)
    buf_act = torch.zeros(t_len, n, act_dim)
    buf_logp, buf_rew, buf_val = (torch.zeros(t_len, n) for _ in range(3))
    buf_done, buf_valid = torch.zeros(t_len, n), torch.zeros(t_len, n)

    obs, _ = envs.reset(seed=a.seed)
    obs = torch.as_tensor(obs, dtype=torch.float32)
    fresh = torch.zeros(n, dtype=torch.bool)  # NEXT_STEP: the coming step only resets
    returns: deque[float] = deque(maxlen=20)
    iterations = a.total_steps // (n * t_len)
    start, steps = time.perf_counter(), 0
    for it in range(iterations):
        for g in opt.param_groups:
            g["lr"] = lr * (1 - it / iterations)
        for t in range(t_len):
            with torch.no_grad():
                d = agent.dist(obs)
                action = d.sample()
                buf_logp[t], buf_val[t] = d.log_prob(action).sum(-1), agent.critic(obs)[:, 0]
            buf_obs[t], buf_act[t], buf_valid[t] = obs, action, (~fresh).float()
            nxt, rew, term, trunc, info = envs.step(action.numpy())
            nxt = torch.as_tensor(nxt, dtype=torch.float32)
            rew = torch.as_tensor(rew, dtype=torch.float32)
            trunc_t = torch.as_tensor(trunc) & ~torch.as_tensor(term)
            if trunc_t.any():  # bootstrap a time limit from the final observation's value
                with torch.no_grad():
                    rew = rew + gamma * trunc_t * agent.critic(nxt)[:, 0]
            fresh = torch.as_tensor(term | trunc)
            buf_rew[t], buf_done[t] = rew, fresh.float()
            if "episode" in info:
                returns.extend(info["episode"]["r"][info["_episode"]].tolist())
            obs = nxt
            steps += n
        with torch.no_grad():  # GAE; a reset step (invalid) neither adds nor bootstraps
            adv = torch.zeros(t_len, n)
            last_adv, next_val = torch.zeros(n), agent.critic(obs)[:, 0]
            for t in reversed(range(t_len)):
                alive = 1.0 - buf_done[t]
                delta = buf_rew[t] + gamma * next_val * alive - buf_val[t]
                last_adv = delta + gamma * lam * alive * last_adv
                adv[t] = last_adv * buf_valid[t]
                next_val = buf_val[t]
            ret = adv + buf_val
        keep = buf_valid.flatten().bool()
        b_obs, b_act = buf_obs.flatten(0, 1)[keep], buf_act.flatten(0, 1)[keep]
        b_logp, b_adv, b_ret = (x.flatten()[keep] for x in (buf_logp, adv, ret))
        size = len(b_obs)
        for _ in range(epochs):
            for idx in torch.randperm(size).chunk(minibatches):
                d = agent.dist(b_obs[idx])
                ratio = (d.log_prob(b_act[idx]).sum(-1) - b_logp[idx]).exp()
                mb_adv = (b_adv[idx] - b_adv[idx].mean()) / (b_adv[idx].std() + 1e-8)
                pg = -torch.min(ratio * mb_adv, ratio.clamp(1 - clip, 1 + clip) * mb_adv).mean()
                v = 0.5 * (agent.critic(b_obs[idx])[:, 0] - b_ret[idx]).pow(2).mean()
                opt.zero_grad()
                (pg + 0.5 * v).backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                opt.step()
        if it % 10 == 0 or it == iterations - 1:
            mean = float(np.mean(returns)) if returns else float("nan")
            print(f"{a.sim} {a.task} step {steps:,}: return {mean:.1f} (last {len(returns)} "
                  f"episodes), {steps / (time.perf_counter() - start):,.0f} steps/s", flush=True)
    summary = {"sim": a.sim, "task": a.task, "seed": a.seed, "steps": steps,
               "steps_per_s": steps / (time.perf_counter() - start),
               "return_last20": float(np.mean(returns)) if returns else None}
    print(json.dumps(summary))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(summary, f, indent=1)
    envs.close()


if __name__ == "__main__":
    main()
