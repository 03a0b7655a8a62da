"""``robotrl eval checkpoint=PATH episodes=20 [out=FILE.json] [video=true] [options.KEY=VALUE]``.

``video=true`` films world 0's episode from the task's view camera (``robotrl.video``) into
``OUT.mp4`` (``eval.mp4`` without ``out``).

``options.KEY=VALUE`` changes a task option of the run's env for this evaluation, e.g.
``options.split=heldout`` evaluates a tabletop policy on held-out instructions. Tasks with a
success criterion also report the success rate (``info["success"]`` at each episode's end).

Velocity tasks (``go1_velocity``, ``g1_velocity``) also report velocity tracking on the fixed
command grid (``robotrl.runners.tracking``: linear and yaw-rate RMSE, falls per minute, mean
torque; ``tracking_seconds=10`` per command), under ``tracking`` in the JSON.
"""

from __future__ import annotations

from pathlib import Path

import torch

from robotrl.cli.args import parse_kv, split_options


def eval_main(argv: list[str]) -> None:
    from robotrl.checkpoint import write_json
    from robotrl.experiment.build import load_trained, tracking_report, tracks_velocity
    from robotrl.logging import console
    from robotrl.runners.evaluation import run_episodes, summarize_episodes
    from robotrl.runners.tracking import format_tracking
    from robotrl.types import Obs, obs_to

    options, argv = split_options(argv)
    args = parse_kv(argv, {"checkpoint": str, "episodes": int, "out": str, "video": bool,
                           "seed": int, "device": str, "tracking_seconds": float})
    if "checkpoint" not in args:
        raise SystemExit("robotrl eval needs checkpoint=PATH (a .pt file or a run directory)")
    episodes = int(args.get("episodes", 20))
    if episodes < 1:
        raise SystemExit(f"episodes must be >= 1, got {episodes}")
    seed = int(args["seed"]) if "seed" in args else None  # as a run seeded S would evaluate
    try:
        run = load_trained(str(args["checkpoint"]), episodes, seed,
                           str(args.get("device", "cpu")), options)
    except ValueError as err:  # an unusable file or a task option the task refuses
        raise SystemExit(f"error: {err}") from None
    cfg, env, alg = run.cfg, run.env, run.alg
    device = torch.device(cfg.device)

    def policy(obs: Obs) -> torch.Tensor:
        return alg.act_deterministic(obs_to(obs, device)).cpu()

    recorder = None
    if args.get("video"):
        from robotrl.video import (
            EVAL_SIZE,
            EpisodeRecorder,
            VideoUnavailable,
            check_video,
            write_mp4,
        )

        try:
            check_video(env, EVAL_SIZE, cfg.backend.name)
        except VideoUnavailable as err:
            raise SystemExit(f"error: {err}") from None
        recorder = EpisodeRecorder(EVAL_SIZE)

    obs = run.reset()
    base = getattr(env, "unwrapped", env)
    if recorder is not None:
        recorder.start(env)
        if hasattr(getattr(base, "task", None), "instructions"):
            console.print(f"world 0's instruction: {base.task.instructions(base.sim)[0]!r}")
    result = summarize_episodes(run_episodes(env, obs, policy, on_step=recorder))
    result["seeds"] = run.seeds
    result["options"] = options
    if recorder is not None:
        video_path = Path(str(args.get("out", "eval.json"))).with_suffix(".mp4")
        write_mp4(video_path, recorder.frames, recorder.fps)
        console.print(f"video of world 0's episode ({len(recorder.frames)} frames) written to "
                      f"{video_path}")
    console.print(f"{cfg.env.task}: return {result['return_mean']:.1f} ± {result['return_std']:.1f}, "
                  f"length {result['length_mean']:.1f}"
                  + (f", success {result['success']:.1%}" if "success" in result else "")
                  + f" over {result['episodes']} episodes")
    if tracks_velocity(cfg):  # the run's own config, this evaluation's options merged
        seconds = float(args.get("tracking_seconds", 10.0))
        if seconds <= 0:
            raise SystemExit(f"tracking_seconds must be > 0, got {seconds}")
        result["tracking"] = tracking_report(cfg, policy, run.seeds["eval-env"],
                                             run.seeds["eval-reset"], seconds=seconds)
        console.print(format_tracking(result["tracking"]))
    if "out" in args:
        write_json(Path(str(args["out"])), result)
        console.print(f"wrote {args['out']}")

