"""``robotrl ope``: a checkpoint's value estimated from a dataset alone (fitted Q evaluation),
optionally beside the same discounted value measured in the simulator.

    robotrl ope checkpoint=runs/.../checkpoints/last.pt dataset=robotrl/hopper/medium-v0
    robotrl ope checkpoint=... dataset=robot_logs.hdf5 simulate=false updates=20000 out=ope.json
    (also: gamma=0.99 episodes=10 device=cpu seed=0 threads=1)

With real-robot data there is no simulator to ask: ``simulate=false``. The estimate is the
expected discounted return (``gamma``) from the dataset's episode starts.
"""

from __future__ import annotations

from pathlib import Path


def ope_main(argv: list[str]) -> None:
    from robotrl.checkpoint import write_json
    from robotrl.cli.args import parse_kv
    from robotrl.data import DatasetError
    from robotrl.experiment.evaluate import off_policy_value
    from robotrl.logging import console

    args = parse_kv(argv, {"checkpoint": str, "dataset": str, "updates": int, "gamma": float,
                           "simulate": bool, "episodes": int, "device": str, "seed": int,
                           "out": str, "threads": int})
    for key in ("checkpoint", "dataset"):
        if key not in args:
            raise SystemExit(f"robotrl ope needs {key}=...; e.g. robotrl ope "
                             "checkpoint=runs/x/checkpoints/last.pt dataset=robotrl/hopper/medium-v0")
    out = args.pop("out", None)
    import torch

    torch.set_num_threads(int(args.pop("threads", 1)))  # 1 by default: see TrainConfig.torch_threads
    try:
        result = off_policy_value(**args)  # type: ignore[arg-type]
    except DatasetError as err:
        raise SystemExit(f"dataset error: {err}") from None
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    line = (f"FQE estimate {result['estimate']:.1f} ± {result['estimate_std']:.1f} (between "
            f"critics; gamma {result['gamma']}, {result['starts']} episode starts)")
    if "simulated" in result:
        line += f"; simulator {result['simulated']:.1f} ± {result['simulated_std']:.1f}"
    console.print(line)
    if out:
        write_json(Path(str(out)), result, indent=1)
        console.print(f"wrote {out}")
