"""``robotrl eval checkpoint=PATH episodes=20 [out=FILE.json] [video=true] [options.KEY=VALUE]``.

``options.KEY=VALUE`` changes a task option of the run's env for this evaluation, e.g.
``options.split=heldout`` evaluates a tabletop policy on held-out instructions. Tasks with a
success criterion also report the success rate (``info["success"]`` at each episode's end).
"""

from __future__ import annotations

from pathlib import Path

import torch

from robotrl.cli.args import parse_kv, split_options


def _video_writer(path: Path):  # noqa: ANN202 - imageio writer
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise SystemExit("video=true needs imageio with ffmpeg: pip install 'robotrl[video]'") from None
    try:
        return imageio.get_writer(path, fps=30)
    except ValueError:  # imageio without its ffmpeg plugin
        raise SystemExit("video=true needs imageio with ffmpeg: pip install 'robotrl[video]'") from None


def eval_main(argv: list[str]) -> None:
    from robotrl.checkpoint import write_json
    from robotrl.cli.build import build_algo, build_env, load_run
    from robotrl.envs.base import Obs, obs_to
    from robotrl.logging import console
    from robotrl.runners.evaluation import run_episodes, summarize_episodes
    from robotrl.seeding import derive_seed

    options, argv = split_options(argv)
    args = parse_kv(argv, {"checkpoint": str, "episodes": int, "out": str, "video": bool,
                           "seed": int, "device": str})
    if "checkpoint" not in args:
        raise SystemExit("robotrl eval needs checkpoint=PATH (a .pt file or a run directory)")
    cfg, ckpt = load_run(str(args["checkpoint"]), str(args.get("device", "cpu")))
    episodes = int(args.get("episodes", 20))
    if episodes < 1:
        raise SystemExit(f"episodes must be >= 1, got {episodes}")
    root = int(args.get("seed", cfg.seed))  # seed=S evaluates as a run seeded S would
    seeds = {name: derive_seed(root, name) for name in ("eval-env", "eval-reset")}
    cfg.env.options = {**cfg.env.options, **options}
    try:
        env = build_env(cfg, episodes, seeds["eval-env"], train=False)
    except (TypeError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    alg = build_algo(cfg, env.spec, ckpt["algo"])
    device = torch.device(cfg.device)

    def policy(obs: Obs) -> torch.Tensor:
        return alg.act_deterministic(obs_to(obs, device)).cpu()

    on_step, writer = None, None
    video = bool(args.get("video"))
    if video:
        video_path = Path(str(args.get("out", "eval.json"))).with_suffix(".mp4")
        try:
            env.reset()
            env.render(0, camera="task")
        except NotImplementedError:
            raise SystemExit(f"the {cfg.backend.name} backend cannot render") from None
        except Exception as err:  # noqa: BLE001 - GL backends fail in many ways
            raise SystemExit(
                f"offscreen rendering is not available ({type(err).__name__}: {err}); "
                "set MUJOCO_GL=egl (or osmesa after apt-get install libosmesa6)"
            ) from None
        video_path.parent.mkdir(parents=True, exist_ok=True)
        writer = _video_writer(video_path)
        done = {"ended": False}

        def on_step(e, out) -> None:  # noqa: ANN001 - world 0's first episode only
            if not done["ended"]:
                writer.append_data(e.render(0, camera="task"))
                done["ended"] = bool(out.terminated[0] | out.truncated[0])

    obs = env.reset(seed=seeds["eval-reset"])
    base = getattr(env, "unwrapped", env)
    if video and hasattr(getattr(base, "task", None), "instructions"):
        console.print(f"world 0's instruction: {base.task.instructions(base.sim)[0]!r}")
    result = summarize_episodes(run_episodes(env, obs, policy, on_step=on_step))
    result["seeds"] = {"root": root, **seeds}
    result["options"] = options
    if writer is not None:
        writer.close()
        console.print(f"video written to {video_path}")
    console.print(f"{cfg.env.task}: return {result['return_mean']:.1f} ± {result['return_std']:.1f}, "
                  f"length {result['length_mean']:.1f}"
                  + (f", success {result['success']:.1%}" if "success" in result else "")
                  + f" over {result['episodes']} episodes")
    if "out" in args:
        write_json(Path(str(args["out"])), result)
        console.print(f"wrote {args['out']}")
