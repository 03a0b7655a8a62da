"""``robotrl`` console command: ``train`` (Hydra), ``eval``, ``demo``."""

from __future__ import annotations

import sys

USAGE = """usage: robotrl <command> [key=value ...]

commands:
  train   train a policy from the Hydra configs, e.g.
          robotrl train algo=ppo env=hopper num_envs=64 seed=3
          robotrl train -m seed=0,1,2          (multirun)
          robotrl train resume=runs/.../checkpoints/last.pt
  eval    evaluate a checkpoint: robotrl eval checkpoint=PATH episodes=20 [out=FILE.json] [video=true]
  demo    step a batch of simulated worlds and print throughput: robotrl demo [task=ant num_envs=256]
"""

COMMANDS = ("train", "eval", "demo")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"unknown command {command!r}; available: {', '.join(COMMANDS)}\n", file=sys.stderr)
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    if command == "train":
        from robotrl.cli.train import train_main

        train_main(rest)
    elif command == "eval":
        from robotrl.cli.evaluate import eval_main

        eval_main(rest)
    else:
        from robotrl.cli.demo import demo_main

        demo_main(rest)


if __name__ == "__main__":
    main()
