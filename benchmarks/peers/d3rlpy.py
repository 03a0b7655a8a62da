"""d3rlpy 2.8.1 as a peer of robotrl's offline grids (``robotrl bench``): one cell (algorithm x
dataset x seed x budget) trained by d3rlpy, evaluated in Gymnasium's MuJoCo env of the dataset.

    $ROBOTRL_D3RLPY_PYTHON benchmarks/peers/d3rlpy.py RUN_DIR/cell.json   # robotrl bench runs it

Standalone: it runs in d3rlpy's own virtual environment (d3rlpy 2.8.1 pins gymnasium 1.0.0) and
never imports robotrl. It needs d3rlpy, h5py (a d3rlpy dependency) and Gymnasium's MuJoCo envs:

    python3.11 -m venv VENV && VENV/bin/pip install torch==2.13.0 && \\
        VENV/bin/pip install d3rlpy==2.8.1 "gymnasium[mujoco]==1.0.0"

The cell (``robotrl.bench.harness.run_peer``): ``algo`` (d3rlpy's: BC, TD3PlusBC, IQL, CQL,
AWAC), ``our_algo`` (bc, td3bc, iql, cql, awac), ``target`` (what robotrl's ``dataset=`` takes:
a Minari id under ``MINARI_DATASETS_PATH``, a Minari directory, or a D4RL-style .hdf5 file),
``offline``, ``seed``, ``budget`` (gradient updates), ``run_dir``, and the grid's ``options``:

    episodes: 10            # evaluation episodes, deterministic policy
    eval_every: 0           # updates between evaluations (0: budget / 10); one at the end too
    threads: 1              # torch intra-op threads (robotrl's cells run torch_threads=1)
    device: cpu:0
    <our_algo>: {...}       # hyperparameters by our config fields' names (DEFAULTS: ours)

Everything is matched to our learner (``robotrl.algos.offline``), not to d3rlpy's defaults:

- the transitions: the rows ``robotrl.data.io.load_dataset`` reads (a Minari episode's last
  observation, or a D4RL file's ``next_observations``, is the next observation of its last
  step; without ``next_observations`` a timed-out step is dropped), handed to d3rlpy as
  episodes so that d3rlpy samples exactly those rows;
- observations standardized as ``OfflineLearner.attach`` does, (x - mean) / sqrt(var + 1e-6)
  over the rows, when ``normalize_obs`` (the default of every one of our offline learners);
  actions scaled from the env's bounds to [-1, 1] (clipped first, as ours); IQL's rewards scaled
  by 1000 / (max - min episode return) (``normalize_reward``) and its actor's learning rate
  annealed by a cosine over the budget (``actor_cosine``), with d3rlpy's own scalers and
  scheduler;
- the hyperparameters in ``DEFAULTS`` (our config classes' defaults), translated to d3rlpy's
  names. A structural choice d3rlpy has no option for (``D3RLPY_ONLY``) must be set to what
  d3rlpy does, here and on our side (``tests/reference/test_d3rlpy.py`` shows ours then updates
  exactly as d3rlpy); otherwise the cell fails naming the field.

Evaluation: every ``eval_every`` updates and at the end, ``episodes`` Gymnasium episodes (reset
seeds 1000 seed + i, the same at every evaluation) stepped together with ``algo.predict`` (the
deterministic action); normalized score 100 (return - ref_min_score) / (ref_max_score -
ref_min_score) from the dataset card, as ours. ``train_seconds`` is the wall clock of the
update loop only (``sample_transition_batch`` + ``update``, what d3rlpy's ``fitter`` times as a
step); evaluations are timed apart (``eval_seconds``). ``run_dir/result.json`` (robotrl's
schema, ``robotrl.experiment.run``) is written last, atomically; the policy's weights go to
``run_dir/model.pt``.

Resuming: after each evaluation before the last, the cell's state goes to
``run_dir/peer_state.pt`` (atomically; its step and evaluations in ``peer_progress.json`` for
``robotrl bench``): every network,
optimizer and learning-rate schedule, the update counter, the torch, NumPy and Python random
generators, and the evaluations and seconds so far. Run again on the same cell, the peer goes on
from there exactly as if never stopped (read with ``torch.load(weights_only=True)``: data, no
code); ``result.json`` then names each resumption and the machines. A state of another cell is
ignored, and deleted once the cell finishes.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: spinning threads skew timings
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]  # this file is d3rlpy.py

import ctypes  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import d3rlpy  # noqa: E402
import gymnasium as gym  # noqa: E402
import h5py  # noqa: E402
import numpy as np  # noqa: E402
import structlog  # noqa: E402
import torch  # noqa: E402
from d3rlpy.models.encoders import VectorEncoderFactory  # noqa: E402
from d3rlpy.optimizers import AdamFactory, CosineAnnealingLRFactory  # noqa: E402
from d3rlpy.preprocessing import (  # noqa: E402
    MinMaxActionScaler,
    ReturnBasedRewardScaler,
    StandardObservationScaler,
)

structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))

COMMON: dict[str, Any] = {"batch_size": 256, "gamma": 0.99, "tau": 0.005, "actor_lr": 3e-4,
                          "critic_lr": 3e-4, "hidden": [256, 256], "activation": "relu",
                          "normalize_obs": True}
"""``robotrl.algos.offline.base.OfflineConfig``'s defaults."""
DEFAULTS: dict[str, dict[str, Any]] = {
    # robotrl.algos.offline.bc.BCConfig
    "bc": {**COMMON},
    # robotrl.algos.offline.td3bc.TD3BCConfig (the paper's Table 4, as CORL)
    "td3bc": {**COMMON, "alpha": 2.5, "policy_noise": 0.2, "noise_clip": 0.5, "policy_freq": 2,
              "num_critics": 2, "actor_on_first_update": False, "lagged_actor_target": False},
    # robotrl.algos.offline.iql.IQLConfig (the paper's MuJoCo settings, as CORL)
    "iql": {**COMMON, "expectile": 0.7, "temperature": 1.0 / 3.0, "max_weight": 100.0,
            "num_critics": 2, "actor_cosine": True, "normalize_reward": True,
            "q_on_updated_value": True, "actor_on_updated_value": True,
            "log_std_range": [-5.0, 2.0], "sigmoid_log_std": False},
    # robotrl.algos.offline.cql.CQLConfig (CORL's MuJoCo configs)
    "cql": {**COMMON, "actor_lr": 3e-5, "hidden": [256, 256, 256], "cql_alpha": 10.0,
            "num_actions": 10, "cql_temperature": 1.0, "lagrange": False,
            "target_action_gap": 5.0, "num_critics": 2, "backup_entropy": False,
            "temperature_loss": "log_alpha", "update_order": "actor_first"},
    # robotrl.algos.offline.awac.AWACConfig (CORL's MuJoCo configs)
    "awac": {**COMMON, "hidden": [256, 256, 256], "temperature": 1.0 / 3.0, "max_weight": 100.0,
             "num_critics": 2, "advantage_weights": "clipped_exp", "backup": "policy",
             "log_std_range": [-5.0, 2.0], "sigmoid_log_std": False},
}
"""Our learners' hyperparameters, field by field (the defaults of the config classes named)."""
D3RLPY_ONLY: dict[str, dict[str, Any]] = {
    "td3bc": {"actor_on_first_update": True, "lagged_actor_target": False},
    "iql": {"q_on_updated_value": False, "actor_on_updated_value": True,
            "sigmoid_log_std": True, "log_std_range": [-5.0, 2.0]},
    "cql": {"cql_temperature": 1.0, "backup_entropy": True, "temperature_loss": "alpha",
            "update_order": "critic_first"},
    "awac": {"advantage_weights": "batch_softmax", "backup": "squashed_entropy",
             "sigmoid_log_std": True, "log_std_range": [-6.0, 0.0]},
}
"""What d3rlpy 2.8.1 does and has no option for, by our fields' names (their docstrings in
``robotrl.algos.offline`` describe both variants); AWAC's ``max_weight`` is unused by the batch
softmax, on both sides."""
D3RLPY_NAMES = {"bc": "BC", "td3bc": "TD3PlusBC", "iql": "IQL", "cql": "CQL", "awac": "AWAC"}
ACTIVATIONS = {"relu": "relu", "tanh": "tanh", "silu": "swish", "gelu": "gelu"}
"""Our activation -> d3rlpy's name for it."""
CARD_KEY = "robotrl_card"
"""Where robotrl keeps the dataset card (``robotrl.data.io.CARD_KEY``)."""
OBS_EPS = 1e-6
"""Our observation normalizer's variance floor (``OfflineLearner``'s ``RunningNormalizer``)."""


# ------------------------------------------------------------------------------ the dataset
def resolve(ref: str) -> tuple[str, Path]:
    """("hdf5" | "minari", path) as ``robotrl.data.io._resolve`` reads ``dataset=``."""
    path = Path(ref)
    if path.suffix in (".hdf5", ".h5"):
        if not path.is_file():
            raise FileNotFoundError(f"{ref}: no such HDF5 file")
        return "hdf5", path
    root = Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")
    for base in (path, root / ref):
        if (base / "data" / "metadata.json").exists():
            return "minari", base / "data"
        if (base / "metadata.json").exists():
            return "minari", base
    raise FileNotFoundError(f"unknown dataset {ref!r}: not an .hdf5 file, a Minari directory or "
                            f"a Minari id under {root} (MINARI_DATASETS_PATH)")


def _card(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    return json.loads(raw.decode() if isinstance(raw, bytes) else raw)


Episode = tuple[np.ndarray, np.ndarray, np.ndarray, "np.ndarray | None", bool]
"""(observations [T, O], actions [T, A], rewards [T], the observation after the last step
(None where the episode terminated), terminated) of one episode's rows."""


def read_hdf5(path: Path) -> tuple[list[Episode], dict[str, Any]]:
    """A D4RL-style file's episodes (``robotrl.data.io.load_hdf5``'s rows) and card."""
    with h5py.File(path, "r") as f:
        card = _card(f.attrs.get(CARD_KEY))
        env = f.attrs.get("env", "")
        card["task"] = card.get("task") or (env.decode() if isinstance(env, bytes) else env)
        a = {k: np.asarray(f[k]) for k in ("observations", "actions", "rewards", "terminals",
                                            "timeouts", "next_observations") if k in f}
    term, trunc = a["terminals"].astype(bool), a["timeouts"].astype(bool)
    ends = term | trunc
    ends[-1] = True
    out: list[Episode] = []
    start = 0
    for end in np.flatnonzero(ends) + 1:
        rows = slice(start, end)
        last = end - 1
        if term[last]:
            out.append((a["observations"][rows], a["actions"][rows], a["rewards"][rows].reshape(-1),
                        None, True))
        elif "next_observations" in a:
            out.append((a["observations"][rows], a["actions"][rows], a["rewards"][rows].reshape(-1),
                        a["next_observations"][last], False))
        elif end - start > 1:  # the last row has no next observation: it is dropped
            keep = slice(start, last)
            out.append((a["observations"][keep], a["actions"][keep],
                        a["rewards"][keep].reshape(-1), a["observations"][last], False))
        start = end
    return out, card


def read_minari(path: Path) -> tuple[list[Episode], dict[str, Any]]:
    """A Minari dataset's episodes (its hdf5 storage, read with h5py) and card: robotrl's card,
    with Minari's own ``ref_min_score``/``ref_max_score`` and env id winning where present."""
    meta = json.loads((path / "metadata.json").read_text())
    card = _card(meta.get(CARD_KEY))
    spec = json.loads(meta["env_spec"]) if isinstance(meta.get("env_spec"), str) else {}
    card["task"] = card.get("task") or (spec or {}).get("id", "")
    for key in ("ref_min_score", "ref_max_score"):
        if meta.get(key) is not None:
            card[key] = float(meta[key])
    out: list[Episode] = []
    with h5py.File(path / "main_data.hdf5", "r") as f:
        for name in sorted(f, key=lambda n: int(n.rsplit("_", 1)[-1])):
            ep = f[name]
            if not isinstance(ep["observations"], h5py.Dataset):
                raise ValueError(f"{path}: dict observations are not supported (robotrl's "
                                 "offline learners read flat Box spaces)")
            obs, terms = np.asarray(ep["observations"]), np.asarray(ep["terminations"])
            terminated = bool(len(terms) and terms[-1])
            out.append((obs[:-1], np.asarray(ep["actions"]), np.asarray(ep["rewards"]),
                        None if terminated else obs[-1], terminated))
    return out, card


def to_d3rlpy(episodes: list[Episode], low: np.ndarray, high: np.ndarray
              ) -> d3rlpy.dataset.ReplayBuffer:
    """The rows as d3rlpy episodes: d3rlpy samples an episode's steps 0..T-1 with
    observation t+1 as the next one (so an unterminated episode carries its final observation,
    and a padding action and reward never sampled as a step), and a terminated one's last step
    as terminal."""
    eps = []
    for obs, act, rew, final, terminated in episodes:
        if len(obs) == 0:
            continue
        act = np.clip(act, low, high).astype(np.float32)  # ours clamps the scaled actions
        rew = rew.astype(np.float32)
        if not terminated:
            obs = np.concatenate([obs, final[None]])
            act = np.concatenate([act, act[-1:]])
            rew = np.concatenate([rew, np.zeros(1, np.float32)])
        eps.append(d3rlpy.dataset.Episode(observations=obs.astype(np.float32), actions=act,
                                          rewards=rew[:, None], terminated=terminated))
    return d3rlpy.dataset.ReplayBuffer(d3rlpy.dataset.InfiniteBuffer(), episodes=eps,
                                       action_space=d3rlpy.ActionSpace.CONTINUOUS,
                                       action_size=int(low.shape[0]))


# ------------------------------------------------------------------------------ the algorithm
def hyperparameters(our_algo: str, options: dict[str, Any]) -> dict[str, Any]:
    """Our defaults updated by the grid's ``options[our_algo]``; unknown fields and structural
    choices d3rlpy cannot make fail, naming them."""
    if our_algo not in DEFAULTS:
        raise ValueError(f"the d3rlpy peer runs {sorted(DEFAULTS)}, not {our_algo!r}")
    given = dict(options.get(our_algo) or {})
    unknown = sorted(set(given) - set(DEFAULTS[our_algo]))
    if unknown:
        raise ValueError(f"options.{our_algo}: unknown field(s) {unknown}; known: "
                         f"{sorted(DEFAULTS[our_algo])}")
    hp = {**DEFAULTS[our_algo], **given}
    for key, theirs in D3RLPY_ONLY.get(our_algo, {}).items():
        if _norm(hp[key]) != _norm(theirs):
            raise ValueError(f"options.{our_algo}.{key}={hp[key]!r}: d3rlpy 2.8.1 has no option "
                             f"for it and runs {key}={theirs!r}; set that here and on ours "
                             f"(algo.{key}={_override(theirs)}) so both run the same "
                             "algorithm")
    if hp["activation"] not in ACTIVATIONS:
        raise ValueError(f"options.{our_algo}.activation={hp['activation']!r}: d3rlpy has "
                         f"{sorted(ACTIVATIONS)}")
    hp["hidden"] = [int(w) for w in hp["hidden"]]
    return hp


def _override(value: Any) -> str:
    """``value`` as a Hydra override writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def _norm(value: Any) -> Any:
    return [float(v) for v in value] if isinstance(value, (list, tuple)) else value


def build(our_algo: str, hp: dict[str, Any], budget: int, scalers: dict[str, Any],
          device: str) -> Any:
    """d3rlpy's algorithm with our hyperparameters (names as ``tests/reference/test_d3rlpy.py``
    maps them)."""
    enc = VectorEncoderFactory(hidden_units=hp["hidden"], activation=ACTIVATIONS[hp["activation"]])
    if our_algo == "bc":
        return d3rlpy.algos.BCConfig(batch_size=hp["batch_size"], learning_rate=hp["actor_lr"],
                                     policy_type="deterministic", encoder_factory=enc,
                                     **scalers).create(device=device)
    common = {"batch_size": hp["batch_size"], "gamma": hp["gamma"], "tau": hp["tau"],
              "actor_learning_rate": hp["actor_lr"], "critic_learning_rate": hp["critic_lr"],
              "actor_encoder_factory": enc, "critic_encoder_factory": enc,
              "n_critics": hp["num_critics"], **scalers}
    if our_algo == "td3bc":
        cfg: Any = d3rlpy.algos.TD3PlusBCConfig(
            **common, alpha=hp["alpha"], target_smoothing_sigma=hp["policy_noise"],
            target_smoothing_clip=hp["noise_clip"], update_actor_interval=hp["policy_freq"])
    elif our_algo == "iql":
        schedule = CosineAnnealingLRFactory(T_max=budget) if hp["actor_cosine"] else None
        cfg = d3rlpy.algos.IQLConfig(
            **common, value_encoder_factory=enc, expectile=hp["expectile"],
            weight_temp=1.0 / hp["temperature"], max_weight=hp["max_weight"],
            actor_optim_factory=AdamFactory(lr_scheduler_factory=schedule))
    elif our_algo == "cql":
        cfg = d3rlpy.algos.CQLConfig(
            **common, temp_learning_rate=hp["actor_lr"], initial_temperature=1.0,
            alpha_learning_rate=hp["critic_lr"] if hp["lagrange"] else 0.0, initial_alpha=1.0,
            alpha_threshold=hp["target_action_gap"], conservative_weight=hp["cql_alpha"],
            n_action_samples=hp["num_actions"], soft_q_backup=True)
    else:
        cfg = d3rlpy.algos.AWACConfig(**common, lam=hp["temperature"], n_action_samples=1)
    return cfg.create(device=device)


def scalers_for(our_algo: str, hp: dict[str, Any], episodes: list[Episode], low: np.ndarray,
                high: np.ndarray) -> dict[str, Any]:
    """d3rlpy's scalers holding our learner's statistics (``OfflineLearner.attach``,
    ``iql.return_range_scale``)."""
    out: dict[str, Any] = {}
    if hp["normalize_obs"]:
        obs = np.concatenate([e[0] for e in episodes]).astype(np.float32).astype(np.float64)
        out["observation_scaler"] = StandardObservationScaler(
            mean=obs.mean(0), std=np.sqrt(obs.var(0) + OBS_EPS), eps=0.0)
    if not (np.all(low == -1.0) and np.all(high == 1.0)):
        out["action_scaler"] = MinMaxActionScaler(minimum=low, maximum=high)
    if our_algo == "iql" and hp["normalize_reward"]:
        returns = np.array([e[2].astype(np.float32).astype(np.float64).sum() for e in episodes])
        if returns.max() > returns.min():
            out["reward_scaler"] = ReturnBasedRewardScaler(
                return_max=float(returns.max()), return_min=float(returns.min()),
                multiplier=1000.0)
    return out


# ------------------------------------------------------------------------------ evaluation
class Evaluator:
    """``episodes`` Gymnasium envs of the task, reset with the same seeds at every evaluation
    and stepped together, one batched ``predict`` per step."""

    def __init__(self, task: str, episodes: int, seed: int, card: dict[str, Any]) -> None:
        self.envs = [gym.make(task) for _ in range(episodes)]
        self.seeds = [1000 * seed + i for i in range(episodes)]
        self.card = card
        space = self.envs[0].action_space
        self.low, self.high = space.low.astype(np.float64), space.high.astype(np.float64)

    def __call__(self, algo: Any) -> dict[str, float]:
        n = len(self.envs)
        obs = np.stack([e.reset(seed=s)[0] for e, s in zip(self.envs, self.seeds, strict=True)])
        returns, lengths = np.zeros(n), np.zeros(n, dtype=np.int64)
        alive = np.ones(n, dtype=bool)
        while alive.any():
            idx = np.flatnonzero(alive)
            actions = np.clip(algo.predict(obs[idx].astype(np.float32)), self.low, self.high)
            for j, i in enumerate(idx):
                o, r, terminated, truncated, _ = self.envs[i].step(actions[j])
                obs[i] = o
                returns[i] += r
                lengths[i] += 1
                alive[i] = not (terminated or truncated)
        mean = float(returns.mean())
        lo, hi = self.card.get("ref_min_score"), self.card.get("ref_max_score")
        score = math.nan if lo is None or hi is None else 100.0 * (mean - lo) / (hi - lo)
        return {"return_mean": mean, "return_std": float(returns.std()),
                "length_mean": float(lengths.mean()), "episodes": n, "normalized_score": score}


def machine(device: str) -> str:
    """As ``robotrl.experiment.run.machine``: CPU model and cores, or the GPU; on an AMD CPU
    whose MKL runs its Intel kernels (``benchmarks/mkl_intel_path.c`` preloaded), says so."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if not key.strip():
                break
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    mkl = ""
    if fields.get("vendor_id") == "AuthenticAMD":
        try:
            check = ctypes.CDLL(None).mkl_serv_intel_cpu_true
            check.restype = ctypes.c_int
            mkl = ", MKL's Intel kernels" if check() else ""
        except (OSError, AttributeError):
            pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    return f"{name}, {cores} cores{mkl}"


def write_atomic(path: Path, write: Any, mode: str = "w") -> None:
    """``write(file)`` into ``path`` atomically: a temporary file, then ``os.replace``."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, mode) as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` to ``path`` as JSON, atomically."""
    write_atomic(path, lambda f: json.dump(data, f, indent=1))


# ------------------------------------------------------------------------------ resuming
STATE = "peer_state.pt"
"""The saved state's file in the run directory."""
PROGRESS = "peer_progress.json"
"""Its step and evaluations, for ``robotrl bench`` (``robotrl.bench.harness.PEER_PROGRESS``)."""
IDENTITY = ("algo", "our_algo", "target", "offline", "seed", "budget", "options")
"""The cell's fields a saved state must match to be resumed."""


def _modules(algo: Any, device: str) -> dict[str, Any]:
    """d3rlpy's networks and optimizers (with their schedules) of ``algo``, by name: what its
    ``save_model`` saves."""
    return algo.impl.modules.create_checkpointer(device).modules


def save_state(run_dir: Path, algo: Any, device: str, progress: dict[str, Any]) -> None:
    """The state a resumed run continues from (module docstring), atomically."""
    mt, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {**progress, "grad_step": int(algo.grad_step),
             "modules": {k: v.state_dict() for k, v in _modules(algo, device).items()},
             "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                     "numpy": [mt, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss,
                               gauss]}}
    write_atomic(run_dir / STATE, lambda f: torch.save(state, f), "wb")
    write_json(run_dir / PROGRESS, {"step": progress["step"],
                                    "evaluations": progress["evaluations"]})


def load_state(run_dir: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The state saved by an interrupted run of this cell, else None (said why, if one is
    there)."""
    path = run_dir / STATE
    if not path.is_file():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file: start over, saying why
        print(f"note: not resuming, starting over: {path} cannot be read ({err})", flush=True)
        return None
    if not isinstance(saved, dict) or saved.get("cell") != identity:
        print(f"note: not resuming, starting over: {path} was saved for another cell",
              flush=True)
        return None
    return saved


def restore(algo: Any, device: str, saved: dict[str, Any]) -> None:
    """Put ``algo`` and the random generators back as ``save_state`` saved them."""
    for name, module in _modules(algo, device).items():
        module.load_state_dict(saved["modules"][name])
    algo._grad_step = int(saved["grad_step"])  # d3rlpy's update counter (no setter)
    rng = saved["rng"]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    mt, keys, pos, has_gauss, gauss = rng["numpy"]
    np.random.set_state((mt, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))


# ------------------------------------------------------------------------------ one cell
def run(cell: dict[str, Any]) -> dict[str, Any]:
    """Train and evaluate one cell (see the module docstring); returns ``result.json``."""
    our_algo, budget, seed = cell["our_algo"], int(cell["budget"]), int(cell["seed"])
    if not cell.get("offline", True):
        raise ValueError("the d3rlpy peer runs offline cells (datasets) only")
    if D3RLPY_NAMES.get(our_algo) != cell["algo"]:
        raise ValueError(f"peers.<name>.algos maps {our_algo!r} to {cell['algo']!r}; the d3rlpy "
                         f"peer runs {our_algo} as {D3RLPY_NAMES.get(our_algo)!r}")
    options = dict(cell.get("options") or {})
    hp = hyperparameters(our_algo, options)
    episodes_n = int(options.get("episodes", 10))
    eval_every = int(options.get("eval_every", 0)) or max(1, budget // 10)
    device = str(options.get("device", "cpu:0"))
    torch.set_num_threads(int(options.get("threads", 1)))
    run_dir = Path(cell["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)

    kind, path = resolve(cell["target"])
    episodes, card = read_hdf5(path) if kind == "hdf5" else read_minari(path)
    task = card.get("task", "")
    if task not in gym.registry:
        raise ValueError(f"{cell['target']}: task {task!r} of its card is not a Gymnasium "
                         f"{gym.__version__} env; the d3rlpy peer evaluates there")
    evaluator = Evaluator(task, episodes_n, seed, card)
    obs_dim = int(np.prod(evaluator.envs[0].observation_space.shape))
    if episodes[0][0].shape[1] != obs_dim:
        raise ValueError(f"{cell['target']}: observations of width {episodes[0][0].shape[1]}, "
                         f"{task}'s are {obs_dim}")
    d3rlpy.seed(seed)
    dataset = to_d3rlpy(episodes, evaluator.low, evaluator.high)
    algo = build(our_algo, hp, budget,
                 scalers_for(our_algo, hp, episodes, evaluator.low, evaluator.high), device)
    algo.build_with_dataset(dataset)
    print(f"d3rlpy {d3rlpy.__version__} {cell['algo']} on {cell['target']} ({task}, "
          f"{dataset.transition_count} transitions), seed {seed}, {budget} updates; "
          f"hyperparameters {json.dumps(hp)}", flush=True)

    batch_size = hp["batch_size"]
    train_seconds = eval_seconds = 0.0
    evaluations: list[dict[str, Any]] = []
    step = 0
    identity = {k: cell.get(k) for k in IDENTITY}
    machines, resumed = [machine(device)], []
    saved = load_state(run_dir, identity)
    if saved is not None:
        restore(algo, device, saved)
        step, evaluations = int(saved["step"]), list(saved["evaluations"])
        train_seconds, eval_seconds = saved["train_seconds"], saved["eval_seconds"]
        machines = [*saved["machines"], machine(device)]
        resumed = [*saved["resumed"], {"step": step, "machine": machine(device)}]
        print(f"resuming at {step} of {budget} updates ({train_seconds:.0f} s of training so "
              "far)", flush=True)
    while step < budget:
        chunk = min(eval_every - step % eval_every, budget - step)
        t0 = time.perf_counter()
        for _ in range(chunk):
            algo.update(dataset.sample_transition_batch(batch_size))
        train_seconds += time.perf_counter() - t0
        step += chunk
        if step % eval_every == 0 or step == budget:
            t0 = time.perf_counter()
            scores = evaluator(algo)
            eval_seconds += time.perf_counter() - t0
            evaluations.append({"step": step, "seconds": train_seconds, **scores})
            print(f"step {step}: return {scores['return_mean']:.1f}, normalized "
                  f"{scores['normalized_score']:.1f} ({step / max(train_seconds, 1e-9):.0f} "
                  "updates/s)", flush=True)
            if step < budget:
                save_state(run_dir, algo, device, {
                    "cell": identity, "step": step, "evaluations": evaluations,
                    "train_seconds": train_seconds, "eval_seconds": eval_seconds,
                    "machines": machines, "resumed": resumed})
    algo.save_model(str(run_dir / "model.pt"))
    final = {**evaluations[-1], "best": max(e["return_mean"] for e in evaluations)}
    for key in ("step", "seconds"):
        final.pop(key)
    result = {"step": step, "total_steps": budget, "final": final,
              "train_seconds": train_seconds, "eval_seconds": eval_seconds,
              "evaluations": evaluations, "machine": " then ".join(dict.fromkeys(machines)),
              "peer": {"d3rlpy": d3rlpy.__version__, "torch": torch.__version__,
                       "gymnasium": gym.__version__, "algo": cell["algo"],
                       "hyperparameters": hp, "updates_per_second": budget / train_seconds}}
    if resumed:
        result["resumed"] = resumed
    write_json(run_dir / "result.json", result)
    for spent in (STATE, PROGRESS):
        (run_dir / spent).unlink(missing_ok=True)
    return result


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python benchmarks/peers/d3rlpy.py RUN_DIR/cell.json")
    run(json.loads(Path(argv[0]).read_text()))


if __name__ == "__main__":
    main(sys.argv[1:])
