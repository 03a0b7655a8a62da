"""``robotrl export checkpoint=PATH format=onnx|pt2|torchscript [out=FILE] [num_obs=10000]``."""

from __future__ import annotations

from pathlib import Path

from robotrl.cli.args import parse_kv

ROLLOUT_WORLDS = 16
"""Simulated worlds that record the verification observations."""


def default_output(checkpoint: str, suffix: str) -> Path:
    """``RUN/policy.onnx`` for a run directory, else the checkpoint's path with ``suffix``."""
    path = Path(checkpoint)
    return path / f"policy{suffix}" if path.is_dir() else path.with_suffix(suffix)


def export_main(argv: list[str]) -> None:
    import torch

    from robotrl.experiment.build import build_algo, build_env, load_run
    from robotrl.logging import console
    from robotrl.registry import algo_name
    from robotrl.seeding import derive_seed
    from robotrl.sim2real.export import FORMATS, ExportError, build_metadata, export_policy
    from robotrl.sim2real.verify import record_observations, sample_observations

    args = parse_kv(argv, {"checkpoint": str, "format": str, "out": str, "num_obs": int,
                           "tol": float, "seed": int})
    if "checkpoint" not in args:
        raise SystemExit("robotrl export needs checkpoint=PATH (a .pt file or a run directory)")
    fmt = str(args.get("format", "onnx"))
    if fmt not in FORMATS:
        raise SystemExit(f"unknown format {fmt!r}; available: {', '.join(FORMATS)}")
    num_obs = int(args.get("num_obs", 10_000))
    if num_obs < 1:
        raise SystemExit(f"num_obs must be >= 1, got {num_obs}")
    torch.set_num_threads(1)
    cfg, ckpt = load_run(str(args["checkpoint"]), "cpu")
    seed = derive_seed(int(args.get("seed", cfg.seed)), "export-check")
    env = build_env(cfg, ROLLOUT_WORLDS, seed, train=False)
    alg = build_algo(cfg, env.spec, ckpt["algo"])
    name = algo_name(cfg.algo)
    try:
        actor = alg.export_actor()
        metadata = build_metadata(actor, env.spec, ckpt["config"], name)
    except (ExportError, ValueError, NotImplementedError) as err:
        raise SystemExit(f"error: cannot export {args['checkpoint']}: {err}") from None
    try:
        obs, source = record_observations(actor, env, num_obs, seed), "rollout"
    except Exception as err:  # noqa: BLE001 - a diverged policy or a broken sim: still export
        console.print(f"[yellow]recording a rollout failed ({type(err).__name__}: {err}); "
                      "verifying on samples of the normalizer's statistics[/yellow]")
        obs, source = sample_observations(actor, num_obs, seed), "normalizer"
    env.close()
    out = Path(str(args["out"])) if "out" in args else default_output(
        str(args["checkpoint"]), FORMATS[fmt][0])
    tol = float(args.get("tol", 1e-5))
    try:
        report = export_policy(actor, fmt, out, metadata, obs, tol, source)
    except ExportError as err:
        raise SystemExit(f"error: {err}") from None
    diffs = ", ".join(f"{k} {v:.2e}" for k, v in report["max_abs_diff"].items())
    console.print(f"verified on {report['num_obs']} {source} observations: max abs diff {diffs} "
                  f"(tol {tol:g})")
    for note in report["notes"]:
        console.print(f"[yellow]{note}[/yellow]")
    console.print(f"wrote {out} ({fmt}, {report['bytes']:,} bytes): {metadata['task']}, obs "
                  f"{metadata['obs_dim']} -> action {metadata['action_dim']} at "
                  f"{metadata['control_hz']:g} Hz")
