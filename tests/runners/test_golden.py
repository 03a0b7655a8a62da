"""Golden runs: fixed-seed PPO, TRPO and SAC runs on HalfCheetah and Hopper (native backend, CPU)
through the same build path as ``robotrl train``, compared with values recorded before a
refactor (``tests/fixtures/golden.json``).

Each recording names its torch build and its CPU (vendor and torch's kernel level): on a
recorded (build, CPU) pair the comparison is exact, so a refactor that moves code keeps every
logged metric, the evaluation and the exported actor's parameters bit for bit. Elsewhere (CI
also tests the newest torch; an Intel and an AMD CPU round some kernels differently: 1% apart
after 12 PPO iterations on HalfCheetah with the same torch) the numbers must agree within
``OTHER_BUILD_RTOL`` with the recording of the same CPU, else of the same build; chaotic
dynamics can amplify a last-bit difference, so a failure there is reported with both named. A
change that must alter the numbers re-records them on every recorded CPU it can
(``python tests/runners/test_golden.py`` replaces this machine's recording and keeps the
others) in the same commit and says why.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from robotrl.config import TrainConfig, from_dict
from robotrl.experiment.build import build_runner
from robotrl.nn.linear import cpu_fields
from robotrl.seeding import seed_everything

DATA = Path(__file__).parents[1] / "fixtures" / "golden.json"
OTHER_BUILD_RTOL = 1e-3
"""Relative tolerance of metrics on a torch build other than the recording one."""

RUNS: dict[str, dict[str, Any]] = {
    "ppo": {"rollout_steps": 16, "actor_hidden": [32, 32], "critic_hidden": [32, 32],
            "num_epochs": 2},
    "trpo": {"rollout_steps": 16, "actor_hidden": [32, 32], "critic_hidden": [32, 32],
             "critic_minibatches": 4, "critic_epochs": 2},
    "sac": {"collect_steps": 8, "actor_hidden": [32, 32], "critic_hidden": [32, 32],
            "batch_size": 64, "learning_starts": 256, "actor_update_interval": 2},
}
"""Per-algorithm settings: small networks, every code path of the update exercised."""
TASKS: tuple[str, ...] = ("halfcheetah", "hopper")
STEPS: dict[str, int] = {"ppo": 8 * 16 * 12, "trpo": 8 * 16 * 12, "sac": 8 * 8 * 12}
"""12 iterations of 8 worlds each."""


def golden_run(algo: str, task: str, run_dir: Path) -> dict[str, Any]:
    """Train one golden run; its metrics (no timings), final evaluation and actor checksum."""
    cfg = from_dict(TrainConfig, {
        "algo": {"name": algo, **RUNS[algo]},
        "env": {"task": task, "options": {}},
        "logger": {"tensorboard": False, "progress": False, "log_interval": 1},
        "num_envs": 8, "total_steps": STEPS[algo], "seed": 3, "run_dir": str(run_dir),
        "checkpoint_interval": 1000, "eval_interval": 0, "eval_episodes": 2,
    })
    seed_everything(cfg.seed)
    runner = build_runner(cfg)
    final = runner.train()
    actor = runner.alg.export_actor()
    flat = torch.cat([t.detach().reshape(-1).to(torch.float64)
                      for t in actor.state_dict().values()])
    return {
        "history": [{k: v for k, v in m.items() if not k.startswith("perf/")}
                    for m in runner.history],
        "eval": {k: v for k, v in (final or {}).items()},
        "actor_sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
        "actor_sum": float(flat.sum()),
        "actor_abs_sum": float(flat.abs().sum()),
    }


def cpu() -> str:
    """What decides how this machine's kernels round: the CPU vendor and torch's kernel level."""
    import platform

    vendor = cpu_fields().get("vendor_id") or platform.processor() or platform.machine()
    return f"{vendor} {torch.backends.cpu.get_cpu_capability()}"


HERE = (torch.__version__, cpu())
"""This machine's (torch build, CPU): a recording of the same pair is compared exactly."""


def nearest(recordings: list[dict[str, Any]]) -> dict[str, Any]:
    """The recording of this (torch build, CPU), else of this CPU, else of this build, else the
    first."""
    for match in (lambda r: (r["torch"], r["cpu"]) == HERE, lambda r: r["cpu"] == HERE[1],
                  lambda r: r["torch"] == HERE[0], lambda r: True):
        for r in recordings:
            if match(r):
                return r
    raise AssertionError("tests/fixtures/golden.json holds no recording")


def _close(a: float, b: float, rtol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-6)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("algo", list(RUNS))
def test_golden_run(algo: str, task: str, tmp_path: Path) -> None:
    recorded = nearest(json.loads(DATA.read_text())["recordings"])
    expected = recorded["runs"][f"{algo}/{task}"]
    got = golden_run(algo, task, tmp_path)
    if (recorded["torch"], recorded["cpu"]) == HERE:
        assert got == expected, f"{algo}/{task} differs from its golden run"
        return
    where = (f"(recorded with torch {recorded['torch']} on {recorded['cpu']}, running "
             f"{HERE[0]} on {HERE[1]})")
    assert len(got["history"]) == len(expected["history"])
    for i, (g, e) in enumerate(zip(got["history"], expected["history"], strict=True)):
        assert g.keys() == e.keys(), f"iteration {i}: metric keys differ {where}"
        for key in e:
            assert _close(g[key], e[key], OTHER_BUILD_RTOL), \
                f"{algo}/{task} iteration {i} {key}: {g[key]} vs {e[key]} {where}"
    for key in ("actor_sum", "actor_abs_sum"):
        assert _close(got[key], expected[key], OTHER_BUILD_RTOL), (key, where)


def record() -> None:
    """Re-record every golden run with this torch build on this CPU, keeping the recordings of
    other (build, CPU) pairs."""
    torch.set_num_threads(1)
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for algo in RUNS:
            for task in TASKS:
                runs[f"{algo}/{task}"] = golden_run(algo, task, Path(tmp) / f"{algo}_{task}")
                print(algo, task, runs[f"{algo}/{task}"]["eval"], file=sys.stderr)
    DATA.parent.mkdir(exist_ok=True)
    old = json.loads(DATA.read_text())["recordings"] if DATA.is_file() else []
    kept = [r for r in old if (r["torch"], r["cpu"]) != HERE]
    here = {"torch": HERE[0], "cpu": HERE[1], "runs": runs}
    DATA.write_text(json.dumps({"recordings": kept + [here]}, indent=1) + "\n")


if __name__ == "__main__":
    record()
