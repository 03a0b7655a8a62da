"""Does behaviour cloning of the small VLA ground the instruction? Issue 47's diagnosis and
measure: BC on tabletop ``reach`` demonstrations (the settings of the VLA grids' BC stage),
evaluated every ``updates_per_iteration`` updates on the GRPO runs' test states and held-out
instructions (the same ``group-test-states`` / ``group-heldout-states`` draws of 128 states),
with where each episode ends and whether the instruction changes what the policy does.

    python benchmarks/vla_bc_grounding.py --seeds 0 1 2 --tag base
    python benchmarks/vla_bc_grounding.py --seeds 0 1 2 --tag aux --bc algo.aux_weight=1

Per seed and evaluation point (updates so far), on each state set: ``success``; where the
gripper ends, ``at_target`` / ``at_other`` (within ``reach_distance`` of a distractor) /
``nowhere``; and on the test states with the instruction swapped to name a distractor (its
colour and shape, same template): ``swap_follows`` (ends at the newly named object),
``swap_stays`` (ends at the originally named one), and ``swap_tv`` (total variation between
the first action token's distributions under the two instructions); ``word_attention``: the
attention mass (mean over heads and the test states, per layer) from the position that
predicts the first action token to the instruction's word positions. A policy that ends at
*an* object but not the named one has learned the visual task and not the words.

Appends one record per (tag, seed) to ``--out`` (JSON; a record already there is skipped, so
an interrupted sweep resumes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from robotrl.experiment.build import build_env, build_runner
from robotrl.experiment.compose import compose, validate
from robotrl.runners.group import draw_initial_states
from robotrl.seeding import derive_seed, seed_everything
from robotrl.types import Obs

TEST_STATES = 128
"""States per evaluation set (the VLA grids' ``algo.test_states``)."""


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--tag", default="base", help="name of this configuration in --out")
    p.add_argument("--updates", type=int, default=4000, help="BC updates")
    p.add_argument("--every", type=int, default=1000, help="updates between evaluations")
    p.add_argument("--bc-lr", type=float, default=3e-3)
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument("--episode-steps", type=int, default=20)
    p.add_argument("--policy", nargs="*", default=["policy.bins=32", "policy.patch=4"])
    p.add_argument("--bc", nargs="*", default=[], help="extra BC overrides (algo.*)")
    p.add_argument("--demos", default="runs/bench/vla_bc/demos.hdf5",
                   help="robotrl dataset collect task=tabletop kind=scripted steps=10240 "
                        "noise=0.1 options.templates=[reach] options.image_size=16 "
                        "options.max_episode_steps=20")
    p.add_argument("--runs", default="runs/bench/vla_bc")
    p.add_argument("--out", default="benchmarks/figures/vla/bc_grounding.json")
    p.add_argument("--table", nargs="+", metavar="TAG",
                   help="print the per-seed table of these tags of --out and exit")
    return p.parse_args()


def table(report: dict[str, Any], tags: list[str]) -> None:
    """Per seed and tag: test and held-out success, where test episodes end, and the best
    keypoint's R^2 on the named object's position (``—``: that tag has no run of the seed);
    per tag: the means and how many seeds reach 0.5 test success (issue 47's target: 9 of
    10)."""
    runs = {(r["tag"], r["seed"]): r for r in report["records"] if not r.get("partial")}
    seeds = sorted({s for t, s in runs if t in tags})
    print("| seed | " + " | ".join(f"{t}: test / held-out / at target, other, nowhere / "
                                    "keypoint R^2" for t in tags) + " |")
    print("|---:|" + "---|" * len(tags))
    for seed in seeds:
        cells = []
        for tag in tags:
            r = runs.get((tag, seed))
            if r is None:
                cells.append("—")
                continue
            t = r["curve"][-1]["test"]
            r2 = t.get("keypoint_target_r2")
            cells.append(f"{r['test_success']:.2f} / {r['heldout_success']:.2f} / "
                         f"{t['at_target']:.2f}, {t['at_other']:.2f}, {t['nowhere']:.2f} / "
                         + ("—" if r2 is None else f"{r2:.2f}"))
        print(f"| {seed} | " + " | ".join(cells) + " |")
    for tag in tags:
        test = [runs[(tag, s)]["test_success"] for s in seeds if (tag, s) in runs]
        held = [runs[(tag, s)]["heldout_success"] for s in seeds if (tag, s) in runs]
        if test:
            print(f"{tag}: {len(test)} seeds, test mean {sum(test) / len(test):.3f}, held-out "
                  f"mean {sum(held) / len(held):.3f}, seeds >= 0.5 test: "
                  f"{sum(x >= 0.5 for x in test)} of {len(test)}")


def _raw(env: Any) -> Any:
    while not hasattr(env, "task"):
        env = env.env
    return env


def _swap_tokens(task: Any, sim: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [N, W] naming the object after the target (cyclically), that object [N])."""
    template, target, colours = task.episode(sim)
    other = (target + 1) % colours.shape[1]
    colour = colours.gather(1, other[:, None]).squeeze(1)
    return task.words[template, colour, other], other


@torch.no_grad()
def episodes(alg: Any, env: Any, states: torch.Tensor, swap: bool = False) -> dict[str, float]:
    """Deterministic episodes from ``states`` [N, S] (N = env.num_envs): success and where the
    gripper ends; with ``swap`` the instruction names another object of the scene."""
    raw = _raw(env)
    task = raw.task
    env.set_state(states)
    obs = env.observe()
    tokens, named = _swap_tokens(task, raw.sim) if swap else (None, None)
    _, target, _ = task.episode(raw.sim)
    n = env.num_envs
    success = torch.zeros(n, dtype=torch.bool)
    grip = torch.zeros(n, 2, dtype=torch.float64)
    objects = task.object_xy(raw.sim).clone()
    done = torch.zeros(n, dtype=torch.bool)
    while not bool(done.all()):
        if swap:
            obs = {**obs, "tokens": tokens}
        objects = torch.where(done[:, None, None], objects, task.object_xy(raw.sim))
        out = env.step(alg.act_deterministic(obs))
        end = (out.terminated | out.truncated) & ~done
        final = out.info.get("final_obs", out.obs)
        grip[end] = final["policy"][end].double()
        success[end] = out.info["success"][end].bool()
        done |= end
        obs = out.obs
    d = (grip[:, None] - objects).norm(dim=-1)  # [N, 3]
    near = d < task.cfg.reach_distance
    rows = torch.arange(n)
    at_target = near[rows, target]
    at_any = near.any(1)
    result = {"success": success.float().mean().item(),
              "at_target": at_target.float().mean().item(),
              "at_other": (at_any & ~at_target).float().mean().item(),
              "nowhere": (~at_any).float().mean().item()}
    if swap:
        follows = near[rows, named]
        result = {"swap_follows": follows.float().mean().item(),
                  "swap_stays": at_target.float().mean().item(),
                  "swap_elsewhere": (at_any & ~follows & ~at_target).float().mean().item(),
                  "swap_nowhere": (~at_any).float().mean().item()}
    return result


@torch.no_grad()
def instruction_use(policy: Any, env: Any, states: torch.Tensor) -> dict[str, Any]:
    """From the first observation of ``states``: the first action token's total variation
    under the true and the swapped instruction, and per layer the attention mass from the
    position predicting the first action token (BOS) to the instruction's words."""
    raw = _raw(env)
    env.set_state(states)
    obs: Obs = {k: v for k, v in env.observe().items()}
    swapped = {**obs, "tokens": _swap_tokens(raw.task, raw.sim)[0]}
    p = policy.start(obs)[1].softmax(-1)
    q = policy.start(swapped)[1].softmax(-1)
    tv = 0.5 * (p - q).abs().sum(-1).mean().item()
    words = obs["tokens"].shape[1]
    first = policy.prefix_len - 2 - words  # patches and keypoints, then words, proprio, BOS
    x = policy._prefix(obs) + policy.pos[: policy.prefix_len]
    mass = []
    for block in policy.blocks:
        n, s, d = x.shape
        q_, k_, _ = block.qkv(block.ln1(x)).view(n, s, 3, block.heads, d // block.heads).unbind(2)
        att = (q_.transpose(1, 2) @ k_.transpose(1, 2).transpose(-1, -2)
               / (d // block.heads) ** 0.5).softmax(-1)  # [N, H, S, S]
        real = (obs["tokens"] != 0).float()  # [N, W]: the words, not the pads
        mass.append((att[:, :, -1, first:first + words] * real[:, None]).sum(-1).mean().item())
        x = block(x, None, None)[0]
    return {"swap_tv": tv, "word_attention": mass, **keypoint_tracking(policy, raw, obs)}


@torch.no_grad()
def keypoint_tracking(policy: Any, raw: Any, obs: Obs) -> dict[str, float]:
    """How well the best spatial-softmax keypoint follows the instructed object, and the best
    one any object: the R^2 of a linear fit (over the states) of the object's (x, y) from the
    keypoint's; 0 without keypoints."""
    if not getattr(policy.cfg, "keypoints", 0):
        return {}
    kept: dict[str, torch.Tensor] = {}
    hook = policy.keypoint.register_forward_hook(lambda m, i, o: kept.update(where=i[0]))
    policy._prefix(obs)
    hook.remove()
    where = kept["where"].double()  # [N, K, 2]
    objects = raw.task.object_xy(raw.sim)  # [N, 3, 2]
    _, target, _ = raw.task.episode(raw.sim)
    named = objects[torch.arange(len(target)), target]

    def r2(y: torch.Tensor) -> torch.Tensor:  # per keypoint: [K]
        x = torch.cat([where, torch.ones_like(where[..., :1])], -1).transpose(0, 1)  # [K, N, 3]
        fit = x @ torch.linalg.lstsq(x, y.expand(len(x), -1, -1)).solution
        res = (y - fit).square().sum((1, 2))
        return 1 - res / (y - y.mean(0)).square().sum()

    best_object = max(float(r2(objects[:, i]).max()) for i in range(objects.shape[1]))
    return {"keypoint_target_r2": float(r2(named).max()), "keypoint_object_r2": best_object}


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    run_dir = Path(args.runs) / f"{args.tag}_s{seed}"
    overrides = ["algo=bc", f"dataset={args.demos}", f"total_steps={args.updates}",
                 "eval_interval=0", "algo.batch_size=128", f"algo.actor_lr={args.bc_lr}",
                 f"algo.updates_per_iteration={args.every}", "eval_episodes=64",
                 f"seed={seed}", "policy=vla", *args.policy, "torch_threads=1",
                 "logger.progress=false", "logger.tensorboard=false", f"run_dir={run_dir}",
                 *args.bc]
    cfg = compose(overrides)
    validate(cfg)
    seed_everything(cfg.seed)  # as robotrl train: the same initial parameters and streams
    runner = build_runner(cfg)
    alg = runner.alg
    options = {"templates": ["reach"], "image_size": args.image_size,
               "max_episode_steps": args.episode_steps}
    envs, states = {}, {}
    for name, split, stream in (("test", "train", "group-test-states"),
                                ("heldout", "heldout", "group-heldout-states")):
        ecfg = dataclasses.replace(cfg, env=dataclasses.replace(
            cfg.env, task="tabletop", options={**options, "split": split}))
        envs[name] = build_env(ecfg, TEST_STATES, derive_seed(seed, "eval-env"), train=False)
        states[name] = draw_initial_states(envs[name], TEST_STATES, derive_seed(seed, stream))
    curve, seconds = [], 0.0
    while alg.num_updates < args.updates:
        t0 = time.perf_counter()
        metrics = alg.update()
        seconds += time.perf_counter() - t0
        point: dict[str, Any] = {"updates": alg.num_updates, "bc_seconds": seconds,
                                 "loss": metrics["loss/bc"],
                                 "token_accuracy": metrics["train/token_accuracy"],
                                 **{k: v for k, v in metrics.items()
                                    if k.startswith(("loss/aux", "train/grad_norm"))}}
        for name in envs:
            point[name] = episodes(alg, envs[name], states[name])
        point["test"].update(episodes(alg, envs["test"], states["test"], swap=True))
        point["test"].update(instruction_use(alg.policy, envs["test"], states["test"]))
        curve.append(point)
        t, h = point["test"], point["heldout"]
        print(f"[{args.tag} s{seed}] {alg.num_updates} updates {seconds:.0f} s loss "
              f"{point['loss']:.3f}: test {t['success']:.2f} (target {t['at_target']:.2f} "
              f"other {t['at_other']:.2f} none {t['nowhere']:.2f}; swapped: follows "
              f"{t['swap_follows']:.2f} stays {t['swap_stays']:.2f}, tv {t['swap_tv']:.2f}, "
              f"word attn {[round(m, 3) for m in t['word_attention']]}), held-out "
              f"{h['success']:.2f}", flush=True)
    last = curve[-1]
    from robotrl.checkpoint import save_checkpoint

    save_checkpoint(run_dir / "bc_last.pt", {"algo": alg.state_dict(), "overrides": overrides})
    return {"tag": args.tag, "seed": seed, "overrides": overrides, "bc_seconds": seconds,
            "test_success": last["test"]["success"],
            "heldout_success": last["heldout"]["success"], "curve": curve,
            "torch": torch.__version__}


def main() -> None:
    args = parse()
    torch.set_num_threads(1)
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {"records": []}
    if args.table:
        table(report, args.table)
        return
    report["about"] = __doc__.split("\n\n")[0]
    for seed in args.seeds:
        if any(r["tag"] == args.tag and r["seed"] == seed for r in report["records"]):
            print(f"[{args.tag} s{seed}] already in {out}")
            continue
        record = run_seed(args, seed)
        report = json.loads(out.read_text()) if out.exists() else {"records": []}
        report["records"].append(record)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        os.replace(tmp, out)


if __name__ == "__main__":
    main()
