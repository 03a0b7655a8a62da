"""Group runner (GRPO): rollouts from restored simulator snapshots, groups of G per state.

A round restores M initial states, each into G worlds (``set_state``; N = M x G), runs every
world for one episode (or ``horizon`` steps) and scores it by its return or by
``info["success"]`` at its last step; the learner keeps what it needs (``end_round``) and
updates once its batch is full. Initial states come from a fixed **train** set and a disjoint
**test** set drawn from the task's reset distribution with the run seed's
``group-train-states`` / ``group-test-states`` streams and saved as ``initial_states.pt`` in
the run dir. Evaluation runs the deterministic policy from the test set and from as many train
states, and reports them apart (``eval/train/*``, ``eval/test/*``); ``best.pt`` is chosen on
the train states, so nothing is ever selected on test states. Evaluation episodes run to the
task's episode limit even when training rounds are shorter (``algo.horizon``). Tasks with
held-out compositions (``MujocoTask.heldout_options``, e.g. tabletop's unseen colour-shape
instructions) get a third set, ``heldout``, drawn once with those options (stream
``group-heldout-states``) and reported as ``eval/heldout/*``: a snapshot carries the
instruction, so the training worlds run it. The policy is evaluated once before the first
update too (step 0: the starting point of a fine-tuning run).
``global_step`` counts every simulated step (all worlds, until the round's last episode ends;
every rank's in a data-parallel run, where each rank draws its rounds from the shared train
states with its own stream and only rank 0 evaluates).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from robotrl import distributed
from robotrl.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from robotrl.runners.base import Runner, RunnerSettings
from robotrl.runners.evaluation import run_episodes, summarize_episodes
from robotrl.seeding import derive_seed
from robotrl.types import BatchedEnv, GroupAlgorithm, Obs, StepOut, obs_to

__all__ = ["GroupEvaluator", "GroupRunner", "RunnerSettings", "draw_initial_states",
           "rollout_from_states"]

STATES_FILE = "initial_states.pt"
"""The run dir's record of the train and test initial states."""


def draw_initial_states(env: BatchedEnv, count: int, seed: int) -> torch.Tensor:
    """``count`` simulator states [count, S] from ``env``'s reset distribution, reseeded with
    ``seed`` (``env.num_envs`` per reset)."""
    rows, total = [], 0
    env.reset(seed=seed)
    while True:
        rows.append(env.get_state().cpu())
        total += rows[-1].shape[0]
        if total >= count:
            return torch.cat(rows)[:count].clone()
        env.reset()


def rollout_from_states(env: BatchedEnv, states: torch.Tensor, horizon: int,
                        act: Callable[[Obs], torch.Tensor],
                        on_step: Callable[[BatchedEnv, StepOut], None] | None = None
                        ) -> dict[str, torch.Tensor]:
    """Restore ``states`` [N, S] into the N worlds and run each to the end of its first episode
    (at most ``horizon`` steps) with ``act``: ``run_episodes``' per-world ``return``,
    ``length``, ``success`` (where the task defines it) and ``steps``."""
    env.set_state(states)
    return run_episodes(env, env.observe(), act, horizon, on_step)


class GroupEvaluator:
    """Deterministic full episodes from the test states and as many train states, reported
    apart; any learner (``act_deterministic``) can be evaluated on a run's states this way.

    Attributes:
        select: the metric ``best.pt`` is chosen on (train states, never test).
        last: the latest result: ``return_mean`` ... of the train states, ``test_*`` of the test
            states, or None.
    """

    recorder = None
    """Group runs are not filmed at evaluation (``robotrl eval video=true`` films their
    checkpoints)."""

    def __init__(self, env: BatchedEnv, states: dict[str, torch.Tensor], device: torch.device,
                 outcome: str = "return") -> None:
        """Args: ``env`` the worlds to run in (states go in chunks of ``env.num_envs``);
        ``states`` ``{"train": [K, S], "test": [K', S]}`` and optionally ``"heldout"``
        (reported apart like ``test``); ``outcome`` selects ``best.pt``."""
        self.env, self.states, self.device = env, states, device
        self.select = f"eval/train/{outcome}"
        self.last: dict[str, float] | None = None

    def _split(self, learner: Any, states: torch.Tensor) -> dict[str, float]:
        env, n, device = self.env, self.env.num_envs, self.device

        def policy(obs: Obs) -> torch.Tensor:
            return learner.act_deterministic(obs_to(obs, device)).to(env.device)

        parts: list[dict[str, torch.Tensor]] = []
        for chunk in states.split(n):
            padded = torch.cat([chunk, chunk[-1:].expand(n - len(chunk), -1)])  # fill the worlds
            out = rollout_from_states(env, padded, env.spec.max_episode_steps, policy)
            parts.append({k: v[: len(chunk)] for k, v in out.items() if k != "steps"})
        return summarize_episodes({k: torch.cat([p[k] for p in parts]) for k in parts[0]})

    def __call__(self, learner: Any) -> dict[str, float]:
        results = {"train": self._split(learner, self.states["train"][: len(self.states["test"])])}
        results.update({split: self._split(learner, states) for split, states
                        in self.states.items() if split != "train"})
        self.last = dict(results["train"])
        for split, result in results.items():
            if split != "train":
                self.last.update({f"{split}_{k}": v for k, v in result.items()})
        metrics = {}
        for split, result in results.items():
            metrics[f"eval/{split}/return"] = result["return_mean"]
            metrics[f"eval/{split}/length"] = result["length_mean"]
            if "success" in result:
                metrics[f"eval/{split}/success"] = result["success"]
        return metrics


class GroupRunner(Runner):
    """Rounds of group rollouts until the learner's batch is full, then an update."""

    alg: GroupAlgorithm
    evaluate_first = True
    heldout_states = True
    iteration_key = "horizon"

    def __init__(self, env: BatchedEnv, alg: GroupAlgorithm, settings: RunnerSettings,
                 device: torch.device, make_eval_env: Callable[[], BatchedEnv] | None = None,
                 config: dict[str, Any] | None = None,
                 make_heldout_env: Callable[[], BatchedEnv] | None = None) -> None:
        """``make_heldout_env`` builds worlds whose resets draw the task's held-out
        compositions (the ``heldout`` states come from it once); None: the task has none."""
        super().__init__(env, alg, settings, device, None, config)
        self.make_heldout_env = make_heldout_env
        cfg = alg.cfg
        groups = env.num_envs // cfg.group_size  # the learner checked the division
        if cfg.train_states < groups:
            raise ValueError(f"algo.train_states ({cfg.train_states}) must be at least the "
                             f"groups per round, num_envs / group_size = {groups}")
        if cfg.outcome == "success" and not env.spec.has_success:
            from robotrl.envs import list_tasks

            with_success = list_tasks(success=True)
            raise ValueError(f"algo.outcome=success but task {env.spec.task!r} defines no "
                             f"success criterion (tasks that do: {with_success}); use "
                             "algo.outcome=return")
        try:
            env.get_state()
        except NotImplementedError as err:
            raise ValueError(f"the group runner restores simulator snapshots: {err} "
                             "(use backend=mujoco)") from None
        self.horizon: int = alg.horizon
        self.states = self._initial_states(Path(settings.run_dir) / STATES_FILE)
        """``{"train": [K, S], "test": [K', S]}`` float64 simulator states."""
        draws = derive_seed(self.rank.seed(settings.seed), "group-draws")  # rank r: its own
        self.generator = torch.Generator().manual_seed(draws)
        """Draws each round's initial states from the train set (saved in checkpoints)."""
        self.evaluator = (GroupEvaluator(self.env, self.states, device, cfg.outcome)
                          if self.rank.main else None)

    def _initial_states(self, path: Path) -> dict[str, torch.Tensor]:
        """The run's train and test (and heldout) states: read from ``path`` (a resumed or
        repeated run), else drawn and written there atomically."""
        cfg, seed, task = self.alg.cfg, self.settings.seed, self.env.spec.task
        if path.exists():
            try:
                saved = load_checkpoint(path, required=("train", "test", "task", "seed"))
                if not all(isinstance(saved[k], torch.Tensor) and saved[k].dim() == 2
                           for k in ("train", "test")):
                    raise CheckpointError(f"{path} holds no [S, state] train and test states")
            except CheckpointError as err:
                raise ValueError(f"{err}; delete it to draw the initial states again") from None
            shapes = (tuple(saved["train"].shape), tuple(saved["test"].shape))
            expected = ((cfg.train_states, saved["train"].shape[1]),
                        (cfg.test_states, saved["train"].shape[1]))
            if (saved["task"], saved["seed"]) != (task, seed) or shapes != expected:
                raise ValueError(f"{path} holds {shapes} states of task {saved['task']!r}, seed "
                                 f"{saved['seed']}; this run needs {expected} of {task!r}, seed "
                                 f"{seed}: use another run_dir")
            return {k: saved[k] for k in ("train", "test", "heldout") if k in saved}
        states = {"train": draw_initial_states(self.env, cfg.train_states,
                                               derive_seed(seed, "group-train-states")),
                  "test": draw_initial_states(self.env, cfg.test_states,
                                              derive_seed(seed, "group-test-states"))}
        if bool((torch.cdist(states["train"], states["test"]) == 0).any()):
            raise RuntimeError("train and test initial states overlap; the task's reset "
                               "distribution is too narrow for disjoint sets")
        if self.make_heldout_env is not None:
            states["heldout"] = draw_initial_states(self.make_heldout_env(), cfg.test_states,
                                                    derive_seed(seed, "group-heldout-states"))
        if distributed.active():  # every rank drew them from the same seeds: check they agree
            check = torch.stack([states[k].sum() for k in sorted(states)])
            if not torch.allclose(distributed.mean(check), check, rtol=1e-12, atol=0.0):
                raise RuntimeError("the ranks drew different initial states from the same seeds")
        if self.rank.main:
            save_checkpoint(path, {**states, "task": task, "seed": seed})
        return states

    def _extra_state(self) -> dict[str, Any]:
        return {"group_generator": self.generator.get_state()}

    def _load_extra_state(self, ckpt: dict[str, Any]) -> None:
        self.generator.set_state(ckpt["group_generator"])

    def _round(self) -> dict[str, torch.Tensor]:
        """One round: M train states drawn without replacement, G worlds each, to their ends."""
        g, alg = self.alg.cfg.group_size, self.alg
        m = self.env.num_envs // g
        pick = torch.randperm(len(self.states["train"]), generator=self.generator)[:m]
        states = self.states["train"][pick].repeat_interleave(g, dim=0)
        device = self.device

        def act(obs: Obs) -> torch.Tensor:
            return alg.act(obs_to(obs, device)).to(self.env.device)

        def record(env: BatchedEnv, out: StepOut) -> None:
            alg.process_env_step(out.reward.to(device), out.terminated.to(device),
                                 out.truncated.to(device), obs_to(out.info["final_obs"], device))

        return rollout_from_states(self.env, states, self.horizon, act, record)

    def _iteration(self) -> dict[str, float]:
        t0 = time.perf_counter()
        rounds: list[dict[str, torch.Tensor]] = []
        with torch.inference_mode():
            ready = False
            while not ready:
                out = self._round()
                rounds.append(out)
                outcome = (out["success"].float() if self.alg.cfg.outcome == "success"
                           else out["return"])
                ready = self.alg.end_round(outcome)
        t1 = time.perf_counter()
        metrics = self.alg.update(progress=self.global_step / self.settings.total_steps)
        t2 = time.perf_counter()
        steps = int(distributed.total(torch.stack([r["steps"] for r in rounds]).sum()))
        self.iteration += 1
        self.global_step += steps
        ret = torch.cat([r["return"] for r in rounds])
        metrics.update({
            "rollout/return": ret.mean().item(),
            "rollout/length": torch.cat([r["length"] for r in rounds]).double().mean().item(),
            "perf/sps": steps / (t2 - t0), "perf/collect_s": t1 - t0, "perf/update_s": t2 - t1,
            # policy decisions per second of collection, over all worlds (sampling and
            # simulating; a token policy's decision is one action chunk, one wrapped step)
            "perf/decisions_per_s": steps / (t1 - t0),
        })
        if "success" in rounds[0]:
            metrics["rollout/success"] = torch.cat(
                [r["success"] for r in rounds]).double().mean().item()
        return metrics
