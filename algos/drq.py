"""DrQ: SAC from pixels with random-shift augmentation (Kostrikov et al. 2020, "Image
Augmentation Is All You Need: Regularizing Deep RL from Pixels").

The learner acts on the task's ``image`` group stacked over ``frame_stack`` frames (the build
wraps the worlds in ``robotrl.envs.wrappers.FrameStack``), encodes it with DrQ's convolutional
encoder (``robotrl.nn.pixels.PixelEncoder``) and runs SAC's losses (``robotrl.algos.sac``) on
the features. Every sampled observation and next observation is shifted by up to
``image_pad`` pixels (``random_shift``) before encoding. As in DrQ-v2 (Yarats et al. 2021) the
encoder is trained by the critic's loss alone: the actor reads detached features, and the target
critics read the online encoder's features of the next observations (no target encoder). The
replay keeps each frame once (``robotrl.storage.frames.FrameReplay``). One augmentation per
sample (DrQ's K = M = 1). The same call protocol as SAC:

    action = drq.act(obs)                  # obs["image"]: [N, frame_stack * 3, H, W] uint8
    out = env.step(action)
    drq.process_env_step(out.reward, out.terminated, out.truncated, out.info["final_obs"])
    metrics = drq.update(progress)

Not built: export (ONNX and ``robotrl deploy`` take vector observations), the field's action
repeat (DrQ steps cheetah's control 4 times per action), seed batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from robotrl.algos.sac import SAC, SACConfig, soft_td_target
from robotrl.nn.ensemble import EnsembleQ
from robotrl.nn.pixels import PixelEncoder, random_shift
from robotrl.nn.squashed_gaussian import SquashedGaussianActor
from robotrl.storage.frames import FrameReplay
from robotrl.types import EnvSpec, Obs

IMAGE = "image"
"""The observation group a pixel learner reads."""


@dataclass
class DrQConfig(SACConfig):
    """SAC's fields plus the encoder and the augmentation; DrQ's values in brackets where the
    defaults are sized for a 2-core CPU."""

    frame_stack: int = 3
    """Frames stacked into each observation [3]."""
    image_pad: int = 4
    """Random shifts of up to this many pixels each way [4]."""
    feature_dim: int = 50
    """Encoder output width [50]."""
    filters: int = 32
    """Filters of each of the encoder's four convolutions [32]."""
    buffer_size: int = 100_000
    """Replay capacity in transitions (two 3 x 84 x 84 frames each: 4.2 GB at 100k) [100k]."""
    save_replay: bool = False
    """Checkpoints leave the frames out (gigabytes); a resumed run refills its replay."""
    batch_size: int = 128
    """Transitions per update [512]."""
    learning_starts: int = 1000
    """Uniform random transitions before learning [1000]."""
    tau: float = 0.01
    """Polyak rate of the target critics [0.01]."""
    actor_update_interval: int = 2
    """Critic updates per actor update [2]."""
    init_alpha: float = 0.1
    """Initial temperature [0.1]."""
    actor_lr: float = 1e-3
    """[1e-3]"""
    critic_lr: float = 1e-3
    """Adam learning rate of the critics and the encoder [1e-3]."""
    alpha_lr: float = 1e-3
    """[1e-3]"""
    collect_steps: int = 1
    """Env steps per world between update phases."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.critic_obs != ("policy",):
            raise ValueError(f"DrQ's critic reads the image's features, not other groups; got "
                             f"critic_obs={list(self.critic_obs)}")
        for name in ("frame_stack", "feature_dim", "filters"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.image_pad < 0:
            raise ValueError(f"image_pad must be >= 0, got {self.image_pad}")


class DrQ(SAC):
    """SAC on encoded, randomly shifted frame stacks; see the module docstring.

    Attributes: ``encoder`` (``PixelEncoder``, trained with the critics' optimizer), and SAC's
    ``actor`` and ``critic``/``critic_target`` on its features.
    """

    config_class = DrQConfig
    name = "DrQ"
    cfg: DrQConfig

    def __init__(self, obs_dim: int, action_low: torch.Tensor, action_high: torch.Tensor,
                 num_envs: int, cfg: DrQConfig | None = None,
                 device: str | torch.device = "cpu", seed: int | None = None,
                 image_shape: tuple[int, ...] = (9, 84, 84)) -> None:
        """``image_shape``: the stacked ``image`` group's [frame_stack * C, H, W]."""
        self.image_shape = tuple(int(x) for x in image_shape)
        super().__init__(obs_dim, action_low, action_high, num_envs, cfg, device, seed)

    @classmethod
    def build(cls, spec: EnvSpec, cfg: Any, ctx: Any) -> DrQ:
        if IMAGE not in spec.observations:
            raise ValueError(f"DrQ learns from the {IMAGE!r} observation group; task "
                             f"{spec.task!r} has {sorted(spec.observations)}")
        return cls(spec.obs_dim, spec.action_low, spec.action_high, ctx.num_envs, cfg,
                   ctx.device, image_shape=spec.observations[IMAGE].shape)

    @classmethod
    def observations(cls, cfg: Any) -> tuple[str, ...]:
        return ("policy", IMAGE)

    @classmethod
    def frame_stack(cls, cfg: Any) -> int:
        """Frames the build stacks into the ``image`` group (``FrameStack``)."""
        return int(cfg.frame_stack)

    def _networks(self, state_dim: int, act_dim: int) -> tuple[nn.Module, nn.Module]:
        cfg = self.cfg
        self.encoder = PixelEncoder(self.image_shape, cfg.feature_dim, cfg.filters).to(
            self.device)
        return (SquashedGaussianActor(cfg.feature_dim, act_dim, cfg.actor_hidden, cfg.activation,
                                      squash_epsilon=cfg.squash_epsilon),
                EnsembleQ(cfg.feature_dim, act_dim, cfg.critic_hidden, cfg.num_critics,
                          cfg.activation))

    def _learning_state(self, act_dim: int) -> None:
        super()._learning_state(act_dim)
        # the encoder learns from the critics' loss, with their optimizer
        self.critic_opt.add_param_group({"params": list(self.encoder.parameters())})
        self.critic_step.params += list(self.encoder.parameters())

    def _make_buffer(self, state_dim: int, act_dim: int) -> FrameReplay:
        return FrameReplay(self.cfg.buffer_size, self.num_envs, self.image_shape,
                           self.cfg.frame_stack, act_dim, self.device)

    def _state(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        """The stacked frames [N, k*C, H, W] uint8 (what the replay stores)."""
        if not isinstance(obs, dict) or IMAGE not in obs:
            raise ValueError(f"DrQ acts on the {IMAGE!r} observation group; got "
                             f"{sorted(obs) if isinstance(obs, dict) else 'a tensor'}")
        image = obs[IMAGE].to(self.device)
        if tuple(image.shape[1:]) != self.image_shape:
            raise ValueError(f"DrQ was built for {IMAGE!r} of shape {self.image_shape}, got "
                             f"{tuple(image.shape[1:])}")
        return image

    # ------------------------------------------------------------------ acting
    @torch.no_grad()
    def act(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        state = self._state(obs)
        if self._warming_up():
            action = self._random_action(state.shape[0])
        else:
            action, _ = self.actor.sample(self.encoder(state), self.generator)
        return self._record(state, action)

    @torch.no_grad()
    def act_deterministic(self, obs: Obs | torch.Tensor) -> torch.Tensor:
        return self._to_env(self.actor.deterministic(self.encoder(self._state(obs))))

    @torch.no_grad()
    def act_sampled(self, obs: Obs | torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return self._to_env(self.actor.sample(self.encoder(self._state(obs)), generator)[0])

    def export_actor(self) -> Any:
        raise ValueError("DrQ's policy reads stacked images through a convolutional encoder; "
                         "export (ONNX, robotrl deploy) takes vector observations and is not "
                         "built for pixel policies")

    # ------------------------------------------------------------------ learning
    def _update_once(self) -> dict[str, torch.Tensor]:
        """One critic and encoder update on shifted frames (the actor and temperature on
        schedule, on the detached features); returns SAC's metric keys."""
        cfg, gen = self.cfg, self.generator
        batch = self.buffer.sample(cfg.batch_size, gen)
        alpha = self.log_alpha.detach().exp()
        features = self.encoder(random_shift(batch["obs"], cfg.image_pad, gen))
        with torch.no_grad():
            nxt = self.encoder(random_shift(batch["next_obs"], cfg.image_pad, gen))
            next_action, next_log_prob = self.actor.sample(nxt, gen)
            target = soft_td_target(batch["reward"], batch["terminated"],
                                    self.critic_target(nxt, next_action), next_log_prob, alpha,
                                    cfg.gamma)
        metrics = self._critic_step(self.critic(features, batch["action"]), target)
        self.num_updates += 1
        if self.num_updates % cfg.actor_update_interval == 0:
            metrics.update(self._actor_update({"obs": features.detach()}, alpha))
        self._polyak()
        metrics["train/alpha"] = alpha
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "encoder": self.encoder.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.encoder.load_state_dict(state["encoder"])
