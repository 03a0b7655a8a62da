"""Preallocated on-device storage for rollouts."""

from robotrl.storage.rollout import MINIBATCH_KEYS, RolloutBuffer

__all__ = ["MINIBATCH_KEYS", "RolloutBuffer"]
