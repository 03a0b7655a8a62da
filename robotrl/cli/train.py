"""``robotrl train``: Hydra composes ``configs/train.yaml`` (sweeps and launchers included);
``robotrl.experiment`` checks, validates and runs. This module parses and prints only."""

from __future__ import annotations

import sys

from robotrl.experiment import ConfigError, Experiment, check_overrides, resolve_config
from robotrl.experiment.compose import hydra_overrides


def train_main(argv: list[str]) -> None:
    """Entry point: validate overrides, then hand over to Hydra."""
    import hydra
    from omegaconf import DictConfig, OmegaConf

    overrides = [a for a in argv if not a.startswith("-")]
    try:
        check_overrides(overrides)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        raise SystemExit(2) from None

    def refuse(kind: str, err: Exception, run_dir: str) -> None:
        """Exit 2 naming the problem; the run directory Hydra made for it goes if empty."""
        from robotrl.checkpoint import remove_if_empty

        print(f"{kind} error: {err}", file=sys.stderr)
        if run_dir:
            remove_if_empty(run_dir)
        raise SystemExit(2) from None

    @hydra.main(config_path="pkg://robotrl.configs", config_name="train", version_base="1.3")
    def _hydra_entry(dcfg: DictConfig) -> float:
        """One run; returns the sweep objective (``robotrl.cli.sweep.objective``)."""
        from robotrl.checkpoint import CheckpointError, RunLocked
        from robotrl.cli.sweep import objective, record_job, sweep_name
        from robotrl.data import DatasetError
        from robotrl.envs.robots import RobotUnavailable
        from robotrl.video import VideoUnavailable

        composed = OmegaConf.to_container(dcfg, resolve=True)
        try:
            resolved = resolve_config(composed, overrides)
            if resolved.logger.wandb and not resolved.logger.wandb_group:
                resolved.logger.wandb_group = sweep_name()  # a multirun's jobs side by side
            experiment = Experiment(resolved)  # validated here, once
        except CheckpointError as err:  # resume= names a missing, corrupt or foreign file
            refuse("checkpoint", err, str(composed.get("run_dir", "")))
        except (ConfigError, ValueError, TypeError) as err:
            refuse("config", err, str(composed.get("run_dir", "")))
        cfg = experiment.cfg
        try:
            result = experiment.run()
        except DatasetError as err:  # found when the data is read: nothing written yet
            refuse("dataset", err, cfg.run_dir)
        except RunLocked as err:  # the directory is another run's: touch nothing there
            print(f"run error: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        except CheckpointError as err:  # unreadable resume=, or unwritable (disk full)
            refuse("checkpoint", err, cfg.run_dir)
        except ConfigError as err:  # found when the worlds are built (env.train_options)
            refuse("config", err, cfg.run_dir)
        except VideoUnavailable as err:  # logger.video=true where videos cannot be made
            refuse("video", err, cfg.run_dir)
        except RobotUnavailable as err:  # no Menagerie model here (offline, or no extra)
            refuse("robot", err, cfg.run_dir)
        if result is not None or not cfg.distributed:  # data-parallel: rank 0 speaks for it
            record_job(cfg.run_dir, result)
        return objective(result)

    flags = [a for a in argv if a.startswith("-")]
    sys.argv = ["robotrl train", *flags, *hydra_overrides(overrides)]
    _hydra_entry()
