"""Registries of algorithms and runner kinds: how ``robotrl train`` finds what to build.

An algorithm is one entry: its config dataclass, its learner class and the kind of runner that
drives it. A runner kind is one entry too. Adding either is a registration, never an edit of
the builder (``robotrl/cli/build.py`` names no algorithm):

    register_algorithm("ppo", AlgorithmEntry("robotrl.algos.ppo:PPOConfig",
                                             "robotrl.algos.ppo:PPO", "on_policy"))
    register_runner("on_policy", "robotrl.runners.on_policy:OnPolicyRunner")

Classes are named as ``"module:attr"`` strings and imported on first use (so listing the
algorithms imports none of them), or given as the classes themselves (a test's own algorithm).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any


def resolve(target: str | type) -> type:
    """The class named by ``"module:attr"``, or ``target`` itself when it is a class."""
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclasses.dataclass(frozen=True)
class AlgorithmEntry:
    """What the builder needs to know about one algorithm."""

    config: str | type
    """Its config dataclass (the ``algo.*`` keys), or ``"module:Class"``."""
    learner: str | type
    """Its learner class, built by ``learner.build(spec, cfg, ctx)``, or ``"module:Class"``."""
    runner: str
    """The runner kind that drives it: a key of ``RUNNERS``."""


ALGORITHMS: dict[str, AlgorithmEntry] = {
    "ppo": AlgorithmEntry("robotrl.algos.ppo:PPOConfig", "robotrl.algos.ppo:PPO", "on_policy"),
    "trpo": AlgorithmEntry("robotrl.algos.trpo:TRPOConfig", "robotrl.algos.trpo:TRPO",
                           "on_policy"),
    "sac": AlgorithmEntry("robotrl.algos.sac:SACConfig", "robotrl.algos.sac:SAC", "off_policy"),
    "grpo": AlgorithmEntry("robotrl.algos.grpo:GRPOConfig", "robotrl.algos.grpo:GRPO", "group"),
    **{name: AlgorithmEntry(f"robotrl.algos.offline.{module}:{cls}Config",
                            f"robotrl.algos.offline.{module}:{cls}", "offline")
       for name, module, cls in (("bc", "bc", "BC"), ("td3bc", "td3bc", "TD3BC"),
                                 ("rebrac", "rebrac", "ReBRAC"), ("iql", "iql", "IQL"),
                                 ("cql", "cql", "CQL"), ("awac", "awac", "AWAC"),
                                 ("td3bc_mcep", "mcep", "TD3BCMCEP"),
                                 ("awac_mcep", "mcep", "AWACMCEP"))},
}
"""Algorithm name -> entry."""

RUNNERS: dict[str, str | type] = {
    "on_policy": "robotrl.runners.on_policy:OnPolicyRunner",
    "off_policy": "robotrl.runners.off_policy:OffPolicyRunner",
    "offline": "robotrl.runners.offline:OfflineRunner",
    "group": "robotrl.runners.group:GroupRunner",
}
"""Runner kind -> runner class (``robotrl.runners.base.Runner`` subclass) or ``"module:Class"``."""


def register_algorithm(name: str, entry: AlgorithmEntry) -> None:
    """Add algorithm ``name``; its runner kind must be registered already."""
    if entry.runner not in RUNNERS:
        raise ValueError(f"algorithm {name!r} names runner kind {entry.runner!r}; "
                         f"registered kinds: {', '.join(RUNNERS)}")
    ALGORITHMS[name] = entry


def register_runner(kind: str, runner: str | type) -> None:
    """Add runner kind ``kind``."""
    RUNNERS[kind] = runner


def algorithm(name: str) -> AlgorithmEntry:
    """The entry of algorithm ``name``; an unknown name fails listing the registered ones."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algo {name!r}; available: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def algo_config_class(name: str) -> type:
    """The config dataclass of algorithm ``name``."""
    return resolve(algorithm(name).config)


def learner_class(name: str) -> type:
    """The learner class of algorithm ``name``."""
    return resolve(algorithm(name).learner)


def runner_class(kind: str) -> type:
    """The runner class of runner kind ``kind``."""
    if kind not in RUNNERS:
        raise ValueError(f"unknown runner kind {kind!r}; available: {', '.join(RUNNERS)}")
    return resolve(RUNNERS[kind])


def algo_name(algo_cfg: Any) -> str:
    """Registry name of an algorithm config instance."""
    for name in ALGORITHMS:
        if type(algo_cfg) is algo_config_class(name):
            return name
    raise ValueError(f"unregistered algorithm config {type(algo_cfg).__name__}; "
                     f"registered: {', '.join(ALGORITHMS)}")
