"""``robotrl`` console command: ``train`` (Hydra), ``eval``, ``demo``, ``export``, ``deploy``,
``gap``, ``dataset``, ``bench``, ``ope``, ``checkpoint``.

Every command refuses bad input with one line naming the problem and exit status 2.
"""

from __future__ import annotations

import importlib
import sys

BAD_INPUT: tuple[tuple[str, str], ...] = (("robotrl.checkpoint", "CheckpointError"),
                                          ("robotrl.data.dataset", "DatasetError"),
                                          ("robotrl.envs.robots", "RobotUnavailable"))
"""Errors that mean a file the user named (or a robot's model) is unusable: one line and exit
2, no traceback (looked up among the loaded modules: a command that raised one has imported
it)."""


def _bad_input(err: Exception) -> bool:
    kinds = [getattr(sys.modules.get(module), name, None) for module, name in BAD_INPUT]
    return any(isinstance(kind, type) and isinstance(err, kind) for kind in kinds)

USAGE = """usage: robotrl <command> [key=value ...]      robotrl --version

commands:
  train   train a policy from the Hydra configs, e.g.
          robotrl train algo=ppo env=hopper num_envs=64 seed=3
          robotrl train -m seed=0,1,2          (multirun)
          robotrl train resume=runs/.../checkpoints/last.pt
          robotrl train algo=iql dataset=robotrl/hopper/expert-v0   (offline, from a dataset)
  eval    evaluate a checkpoint: robotrl eval checkpoint=PATH episodes=20 [out=FILE.json] [video=true]
                 [options.KEY=VALUE]   (a task option for this evaluation, e.g. options.split=heldout)
  demo    step a batch of simulated worlds and print throughput: robotrl demo [task=ant num_envs=256]
  export  export a checkpoint's deterministic actor, verified on rollout observations:
          robotrl export checkpoint=PATH format=onnx|pt2|torchscript [out=FILE] [num_obs=10000]
  deploy  run an exported policy in a fixed-rate control loop with safety limits:
          robotrl deploy model=FILE.onnx|.pt2|.pt [hz=500] [seconds=10] [source=sim|module:attr]
                 [task=NAME] [max_delta=0.1] [timeout_ms=1] [safe_action=last|default]
  gap     sim-to-sim gap: returns on a grid of perturbed physics: robotrl gap checkpoint=PATH
  dataset record or inspect an offline dataset (Minari or D4RL-style HDF5):
          robotrl dataset collect kind=random|medium|expert|medium-replay|medium-expert|scripted
                 [task=NAME] [checkpoint=PATH] [expert=PATH] [steps=1000000] [noise=0.1]
                 [recipe=mean-noise|d4rl] [out=DIR|FILE.hdf5]
                 [options.KEY=VALUE]   (task options, recorded in the card)
          robotrl dataset info robotrl/hopper/expert-v0
  bench   run a declared benchmark grid (algorithms x tasks or datasets x seeds x budgets, and
          the peers beside them) through a Hydra launcher, each cell an ordinary run directory
          reused when finished and resumed when interrupted; then the report from the runs:
          robotrl bench run benchmarks/grids/offline.yaml [jobs=2 launcher=basic|joblib|
                 submitit_slurm] [seeds=[0,1] budgets=[2000] ...any grid field]
          robotrl bench report GRID [--check]    robotrl bench list GRID
  ope     estimate a checkpoint's value from a dataset alone (fitted Q evaluation):
          robotrl ope checkpoint=PATH dataset=ID [updates=10000] [gamma=0.99] [simulate=true]
  plot    learning curves of run directories (seeds of one config averaged, 95% interval),
          one panel per metric: robotrl plot runs/sac3 runs/td3 [metric=return_mean,length_mean]
                 [x=steps|minutes] [out=curves.png|.svg|.pdf]
  robots  the robot models (MuJoCo Menagerie) and where they are read from: robotrl robots list;
          robotrl robots offline out=DIR   (Go1 and G1 from mjlab's PyPI wheel, for MENAGERIE_ROOT)
  checkpoint upgrade PATH   convert a checkpoint of robotrl's earlier pickle format, which
          can run code when loaded (trusts the file: your own runs only)
"""

COMMANDS: dict[str, str] = {
    "train": "robotrl.cli.train:train_main",
    "eval": "robotrl.cli.evaluate:eval_main",
    "demo": "robotrl.cli.demo:demo_main",
    "export": "robotrl.cli.export:export_main",
    "deploy": "robotrl.cli.deploy:deploy_main",
    "gap": "robotrl.cli.gap:gap_main",
    "dataset": "robotrl.cli.dataset:dataset_main",
    "bench": "robotrl.cli.bench:bench_main",
    "ope": "robotrl.cli.ope:ope_main",
    "plot": "robotrl.cli.plot:plot_main",
    "checkpoint": "robotrl.cli.checkpoint:checkpoint_main",
    "robots": "robotrl.cli.robots:robots_main",
}
"""Command -> "module:function(argv)", imported only when that command runs."""


def version_line() -> str:
    """``robotrl X | torch Y | mujoco Z | device``: what a bug report needs first."""
    import mujoco
    import torch

    from robotrl import __version__

    device = (f"cuda ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available()
              else f"cpu ({torch.get_num_threads()} threads)")
    return f"robotrl {__version__} | torch {torch.__version__} | mujoco {mujoco.__version__} | {device}"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    if argv[0] in ("--version", "-V", "version"):
        print(version_line())
        return
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"unknown command {command!r}; available: {', '.join(COMMANDS)}\n", file=sys.stderr)
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    module, function = COMMANDS[command].split(":")
    try:
        getattr(importlib.import_module(module), function)(rest)
    except SystemExit as stop:
        if not isinstance(stop.code, str):
            raise
        print(stop.code, file=sys.stderr)  # a refusal with its reason: bad input, exit 2
        raise SystemExit(2) from None
    except Exception as err:
        if not _bad_input(err):
            raise
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
