"""IQL against d3rlpy 2.8.1 in lockstep for thousands of updates on a real dataset's batches.

    MINARI_DATASETS_PATH=DIR python benchmarks/iql_lockstep.py            # 3,000 updates
    MINARI_DATASETS_PATH=DIR python benchmarks/iql_lockstep.py --updates 1000 --hidden 64

``tests/reference/test_d3rlpy.py`` holds our IQL to d3rlpy's for 4 updates on random data. This
runs the same machinery (its ``run_ours`` and ``run_peer``: same initial weights, the batches
handed to both, every parameter recorded after every update, float64) for ``--updates`` updates
on batches of a real dataset, viewed as our learner trains on it: observations standardized,
actions in [-1, 1], rewards times IQL's 1000 / (return range), the data's own terminals. The
hyperparameters are the offline grid's (``benchmarks/grids/offline_vs_d3rlpy.yaml``: expectile
0.7, temperature 1/3, max weight 100, tau 0.005, learning rates 3e-4, batch 256, d3rlpy's Q/V
order and log-std map) with a narrower network (``--hidden``; the recorded per-update state grows
with it) and without the actor's cosine schedule (applied per update by d3rlpy and per
iteration by ours; measured apart, ``benchmarks/README.md``).

Prints and writes (``--out``, default ``benchmarks/figures/iql_lockstep.json``), at updates 1,
10, 100, 500, 1000, 2000, ... and the last: the largest difference between the two sides'
parameters, relative to the largest magnitude of that tensor, and both sides' V loss. A learner
that drifts from d3rlpy's in a regime the 4-update test never reaches shows here as a difference
growing past float64 round-off (~1e-14).

Needs d3rlpy's venv (``$ROBOTRL_D3RLPY_PYTHON``, as the reference tests) and the dataset
(``--dataset``, default ``robotrl/hopper/medium-replay-v0``: ``benchmarks/offline_datasets.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "reference"))
import test_d3rlpy as ref  # noqa: E402  (the reference test's machinery)

from robotrl.algos.offline import IQL, IQLConfig  # noqa: E402
from robotrl.data import load_dataset  # noqa: E402

BATCH = 256


def batches(dataset: str, updates: int, seed: int) -> tuple[list[dict[str, torch.Tensor]], int, int]:
    """``updates`` batches of the dataset as our IQL views it (float64); (batches, obs, act)."""
    data = load_dataset(dataset)
    obs_dim, act_dim = data.observations.shape[1], data.actions.shape[1]
    view = IQL(obs_dim, -torch.ones(act_dim), torch.ones(act_dim), IQLConfig(batch_size=BATCH),
               seed=seed)
    view.attach(data)
    out = []
    for _ in range(updates):
        b = view.sample()  # the learner's own batch draw
        out.append({"obs": b["obs"], "action": b["action"], "reward": b["reward"],
                    "next_obs": b["next_obs"], "terminated": b["terminated"].bool(),
                    "truncated": torch.zeros(BATCH, dtype=torch.bool)})
    return out, obs_dim, act_dim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="robotrl/hopper/medium-replay-v0")
    parser.add_argument("--updates", type=int, default=3000)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--seed", type=int, default=5, help="the batches' draw")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/figures/iql_lockstep.json"))
    args = parser.parse_args()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    data, obs_dim, act_dim = batches(args.dataset, args.updates, args.seed)
    hidden = (args.hidden, args.hidden)
    # the reference test's module constants, sized for this run
    ref.OBS, ref.ACT, ref.BATCH, ref.UPDATES, ref.HIDDEN = obs_dim, act_dim, BATCH, args.updates, hidden
    ref.make_batches = lambda: data
    cfg = IQLConfig(hidden=hidden, batch_size=BATCH, updates_per_iteration=args.updates,
                    normalize_obs=False, gamma=0.99, tau=0.005, actor_lr=3e-4, critic_lr=3e-4,
                    expectile=0.7, temperature=1 / 3, max_weight=100.0, actor_cosine=False,
                    normalize_reward=False, q_on_updated_value=False, actor_on_updated_value=True,
                    sigmoid_log_std=True, log_std_range=(-5.0, 2.0))
    case = ref.cases()["iql"]
    case.learner = lambda: IQL(obs_dim, -torch.ones(act_dim), torch.ones(act_dim), cfg, seed=0)
    case.d3rlpy = {"batch_size": BATCH, "gamma": 0.99, "tau": 0.005, "actor_learning_rate": 3e-4,
                   "critic_learning_rate": 3e-4, "n_critics": 2, "expectile": 0.7,
                   "weight_temp": 3.0, "max_weight": 100.0}
    t0 = time.perf_counter()
    init, records = ref.run_ours(case, pytest.MonkeyPatch())
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp)
        try:
            with ref.serve(job / "peer_stderr.txt") as peer:
                out = ref.run_peer(case, init, records, job, peer)
        except ref.PeerError as err:
            raise SystemExit(str(err)) from None
    rows = []
    marks = {1, 10, 100, 500, args.updates} | set(range(1000, args.updates + 1, 1000))
    for k in sorted(m - 1 for m in marks if m <= args.updates):
        theirs = ref.theirs_at(out, k, "param")
        ours = records[k]["param"]
        rel = max(float(np.max(np.abs(ours[n].numpy() - v)) / max(np.max(np.abs(v)), 1e-300))
                  for n, v in theirs.items())
        v_ours = float(records[k]["metrics"]["loss/value"])
        v_theirs = float(ref.theirs_at(out, k, "loss")["v_loss"])
        rows.append({"update": k + 1, "max_relative_param_difference": rel,
                     "v_loss_ours": v_ours, "v_loss_d3rlpy": v_theirs})
        print(f"update {k + 1:6d}: parameters differ by at most {rel:.1e} of the tensor's largest "
              f"value; V loss ours {v_ours:.6g}, d3rlpy {v_theirs:.6g}", flush=True)
    terminal = float(torch.cat([b["terminated"] for b in data]).double().mean())
    result = {"dataset": args.dataset, "updates": args.updates, "hidden": list(hidden),
              "batch": BATCH, "batch_seed": args.seed, "terminal_fraction": terminal,
              "seconds": time.perf_counter() - t0, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(args.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
