"""Language-policy bridge: action tokenizer and token policies (a small VLA transformer, an
adapter for Hugging Face causal LMs) behind one ``sample``/``log_prob`` interface, so that BC and
GRPO train them through the same runners as every control policy."""

from robotrl.vla.policy import TokenPolicy
from robotrl.vla.tokenizer import ActionTokenizer

__all__ = ["ActionTokenizer", "TokenPolicy", "policy_from_arch"]


def policy_from_arch(arch: dict) -> TokenPolicy:
    """Rebuild an (untrained) token policy from its ``arch`` (checkpoints store it)."""
    from robotrl.registry import POLICIES, resolve

    kind = arch.get("kind")
    if kind not in POLICIES or POLICIES[kind][1] is None:
        raise ValueError(f"unknown token policy kind {kind!r}")
    return resolve(POLICIES[kind][1]).from_arch(arch)
