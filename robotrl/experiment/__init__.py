"""The public API of robotrl: compose a run's config from overrides, validate it once, build,
train, and read a run directory back. The CLI and every benchmark call it; nothing here prints
beyond the run's own progress.

    from robotrl.experiment import Experiment, RunDir
    Experiment.from_overrides(["algo=ppo", "env=hopper", "run_dir=runs/x"]).run()
    RunDir("runs/x").eval()
"""

from robotrl.experiment.build import (
    TrainedRun,
    build_algo,
    build_env,
    build_runner,
    load_run,
    load_trained,
)
from robotrl.experiment.compose import (
    ConfigError,
    check_overrides,
    compose,
    resolve_config,
    task_from_dataset,
    validate,
)
from robotrl.experiment.run import (
    RESULT_FILE,
    Experiment,
    RunDir,
    config_digest,
    config_fields,
    run_training,
    save_config,
)

__all__ = [
    "RESULT_FILE",
    "ConfigError",
    "Experiment",
    "RunDir",
    "TrainedRun",
    "build_algo",
    "build_env",
    "build_runner",
    "check_overrides",
    "compose",
    "config_digest",
    "config_fields",
    "load_run",
    "load_trained",
    "resolve_config",
    "run_training",
    "save_config",
    "task_from_dataset",
    "validate",
]
