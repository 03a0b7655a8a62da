"""Exporting a trained run's deterministic actor, verified against torch on observations its own
policy visits (``robotrl.sim2real.export`` does the format work)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROLLOUT_WORLDS = 16
"""Simulated worlds that record the verification observations."""


def default_output(checkpoint: str, suffix: str) -> Path:
    """``RUN/policy.onnx`` for a run directory, else the checkpoint's path with ``suffix``."""
    path = Path(checkpoint)
    return path / f"policy{suffix}" if path.is_dir() else path.with_suffix(suffix)


def export_run(checkpoint: str, fmt: str, out: str | Path, num_obs: int = 10_000,
               tol: float = 1e-5, seed: int | None = None) -> dict[str, Any]:
    """Export ``checkpoint``'s actor as ``fmt`` to ``out``, verified on ``num_obs``
    observations of a rollout of the policy (samples of its normalizer's statistics if the
    rollout fails); ``export_policy``'s report with ``metadata`` and ``source``. A policy that
    cannot be exported raises ``ExportError``."""
    import torch

    from robotrl.experiment.build import build_algo, build_env, load_run
    from robotrl.registry import algorithm
    from robotrl.seeding import derive_seed
    from robotrl.sim2real.export import ExportError, build_metadata, export_policy
    from robotrl.sim2real.verify import record_observations, sample_observations

    torch.set_num_threads(1)
    cfg, ckpt = load_run(checkpoint, "cpu")
    seed = derive_seed(cfg.seed if seed is None else seed, "export-check")
    env = build_env(cfg, ROLLOUT_WORLDS, seed, train=False)
    alg = build_algo(cfg, env.spec, ckpt["algo"])
    try:
        actor = alg.export_actor()
        metadata = build_metadata(actor, env.spec, ckpt["config"], algorithm(cfg.algo).name)
    except (ExportError, ValueError, NotImplementedError) as err:
        raise ExportError(f"cannot export {checkpoint}: {err}") from None
    rollout_error = ""
    try:
        obs, source = record_observations(actor, env, num_obs, seed), "rollout"
    except Exception as err:  # noqa: BLE001 - a diverged policy or a broken sim: still export
        rollout_error = f"{type(err).__name__}: {err}"
        obs, source = sample_observations(actor, num_obs, seed), "normalizer"
    env.close()
    report = export_policy(actor, fmt, out, metadata, obs, tol, source)
    return {**report, "metadata": metadata, "source": source, "rollout_error": rollout_error}
