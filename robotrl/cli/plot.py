"""``robotrl plot``: learning curves of run directories, mean and 95% interval over seeds.

    robotrl plot runs/sac3 runs/td3 [metric=return_mean,length_mean] [x=steps|minutes]
                 [out=curves.png|.svg|.pdf]
"""

from __future__ import annotations

from robotrl.cli.args import parse_kv

KEYS = {"metric": str, "x": str, "out": str}


def plot_main(argv: list[str]) -> None:
    from robotrl.bench.plot import load_curves, plot_curves

    paths = [a for a in argv if "=" not in a]
    args = parse_kv([a for a in argv if "=" in a], KEYS)
    if not paths:
        raise SystemExit("usage: robotrl plot RUN_OR_FOLDER [...] [metric=return_mean] "
                         "[x=steps|minutes] [out=curves.png]")
    metrics = [m for m in str(args.get("metric", "return_mean")).split(",") if m]
    x, out = str(args.get("x", "steps")), str(args.get("out", "curves.png"))
    try:
        curves = load_curves(paths, metrics, x)
        where = plot_curves(curves, metrics, x, out)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    for curve in curves:
        last = {m: v[-1] for m, v in curve.y.items()}
        shown = ", ".join(f"{m} {mean:.1f} [{lo:.1f}, {hi:.1f}]"
                          for m, (mean, lo, hi) in last.items())
        print(f"{curve.label} (n={len(curve.runs)}), last evaluation: {shown}")
    print(f"wrote {where}")
