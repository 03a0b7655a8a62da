"""Any Hugging Face ``transformers`` causal LM as a token policy (``policy=hf``).

The observation enters the LM through ``inputs_embeds``: image patches (a Conv2d patchifier
projecting to the LM's width, trained with it), the instruction words through the LM's own input
embedding table (word ``w`` is token id ``word_offset + w``), proprioception through a Linear,
then a learned begin-of-action embedding. Action tokens are the LAST ``bins`` ids of the LM's
vocabulary, as in OpenVLA (Kim et al. 2024, sec. 3.2, which overwrites the least used tokens of
the Llama 2 tokenizer); the policy's logits are the LM's logits restricted to those ids.
Decoding uses the LM's KV cache (``use_cache=True``), one position per step.

The LM comes from ``AutoModelForCausalLM.from_pretrained(path, local_files_only=True)`` (a
directory written by ``save_pretrained``) or, with ``path=""``, from a tiny random config of
``model_type``. With ``lora=r`` the LM's weights stay frozen and ``peft`` LoRA adapters of rank r
are trained (Hu et al. 2021), with the layers robotrl adds around the LM; GRPO's KL reference is
then the same LM with its adapters off, not a second copy of it (``HFTokenPolicy.reference``).
Needs ``pip install 'robotrl[vla]'``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import inspect
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from robotrl.types import Obs
from robotrl.vla.policy import TokenPolicy

DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
"""Values of ``HFPolicyConfig.dtype``."""
VLA_EXTRA = "pip install 'robotrl[vla]'"
"""What installs ``transformers`` and ``peft``."""
ADAPTER = "default"
"""The name of the policy's LoRA adapter in ``peft``."""


@dataclasses.dataclass
class HFPolicyConfig:
    """A Hugging Face causal LM behind the token-policy interface (``policy=hf``)."""

    path: str = ""
    """Local directory of a model saved by ``save_pretrained``; "" builds a tiny random model
    from the fields below (nothing is downloaded: ``local_files_only=True``)."""
    model_type: str = "llama"
    """The random model's ``transformers`` model type (``AutoConfig.for_model``)."""
    hidden_size: int = 64
    """The random model's width."""
    layers: int = 2
    """The random model's transformer blocks."""
    heads: int = 4
    """The random model's attention heads."""
    vocab_size: int = 512
    """The random model's vocabulary; must hold word_offset + word_vocab + bins ids."""
    chunk: int = 2
    """K: actions per decision (an action chunk; the env steps K times per decision)."""
    bins: int = 256
    """Tokens per action dimension (OpenVLA's 256): the last ``bins`` ids of the vocabulary."""
    temperature: float = 1.0
    """Sampling temperature; GRPO's log-probabilities are those of the tempered distribution."""
    patch: int = 8
    """Image patch side (pixels); the image side must be a multiple."""
    word_offset: int = 0
    """Instruction word id ``w`` is fed as LM token id ``word_offset + w``."""
    word_vocab: int = 32
    """Instruction word ids are below this (tabletop's vocabulary is smaller)."""
    dtype: str = "float32"
    """The LM's and adapters' parameter dtype: float32, bfloat16 or float16."""
    lora: int = 0
    """LoRA rank: train rank-``lora`` adapters of the LM with ``peft`` and freeze the LM's own
    weights (the image, proprioception and BOS layers around the LM are new: trained in full);
    0: train every weight. No adapter dropout: the LM runs in eval mode (``HFTokenPolicy``)."""
    lora_alpha: int = 16
    """LoRA scale numerator: an adapter adds ``lora_alpha / lora * B A x`` (OpenVLA: 16)."""
    lora_targets: str = "all-linear"
    """The LM modules that get adapters (peft's ``target_modules``): "all-linear", every linear
    layer but the output head (as OpenVLA), or a regex the full module names match, e.g.
    ``.*(q_proj|v_proj)`` (Llama, Qwen2, Mistral) or ``.*c_attn`` (GPT-2)."""

    def __post_init__(self) -> None:
        for name in ("hidden_size", "layers", "heads", "vocab_size", "chunk", "bins", "patch",
                     "word_vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"policy.{name} must be >= 1, got {getattr(self, name)}")
        if self.bins < 2:
            raise ValueError(f"policy.bins must be >= 2, got {self.bins}")
        if self.word_offset < 0:
            raise ValueError(f"policy.word_offset must be >= 0, got {self.word_offset}")
        if self.temperature <= 0:
            raise ValueError(f"policy.temperature must be > 0, got {self.temperature}")
        if self.dtype not in DTYPES:
            raise ValueError(f"policy.dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.lora < 0 or self.lora_alpha < 1:
            raise ValueError(f"policy.lora must be >= 0 and policy.lora_alpha >= 1, got "
                             f"{self.lora} and {self.lora_alpha}")
        if self.lora and importlib.util.find_spec("peft") is None:  # before anything is written
            raise ValueError(f"policy.lora={self.lora} needs peft: {VLA_EXTRA}")
        if not self.path:
            if self.hidden_size % self.heads:
                raise ValueError(f"policy.hidden_size ({self.hidden_size}) must be a multiple "
                                 f"of policy.heads ({self.heads})")
            _check_vocab(self, self.vocab_size, "policy.vocab_size")


def _check_vocab(cfg: HFPolicyConfig, vocab: int, what: str) -> None:
    """Instruction ids [word_offset, word_offset + word_vocab) and action ids
    [vocab - bins, vocab) must be disjoint ids of a ``vocab``-token vocabulary."""
    need = cfg.word_offset + cfg.word_vocab + cfg.bins
    if vocab < need:
        raise ValueError(f"{what} ({vocab}) is too small: the vocabulary must hold "
                         f"policy.word_offset + policy.word_vocab + policy.bins = "
                         f"{cfg.word_offset} + {cfg.word_vocab} + {cfg.bins} = {need} ids "
                         f"(instruction words, then the {cfg.bins} action ids at its end)")


def _require_transformers() -> ModuleType:
    """The ``transformers`` module, or an ImportError that names the extra to install."""
    try:
        import transformers
    except ImportError as err:
        raise ImportError(f"policy=hf needs Hugging Face transformers: {VLA_EXTRA}") from err
    return transformers


def _require_peft() -> ModuleType:
    """The ``peft`` module, or an ImportError that names the extra to install."""
    try:
        import peft
    except ImportError as err:
        raise ImportError(f"policy.lora needs peft: {VLA_EXTRA}") from err
    return peft


def _random_config(cfg: HFPolicyConfig, transformers: ModuleType) -> Any:
    """A ``transformers`` config of ``cfg.model_type`` sized by ``cfg``'s generic fields.

    Configs map the generic names onto their own (GPT-2's ``attribute_map`` sends
    ``hidden_size`` to ``n_embd``, ``num_hidden_layers`` to ``n_layer``, ...); the built model's
    embedding is checked afterwards, since an unmapped name would be stored and ignored.
    """
    try:
        default = transformers.AutoConfig.for_model(cfg.model_type)
    except ValueError:
        raise ValueError(f"policy.model_type={cfg.model_type!r} is not a model type of "
                         f"transformers {transformers.__version__} (e.g. llama, gpt2, qwen2, "
                         f"mistral; all: transformers.CONFIG_MAPPING)") from None
    sizes: dict[str, Any] = {
        "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads, "vocab_size": cfg.vocab_size,
        # special ids of the full-size model fall outside a tiny vocabulary; nothing here uses them
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
    }
    if hasattr(default, "intermediate_size"):  # Llama's default 11008 would dwarf a tiny model
        sizes["intermediate_size"] = 4 * cfg.hidden_size
    if hasattr(default, "num_key_value_heads"):
        sizes["num_key_value_heads"] = cfg.heads
    if getattr(default, "head_dim", None) is not None:
        sizes["head_dim"] = cfg.hidden_size // cfg.heads
    return transformers.AutoConfig.for_model(cfg.model_type, **sizes)


def load_lm(cfg: HFPolicyConfig) -> nn.Module:
    """The causal LM ``cfg`` names: loaded from ``cfg.path`` (local files only) or random."""
    transformers = _require_transformers()
    auto = transformers.AutoModelForCausalLM
    if cfg.path:
        if not Path(cfg.path).is_dir():
            raise FileNotFoundError(f"policy.path={cfg.path!r} is not a directory (expected a "
                                    f"model written by save_pretrained)")
        if not any(Path(cfg.path).glob("*.safetensors")):
            raise FileNotFoundError(f"policy.path={cfg.path!r} holds no .safetensors weights; "
                                    "robotrl loads model weights from safetensors only (a "
                                    "pickled pytorch_model.bin can run code when loaded): "
                                    "re-save it with save_pretrained(safe_serialization=True)")
        # weights from safetensors only, and never code shipped beside the model (auto_map)
        lm = auto.from_pretrained(cfg.path, local_files_only=True, use_safetensors=True,
                                  trust_remote_code=False)
    else:
        config = _random_config(cfg, transformers)
        try:
            lm = auto.from_config(config)
        except ValueError:
            raise ValueError(f"policy.model_type={cfg.model_type!r} has no causal LM "
                             f"(AutoModelForCausalLM) in transformers") from None
        emb = lm.get_input_embeddings()
        if (emb.num_embeddings, emb.embedding_dim) != (cfg.vocab_size, cfg.hidden_size):
            raise ValueError(f"policy.model_type={cfg.model_type!r} ignores the generic sizes "
                             f"(hidden_size, vocab_size, ...): its embedding is "
                             f"{emb.num_embeddings}x{emb.embedding_dim}; save such a model with "
                             f"save_pretrained and load it through policy.path")
    return lm.to(getattr(torch, cfg.dtype))


def add_lora(lm: nn.Module, cfg: HFPolicyConfig) -> nn.Module:
    """``lm`` with fresh rank-``cfg.lora`` adapters on its ``cfg.lora_targets`` (A random, B
    zero: the outputs are unchanged); only the adapters require gradients.

    ``peft.LoraModel`` rather than ``get_peft_model``: its ``PeftModel`` wrapper adds nothing
    used here, and peft 0.21 reads ``is_gradient_checkpointing`` there, deprecated in
    transformers 5 (a FutureWarning on every build).
    """
    peft = _require_peft()
    from transformers.pytorch_utils import Conv1D

    config = peft.LoraConfig(
        r=cfg.lora, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, target_modules=cfg.lora_targets,
        # GPT-2's linear layers are Conv1D, their weights stored transposed
        fan_in_fan_out=any(isinstance(m, Conv1D) for m in lm.modules()))
    try:
        return peft.LoraModel(lm, config, ADAPTER)
    except ValueError as err:  # no module matches the targets: peft lists the model's
        raise ValueError(f"policy.lora_targets={cfg.lora_targets!r}: {err}") from None


class HFTokenPolicy(TokenPolicy):
    """Prefix [image patches, instruction words, proprioception, BOS] then action tokens, run
    by a ``transformers`` causal LM (``self.lm``).

    Observation groups: ``image`` [N, 3, H, W] uint8, ``tokens`` [N, W] long (0 pads),
    ``policy`` [N, P] float (proprioception). The LM always runs in eval mode: GRPO compares
    log-probabilities taken at collection with those of the update, and dropout would make them
    differ at the same parameters (the adapters have no dropout either).
    """

    kind = "hf"
    config_cls = HFPolicyConfig

    def __init__(self, cfg: HFPolicyConfig, image_shape: tuple[int, ...], words: int,
                 proprio_dim: int, action_low: torch.Tensor, action_high: torch.Tensor) -> None:
        super().__init__(cfg, image_shape, words, proprio_dim, action_low, action_high)
        c = image_shape[0]
        self.lm = load_lm(cfg)
        params = inspect.signature(self.lm.forward).parameters  # peft's forward takes **kwargs
        emb = self.lm.get_input_embeddings()
        vocab, d, dtype = emb.num_embeddings, emb.embedding_dim, emb.weight.dtype
        out = self.lm.get_output_embeddings()
        logits_size = getattr(out, "out_features", None) or getattr(out, "num_embeddings", vocab)
        if logits_size != vocab:
            raise ValueError(f"the LM's output vocabulary ({logits_size}) differs from its input "
                             f"vocabulary ({vocab}): the action ids would be ambiguous")
        _check_vocab(cfg, vocab, "the LM's vocabulary")
        self.action_offset = vocab - cfg.bins  # action token t is LM token id action_offset + t
        self.patches = nn.Conv2d(c, d, cfg.patch, cfg.patch, dtype=dtype)
        self.proprio = nn.Linear(proprio_dim, d, dtype=dtype)
        scale = emb.weight.detach().float().std()  # the scale of the LM's own token embeddings
        self.bos = nn.Parameter((torch.randn(d) * scale).to(dtype))
        # only the last positions' logits are needed (renamed from num_logits_to_keep in 4.50)
        self._keep_arg = next((k for k in ("logits_to_keep", "num_logits_to_keep")
                               if k in params), None)
        # the KV cache argument and output: ``cache`` since transformers 5.x (``past_key_values``
        # is deprecated there, to be removed in 5.40), ``past_key_values`` before
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        if cfg.lora:
            self.lm = add_lora(self.lm, cfg)
        self.lm.eval()

    def train(self, mode: bool = True) -> HFTokenPolicy:
        """Set the adapters' mode; the LM stays in eval mode (see the class docstring)."""
        super().train(mode)
        self.lm.eval()
        return self

    def _embed_actions(self, tokens: torch.Tensor) -> torch.Tensor:
        """[..., d] the LM's input embeddings of action ``tokens`` [...] in ``range(bins)``."""
        return self.lm.get_input_embeddings()(tokens.long() + self.action_offset)

    def _prefix(self, obs: Obs, layers: nn.Module | None = None) -> torch.Tensor:
        """[N, prefix_len, d] embeddings of the observation and BOS, through ``layers``'
        ``patches``, ``proprio`` and ``bos`` (None: this policy's; ``LoRAReference``'s)."""
        own = self if layers is None else layers
        dtype = own.bos.dtype
        image = obs["image"].to(dtype) / 255.0 - 0.5
        patches = own.patches(image).flatten(2).transpose(1, 2)
        words = self.lm.get_input_embeddings()(obs["tokens"].long() + self.cfg.word_offset)
        proprio = own.proprio(obs["policy"].to(dtype))[:, None]
        bos = own.bos.expand(len(image), 1, -1)
        return torch.cat([patches, words, proprio, bos], 1)

    def _run(self, x: torch.Tensor, cache: Any, keep: int, use_cache: bool
             ) -> tuple[torch.Tensor, Any]:
        """(action logits [N, keep, bins] of the last ``keep`` positions, the LM's cache) after
        ``x`` [N, S, d] new positions following ``cache`` (None: none)."""
        extra: dict[str, Any] = {self._keep_arg: keep} if self._keep_arg else {}
        extra[self._cache_arg] = cache
        out = self.lm(inputs_embeds=x, use_cache=use_cache, **extra)
        ids = slice(self.action_offset, self.action_offset + self.cfg.bins)
        return out.logits[:, -keep:, ids], getattr(out, self._cache_arg)

    def start(self, obs: Obs) -> tuple[Any, torch.Tensor]:
        """(the LM's KV cache, logits [N, bins] of the first action token) after the prefix.
        The cache is a ``transformers`` ``Cache``, updated in place by ``extend``."""
        logits, cache = self._run(self._prefix(obs), None, 1, True)
        return cache, logits[:, -1]

    def extend(self, cache: Any, token: torch.Tensor, index: int) -> tuple[Any, torch.Tensor]:
        """Append action ``token`` [N] (one position; its position id comes from the cache's
        length, so ``index`` is implied) and return (cache, logits [N, bins])."""
        logits, cache = self._run(self._embed_actions(token)[:, None], cache, 1, True)
        return cache, logits[:, -1]

    def forced(self, obs: Obs, tokens: torch.Tensor, layers: nn.Module | None = None
               ) -> torch.Tensor:
        """Logits [N, D, bins] of every action token of ``tokens`` [N, D] in one LM call
        (``layers``: as ``_prefix``)."""
        x = torch.cat([self._prefix(obs, layers), self._embed_actions(tokens[:, :-1])], 1)
        logits, _ = self._run(x, None, tokens.shape[1], False)
        return logits

    # ------------------------------------------------------------------ LoRA
    @contextlib.contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        """Run the LM without its LoRA adapters inside: the base model (what peft's
        ``PeftModel.disable_adapter`` does for LoRA)."""
        if not self.cfg.lora:
            raise RuntimeError("the policy has no LoRA adapters (policy.lora=0)")
        self.lm.disable_adapter_layers()
        try:
            yield
        finally:
            self.lm.enable_adapter_layers()

    def _adapters_trained(self) -> bool:
        """Whether any adapter adds something (a B matrix is not zero)."""
        return any(bool(p.any()) for n, p in self.lm.named_parameters()
                   if ".lora_B." in n or ".lora_embedding_B." in n)

    def reference(self) -> nn.Module:
        """GRPO's KL reference: this policy as it is now, frozen. Without LoRA a frozen copy.
        With LoRA the same LM with its adapters off (no second copy of the LM) and frozen
        copies of the small layers trained around it (``LoRAReference``). Adapters that already
        add something (a policy trained with LoRA before, e.g. BC's given to GRPO as
        ``init=``) are first merged into the LM's weights and restarted at zero, so that the LM
        without adapters is this policy (log-probabilities move by the rounding of that sum)."""
        if not self.cfg.lora:
            return super().reference()
        if self._adapters_trained():
            self.lm = add_lora(self.lm.merge_and_unload(), self.cfg).eval()
        return LoRAReference(self)


class LoRAReference(nn.Module):
    """The KL reference of a LoRA ``HFTokenPolicy``: the policy's own LM with its adapters off,
    and frozen copies of the policy's ``patches``, ``proprio`` and ``bos`` as they were. Its
    ``state_dict`` holds those copies only: the LM is the policy's, and is not registered here.
    """

    def __init__(self, policy: HFTokenPolicy) -> None:
        super().__init__()
        self.patches = copy.deepcopy(policy.patches)
        self.proprio = copy.deepcopy(policy.proprio)
        self.bos = nn.Parameter(policy.bos.detach().clone())
        self.requires_grad_(False)
        object.__setattr__(self, "policy", policy)  # a plain attribute: not a submodule

    def evaluate(self, obs: Obs, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probabilities, entropies), each [N, D], of ``action`` [N, D]'s tokens under the
        reference (``TokenPolicy.evaluate``'s contract)."""
        policy: HFTokenPolicy = self.policy
        tokens = policy.tokenizer.encode(action)
        with policy.adapters_disabled():
            logits = policy.forced(obs, tokens, self)
        return policy.score(logits, tokens)
