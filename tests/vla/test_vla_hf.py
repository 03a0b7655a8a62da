"""Hugging Face causal LMs as token policies (``robotrl/vla/hf.py``): KV-cached decoding equals
teacher forcing, tempered log-probabilities, a BC learning check, local loading, bad inputs.
Tiny random models only; nothing is downloaded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from robotrl.types import Obs  # noqa: E402
from robotrl.vla.hf import HFPolicyConfig, HFTokenPolicy  # noqa: E402

IMAGE, WORDS, PROPRIO, N = (3, 16, 16), 8, 4, 6
LOW, HIGH = torch.tensor([-1.0, -2.0]), torch.tensor([1.0, 0.5])  # A = 2, D = chunk * 2 = 4


def _obs(n: int = N, seed: int = 0) -> Obs:
    """Tabletop-shaped observation groups: image [n, 3, 16, 16] uint8, tokens [n, 8] (ids < 32,
    0 pads), policy [n, 4]."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 32, (n, WORDS), generator=g)
    tokens[:, 5:] = 0
    return {"image": torch.randint(0, 256, (n, *IMAGE), generator=g, dtype=torch.uint8),
            "tokens": tokens, "policy": torch.randn(n, PROPRIO, generator=g)}


def _policy(seed: int = 0, **cfg: object) -> HFTokenPolicy:
    torch.manual_seed(seed)
    fields = {"hidden_size": 32, "layers": 2, "heads": 2, "vocab_size": 320, **cfg}
    return HFTokenPolicy(HFPolicyConfig(**fields), IMAGE, WORDS, PROPRIO, LOW, HIGH)


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_cached_decoding_equals_teacher_forcing(model_type: str) -> None:
    policy = _policy(model_type=model_type)
    policy.train()
    assert policy.training and not policy.lm.training  # the LM never drops out
    obs = _obs()
    with torch.no_grad():
        tokens = policy.tokenizer.encode(policy.sample(obs, torch.Generator().manual_seed(1))[0])
        forced = policy.forced(obs, tokens)
        assert forced.shape == (N, policy.num_tokens, 256)
        cache, logits = policy.start(obs)
        # action token t is the LM's id vocab - bins + t: its logits are the last 256 of 320
        full = policy.lm(inputs_embeds=policy._prefix(obs)).logits[:, -1]
        torch.testing.assert_close(logits, full[:, 320 - 256:], atol=1e-5, rtol=0)
        for i in range(policy.num_tokens):
            torch.testing.assert_close(logits, forced[:, i], atol=1e-4, rtol=0)
            if i + 1 < policy.num_tokens:
                cache, logits = policy.extend(cache, tokens[:, i], i)


def test_sample_log_probs_are_the_tempered_ones_evaluate_gives() -> None:
    policy = _policy(temperature=2.0)
    obs = _obs()
    with torch.inference_mode():
        action, logp = policy.sample(obs, torch.Generator().manual_seed(0))
    assert action.shape == logp.shape == (N, policy.num_tokens)
    tokens = policy.tokenizer.encode(action)
    logp_eval, entropy = policy.evaluate(obs, action)
    torch.testing.assert_close(logp, logp_eval.detach(), atol=1e-5, rtol=0)
    with torch.no_grad():
        logits = policy.forced(obs, tokens)
    for t in (2.0, 1.0, 0.5):
        policy.temperature = t
        expected = F.log_softmax(logits / t, -1).gather(-1, tokens[..., None]).squeeze(-1)
        torch.testing.assert_close(policy.log_prob(obs, action).detach(), expected,
                                   atol=1e-5, rtol=0)
    assert entropy.shape == (N, policy.num_tokens) and bool((entropy > 0).all())
    greedy = policy.tokenizer.encode(policy.deterministic(obs))
    with torch.no_grad():  # each greedy token is the argmax given the greedy ones before it
        assert torch.equal(policy.forced(obs, greedy).argmax(-1), greedy)


def test_bc_loss_falls_on_a_fixed_batch() -> None:
    policy = _policy(bins=32, vocab_size=96)
    obs = _obs(8)
    action = torch.rand(8, policy.num_tokens, generator=torch.Generator().manual_seed(3))
    action = policy.low + action * (policy.high - policy.low)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss, metrics = policy.bc_loss(obs, action)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(metrics["loss/bc"]))
    assert losses[-1] < 0.5 * losses[0], losses
    assert all(p.grad is not None for p in (policy.patches.weight, policy.proprio.weight,
                                            policy.bos))


def _save_tiny_lm(path: Path, vocab: int) -> torch.nn.Module:
    config = transformers.AutoConfig.for_model(
        "llama", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, vocab_size=vocab, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(5)
    lm = transformers.AutoModelForCausalLM.from_config(config)
    lm.save_pretrained(path)
    return lm


def test_loads_a_local_pretrained_model_and_rebuilds_from_arch(tmp_path: Path) -> None:
    saved = _save_tiny_lm(tmp_path, vocab=300).state_dict()
    policy = _policy(path=str(tmp_path))
    assert policy.action_offset == 300 - 256
    for name, value in policy.lm.state_dict().items():
        assert torch.equal(value, saved[name]), name
    rebuilt = HFTokenPolicy.from_arch(policy.arch)
    assert rebuilt.arch == policy.arch and rebuilt.arch["kind"] == "hf"
    torch.testing.assert_close(rebuilt.lm.state_dict(), policy.lm.state_dict())
    rebuilt.load_state_dict(policy.state_dict())
    obs, tokens = _obs(), torch.randint(0, 256, (N, policy.num_tokens))
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.forced(obs, tokens), policy.forced(obs, tokens))
    with pytest.raises(ValueError, match="LM's vocabulary \\(300\\) is too small"):
        _policy(path=str(tmp_path), bins=270)


def test_pickled_weights_and_remote_code_are_refused(tmp_path: Path) -> None:
    """policy.path loads safetensors weights only and never the code a model directory names."""
    import os

    class Sentinel:
        def __reduce__(self) -> tuple:
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    pickled = tmp_path / "pickled"
    _save_tiny_lm(pickled, vocab=300)
    for weights in pickled.glob("*.safetensors"):
        weights.unlink()
    torch.save({"x": Sentinel()}, pickled / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="safetensors only"):
        _policy(path=str(pickled))
    remote = tmp_path / "remote"
    _save_tiny_lm(remote, vocab=300)
    (remote / "evil_modeling.py").write_text(f"open({str(tmp_path / 'pwned')!r}, 'w')\n")
    config = json.loads((remote / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil_modeling.EvilConfig",
                          "AutoModelForCausalLM": "evil_modeling.Evil"}
    config["model_type"] = "evil"  # no built-in class: only the shipped code could load it
    (remote / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception):  # noqa: B017 - transformers' own refusal (type varies by version)
        _policy(path=str(remote))
    assert not (tmp_path / "pwned").exists()


def test_bad_inputs_fail_naming_the_problem(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="policy.vocab_size \\(200\\) is too small"):
        HFPolicyConfig(vocab_size=200)
    with pytest.raises(ValueError, match="policy.word_offset"):
        HFPolicyConfig(word_offset=-1)
    with pytest.raises(ValueError, match="policy.dtype"):
        HFPolicyConfig(dtype="float64")
    with pytest.raises(ValueError, match="policy.model_type='no_such_lm' is not a model type"):
        _policy(model_type="no_such_lm")
    with pytest.raises(FileNotFoundError, match="policy.path="):
        _policy(path=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="not a multiple of policy.patch"):
        _policy(patch=5)
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"pip install 'robotrl\[vla\]'"):
        _policy()
