"""``robotrl export checkpoint=PATH format=onnx|pt2|torchscript [out=FILE] [num_obs=10000]``."""

from __future__ import annotations

from pathlib import Path

from robotrl.cli.args import parse_kv


def export_main(argv: list[str]) -> None:
    from robotrl.experiment.export import default_output, export_run
    from robotrl.logging import console
    from robotrl.sim2real.export import FORMATS, ExportError

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
    checkpoint = str(args["checkpoint"])
    out = Path(str(args["out"])) if "out" in args else default_output(checkpoint,
                                                                      FORMATS[fmt][0])
    tol = float(args.get("tol", 1e-5))
    try:
        report = export_run(checkpoint, fmt, out, num_obs, tol,
                            int(args["seed"]) if "seed" in args else None)
    except ExportError as err:
        raise SystemExit(f"error: {err}") from None
    if report["source"] != "rollout":
        console.print(f"[yellow]recording a rollout failed ({report['rollout_error']}); "
                      "verified on samples of the normalizer's statistics[/yellow]")
    diffs = ", ".join(f"{k} {v:.2e}" for k, v in report["max_abs_diff"].items())
    console.print(f"verified on {report['num_obs']} {report['source']} observations: max abs "
                  f"diff {diffs} (tol {tol:g})")
    for note in report["notes"]:
        console.print(f"[yellow]{note}[/yellow]")
    metadata = report["metadata"]
    console.print(f"wrote {out} ({fmt}, {report['bytes']:,} bytes): {metadata['task']}, obs "
                  f"{metadata['obs_dim']} -> action {metadata['action_dim']} at "
                  f"{metadata['control_hz']:g} Hz")
