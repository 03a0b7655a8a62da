"""Registries of algorithms and runner kinds: how ``robotrl train`` finds what to build.

An algorithm is one entry: its config dataclass, its learner class and the kind of runner that
drives it. A runner kind is one entry too. Adding either is a registration, never an edit of
the builder (``robotrl/experiment/build.py`` names no algorithm):

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
    name: str = ""
    """Its registry name (``algo=NAME``); filled in by registration."""
    seed_batch: str | type | None = None
    """Its seed-batched learner (``num_seeds > 1``: S copies trained by one update call, built
    from the S ordinary learners), or None where it has none yet."""

    @property
    def offline(self) -> bool:
        """Whether it learns from a dataset (``dataset=``) rather than collecting its own data."""
        return self.runner == "offline"

    def config_class(self) -> type:
        return resolve(self.config)

    def learner_class(self) -> type:
        return resolve(self.learner)

    def runner_class(self) -> type:
        return runner_class(self.runner)


ALGORITHMS: dict[str, AlgorithmEntry] = {
    "ppo": AlgorithmEntry("robotrl.algos.ppo:PPOConfig", "robotrl.algos.ppo:PPO", "on_policy"),
    "trpo": AlgorithmEntry("robotrl.algos.trpo:TRPOConfig", "robotrl.algos.trpo:TRPO",
                           "on_policy"),
    "sac": AlgorithmEntry("robotrl.algos.sac:SACConfig", "robotrl.algos.sac:SAC", "off_policy"),
    "crossq": AlgorithmEntry("robotrl.algos.crossq:CrossQConfig", "robotrl.algos.crossq:CrossQ",
                             "off_policy"),
    "fasttd3": AlgorithmEntry("robotrl.algos.fasttd3:FastTD3Config",
                              "robotrl.algos.fasttd3:FastTD3", "off_policy"),
    "crl": AlgorithmEntry("robotrl.algos.crl:CRLConfig", "robotrl.algos.crl:CRL", "off_policy"),
    "drq": AlgorithmEntry("robotrl.algos.drq:DrQConfig", "robotrl.algos.drq:DrQ", "off_policy"),
    "grpo": AlgorithmEntry("robotrl.algos.grpo:GRPOConfig", "robotrl.algos.grpo:GRPO", "group"),
    **{name: AlgorithmEntry(f"robotrl.algos.offline.{module}:{cls}Config",
                            f"robotrl.algos.offline.{module}:{cls}", "offline")
       for name, module, cls in (("bc", "bc", "BC"), ("td3bc", "td3bc", "TD3BC"),
                                 ("rebrac", "rebrac", "ReBRAC"), ("iql", "iql", "IQL"),
                                 ("cql", "cql", "CQL"), ("awac", "awac", "AWAC"),
                                 ("td3bc_mcep", "mcep", "TD3BCMCEP"),
                                 ("awac_mcep", "mcep", "AWACMCEP"))},
}
for _name, _batch in (("bc", "offline.seed_batch:SeedBatchBC"),
                      ("cql", "offline.seed_batch:SeedBatchCQL"),
                      ("td3bc", "offline.seed_batch:SeedBatchTD3BC"),
                      ("rebrac", "offline.seed_batch:SeedBatchReBRAC"),
                      ("awac", "offline.seed_batch:SeedBatchAWAC"),
                      ("td3bc_mcep", "offline.seed_batch:SeedBatchTD3BCMCEP"),
                      ("awac_mcep", "offline.seed_batch:SeedBatchAWACMCEP"),
                      ("iql", "offline.seed_batch:SeedBatchIQL"), ("sac", "seed_batch:SeedBatchSAC"),
                      ("crossq", "seed_batch:SeedBatchCrossQ"),
                      ("fasttd3", "seed_batch:SeedBatchFastTD3"),
                      ("ppo", "ppo_seed_batch:SeedBatchPPO")):
    ALGORITHMS[_name] = dataclasses.replace(ALGORITHMS[_name],
                                            seed_batch=f"robotrl.algos.{_batch}")
"""Algorithm name -> entry (its ``name`` filled in below)."""
ALGORITHMS = {n: dataclasses.replace(e, name=n) for n, e in ALGORITHMS.items()}

RUNNERS: dict[str, str | type] = {
    "on_policy": "robotrl.runners.on_policy:OnPolicyRunner",
    "off_policy": "robotrl.runners.off_policy:OffPolicyRunner",
    "offline": "robotrl.runners.offline:OfflineRunner",
    "group": "robotrl.runners.group:GroupRunner",
}
"""Runner kind -> runner class (``robotrl.runners.base.Runner`` subclass) or ``"module:Class"``."""


@dataclasses.dataclass
class MLPPolicyConfig:
    """``policy=mlp``: the algorithm's own MLP networks (their widths are ``algo.*`` keys)."""


POLICIES: dict[str, tuple[str | type, str | type | None]] = {
    "mlp": (MLPPolicyConfig, None),
    "vla": ("robotrl.vla.transformer:VLAConfig", "robotrl.vla.transformer:VLATransformer"),
    "hf": ("robotrl.vla.hf:HFPolicyConfig", "robotrl.vla.hf:HFTokenPolicy"),
}
"""Policy family name -> (config dataclass, token policy class or None for the algorithm's own
network). A token policy class is built as ``cls(cfg, image_shape, words, proprio_dim, low,
high)`` from the env's ``image``, ``tokens`` and ``policy`` groups and one action's bounds."""


def policy_config_class(name: str) -> type:
    """The config dataclass of policy family ``name``; an unknown one fails listing them."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; available: {', '.join(POLICIES)}")
    return resolve(POLICIES[name][0])


def policy_name(policy_cfg: Any) -> str:
    """Registry name of a policy config instance."""
    for name in POLICIES:
        if type(policy_cfg) is policy_config_class(name):
            return name
    raise ValueError(f"unregistered policy config {type(policy_cfg).__name__}")


def build_policy(policy_cfg: Any, spec: Any) -> Any:
    """The token policy ``policy_cfg`` describes, for an env with ``spec`` whose actions are
    chunks of ``policy_cfg.chunk`` steps (``robotrl.envs.wrappers.ActionChunks``)."""
    name = policy_name(policy_cfg)
    cls = POLICIES[name][1]
    if cls is None:
        raise ValueError(f"policy={name} is the algorithm's own network, not a token policy")
    groups = spec.observations
    missing = [g for g in ("image", "tokens") if g not in groups]
    if missing:
        raise ValueError(f"policy={name} reads the image and instruction groups; task "
                         f"{spec.task!r} lacks {missing} (tasks with them: tabletop)")
    act = spec.action_dim // policy_cfg.chunk
    return resolve(cls)(policy_cfg, tuple(groups["image"].shape), groups["tokens"].shape[0],
                        spec.obs_dim, spec.action_low[:act], spec.action_high[:act])


def register_algorithm(name: str, entry: AlgorithmEntry) -> None:
    """Add algorithm ``name``; its runner kind must be registered already."""
    if entry.runner not in RUNNERS:
        raise ValueError(f"algorithm {name!r} names runner kind {entry.runner!r}; "
                         f"registered kinds: {', '.join(RUNNERS)}")
    ALGORITHMS[name] = dataclasses.replace(entry, name=name)
    _BY_CONFIG.clear()


def register_runner(kind: str, runner: str | type) -> None:
    """Add runner kind ``kind``."""
    RUNNERS[kind] = runner


_BY_CONFIG: dict[type, AlgorithmEntry] = {}
"""Config class -> entry, filled on first lookup by config."""


def algorithm(key: Any) -> AlgorithmEntry:
    """The entry of algorithm ``key``: its name, or an instance of its config dataclass; an
    unknown one fails listing the registered algorithms."""
    if isinstance(key, str):
        if key not in ALGORITHMS:
            raise ValueError(f"unknown algo {key!r}; available: {', '.join(ALGORITHMS)}")
        return ALGORITHMS[key]
    if not _BY_CONFIG:
        _BY_CONFIG.update({e.config_class(): e for e in ALGORITHMS.values()})
    entry = _BY_CONFIG.get(type(key))
    if entry is None:
        raise ValueError(f"unregistered algorithm config {type(key).__name__}; "
                         f"registered: {', '.join(ALGORITHMS)}")
    return entry


def algo_config_class(name: str) -> type:
    """The config dataclass of algorithm ``name``."""
    return algorithm(name).config_class()


def learner_class(name: str) -> type:
    """The learner class of algorithm ``name``."""
    return algorithm(name).learner_class()


def runner_class(kind: str) -> type:
    """The runner class of runner kind ``kind``."""
    if kind not in RUNNERS:
        raise ValueError(f"unknown runner kind {kind!r}; available: {', '.join(RUNNERS)}")
    return resolve(RUNNERS[kind])
