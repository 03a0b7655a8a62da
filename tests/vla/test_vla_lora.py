"""LoRA for Hugging Face token policies (``policy=hf policy.lora=r``, ``robotrl/vla/hf.py``):
only the adapters (and the small layers around the LM) train, GRPO's KL reference is the LM with
its adapters off and equals the initial policy, the learner holds no second copy of the LM,
checkpoints round-trip and resume exactly, BC's adapters carry into GRPO, and a missing peft is
refused before anything is written. Tiny random models only; nothing is downloaded."""

from __future__ import annotations

import copy
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from robotrl.algos.grpo import GRPO, GRPOConfig
from robotrl.algos.offline.bc import BCConfig, TokenBC
from robotrl.checkpoint import load_checkpoint
from robotrl.cli.dataset import collect_main
from robotrl.config import TrainConfig, from_dict
from robotrl.envs import make
from robotrl.envs.wrappers import ActionChunks
from robotrl.experiment import run_training
from robotrl.experiment.build import build_runner
from robotrl.registry import build_policy
from robotrl.seeding import seed_everything
from robotrl.vla import policy_from_arch
from robotrl.vla.hf import HFPolicyConfig, HFTokenPolicy, LoRAReference

GROUPS = ("policy", "tokens", "image")
OPTIONS = {"templates": ["reach"], "image_size": 16}
# vocabulary 96 = 32 instruction words + 32 action bins + 32 spare ids
POLICY = {"hidden_size": 32, "layers": 2, "heads": 2, "vocab_size": 96, "bins": 32, "patch": 4,
          "lora": 8}
AROUND_LM = {"patches.weight", "patches.bias", "proprio.weight", "proprio.bias", "bos"}
"""The policy's own layers around the LM: new, so trained in full with LoRA too."""
OUTCOMES = [0, 1, 0, 1, 1, 1, 0, 0.0]
"""Fixed round outcomes, one per world (the groups of 4 differ)."""


def _env(n: int = 8) -> Any:
    return ActionChunks(make("tabletop", n, num_threads=1, observations=GROUPS, **OPTIONS), 2)


def _policy(env: Any, **cfg: Any) -> HFTokenPolicy:
    torch.manual_seed(0)
    return build_policy(HFPolicyConfig(**{**POLICY, **cfg}), env.spec)


def _grpo(env: Any, policy: HFTokenPolicy, kl_coef: float = 0.5) -> GRPO:
    cfg = GRPOConfig(group_size=4, outcome="success", num_epochs=2, num_minibatches=1,
                     dynamic_sampling=False, kl_coef=kl_coef, learning_rate=1e-2)
    return GRPO(env.spec.obs_dim, env.spec.action_low, env.spec.action_high, env.num_envs,
                env.spec.max_episode_steps, cfg, seed=0, policy=policy,
                obs_specs=env.spec.observations)


def _frozen(policy: HFTokenPolicy) -> dict[str, torch.Tensor]:
    """The LM's own weights (everything but the adapters), copied."""
    return {n: p.detach().clone() for n, p in policy.lm.named_parameters() if ".lora_" not in n}


def _trainable(module: torch.nn.Module) -> set[str]:
    return {n for n, p in module.named_parameters() if p.requires_grad}


def _bytes(*tensors: torch.Tensor) -> int:
    """Bytes of the distinct storages among ``tensors``."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


def _learner_tensors(alg: GRPO) -> dict[str, list[torch.Tensor]]:
    state = [t for s in alg.optimizer.state.values() for t in s.values()
             if isinstance(t, torch.Tensor)]
    return {"policy": [*alg.policy.parameters(), *alg.policy.buffers()],
            "reference": [*alg.ref_policy.parameters(), *alg.ref_policy.buffers()],
            "optimizer": state}


# ---------------------------------------------------------------------------------- GRPO
@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_grpo_trains_only_adapters_and_its_reference_stays_the_initial_policy(
        model_type: str, grpo_round) -> None:
    env = _env()
    policy = _policy(env, model_type=model_type)
    initial = copy.deepcopy(policy)  # the test's own full copy of the initial policy
    alg = _grpo(env, policy)
    lm_weights = _frozen(policy)
    adapters = {n for n, _ in policy.named_parameters() if ".lora_A." in n or ".lora_B." in n}
    assert adapters and _trainable(policy) == adapters | AROUND_LM
    optimized = {id(p) for group in alg.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in policy.parameters() if p.requires_grad}
    assert isinstance(alg.ref_policy, LoRAReference)
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    obs = env.reset(seed=0)
    for _ in range(3):
        obs = grpo_round(alg, env, obs, OUTCOMES)
        metrics = alg.update()
    assert metrics["loss/kl_ref"] > 0  # the policy moved away from the reference
    for name, value in policy.lm.named_parameters():  # the LM's own weights: bit-identical
        if name in lm_weights:
            assert torch.equal(value, lm_weights[name]), name
    for name, value in policy.named_parameters():  # every trained tensor moved
        if name in before and ".lora_A." not in name:  # A gets no gradient while B is zero
            assert not torch.equal(value, before[name]), name
    with torch.no_grad():
        action, logp = policy.sample(obs, torch.Generator().manual_seed(1))
        now = policy.evaluate(obs, action)[0]
        ref = alg.ref_policy.evaluate(obs, action)[0]
        assert torch.equal(ref, initial.evaluate(obs, action)[0])
        assert (now - ref).abs().max() > 1e-3
        torch.testing.assert_close(logp, now, atol=1e-5, rtol=0)  # KV-cached decoding, adapters on


def test_grpo_holds_no_second_copy_of_the_lm(grpo_round) -> None:
    env = _env()
    held = {}
    for lora in (0, 8):
        alg = _grpo(env, _policy(env, lora=lora))
        grpo_round(alg, env, env.reset(seed=0), OUTCOMES)
        alg.update()
        held[lora] = {k: _bytes(*v) for k, v in _learner_tensors(alg).items()}
        policy = alg.policy
        every = _bytes(*policy.parameters())
        trained = sum(p.numel() * p.element_size() for p in policy.parameters() if p.requires_grad)
        around = sum(p.numel() * p.element_size() for n, p in policy.named_parameters()
                     if n in AROUND_LM)
        shared = _bytes(*_learner_tensors(alg)["policy"], *_learner_tensors(alg)["reference"])
        if lora:
            assert held[lora]["reference"] == around  # copies of the layers around the LM only
            assert shared == held[lora]["policy"] + around
            assert trained < 0.5 * every  # rank 8 of width 32: a far smaller share on real LMs
        else:
            assert held[lora]["reference"] == held[lora]["policy"]  # a full frozen copy
        # Adam: two moments per trained element, and a step count per trained tensor
        steps = sum(1 for p in policy.parameters() if p.requires_grad)
        assert held[lora]["optimizer"] == 2 * trained + steps * 4
    assert held[8]["optimizer"] < 0.5 * held[0]["optimizer"]
    assert held[8]["reference"] < 0.1 * held[0]["reference"]


# ------------------------------------------------------------------------------------ BC
def test_token_bc_trains_only_adapters() -> None:
    from robotrl.data.dataset import DatasetCard
    from robotrl.runners.collect import collect

    base = make("tabletop", 16, num_threads=1, observations=GROUPS, **OPTIONS)
    gen = torch.Generator().manual_seed(0)
    data = collect(base, lambda obs: base.task.expert(base.sim, gen, 0.1), 320,
                   DatasetCard(task="robotrl/Tabletop"), 0, 0.0, False, GROUPS)
    env = ActionChunks(base, 2)
    # adapters on the output head too: a tiny random LM's frozen head (weights of std 0.02
    # after a unit-RMS norm) bounds its logits to about +-0.6, so "all-linear" learns slowly
    policy = _policy(env, lora_targets=".*(proj|lm_head)")
    lm_weights = _frozen(policy)
    assert any("lm_head.lora_B" in n for n in _trainable(policy))
    bc = TokenBC(policy, env.spec, BCConfig(updates_per_iteration=20, batch_size=32,
                                            actor_lr=1e-2), seed=0)
    assert {id(p) for g in bc.optimizer.param_groups for p in g["params"]} == {
        id(p) for p in policy.parameters() if p.requires_grad}
    bc.attach(data)
    losses = [bc.update()["loss/bc"] for _ in range(4)]
    assert losses[-1] < losses[0] - 0.15, losses  # nats: the adapters and the layers around
    for name, value in policy.lm.named_parameters():
        if name in lm_weights:
            assert torch.equal(value, lm_weights[name]), name


# ------------------------------------------------------------------ checkpoints, BC -> GRPO
def _run(run_dir: Path, algo: dict[str, Any], **over: Any) -> TrainConfig:
    return from_dict(TrainConfig, {
        "algo": algo, "env": {"task": "tabletop", "options": dict(OPTIONS)},
        "policy": {"name": "hf", **POLICY}, "logger": {"tensorboard": False, "progress": False},
        "run_dir": str(run_dir), "checkpoint_interval": 1000, "torch_threads": 1, **over})


GRPO_ALGO = {"name": "grpo", "group_size": 4, "outcome": "success", "train_states": 8,
             "test_states": 4, "num_epochs": 1, "num_minibatches": 1, "kl_coef": 0.5,
             "learning_rate": 1e-2, "dynamic_sampling": False}


@pytest.fixture(scope="module")
def bc_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished BC run with policy.lora=8 (its adapters trained)."""
    root = tmp_path_factory.mktemp("lora")
    demos = root / "reach.hdf5"
    collect_main(["task=tabletop", "kind=scripted", "steps=640", "num_envs=32", "noise=0.1",
                  "eval_episodes=4", "progress=false", f"out={demos}",
                  "options.templates=[reach]", "options.image_size=16"])
    cfg = _run(root / "bc", {"name": "bc", "updates_per_iteration": 10, "batch_size": 32,
                             "actor_lr": 1e-2}, dataset=str(demos), total_steps=20,
               eval_episodes=4)
    seed_everything(0)
    run_training(cfg)
    return root / "bc"


def test_bc_checkpoint_holds_the_adapters_and_round_trips(bc_run: Path) -> None:
    state = load_checkpoint(bc_run / "checkpoints" / "last.pt")["algo"]
    assert state["arch"]["config"]["lora"] == 8
    policy = policy_from_arch(state["arch"])
    policy.load_state_dict(state["policy"])
    assert policy._adapters_trained()  # BC trained them; the rebuilt policy is LoRA-wrapped
    assert _trainable(policy) == {n for n in state["policy"] if ".lora_" in n} | AROUND_LM
    seed_everything(0)  # the run's initial LM: BC left its weights as they were
    fresh = build_runner(from_dict(TrainConfig, load_checkpoint(
        bc_run / "checkpoints" / "last.pt")["config"])).alg.policy
    for name, value in fresh.named_parameters():  # the LM's own weights only are unchanged
        assert torch.equal(value, state["policy"][name]) == (name not in _trainable(fresh)), name


def test_grpo_from_a_lora_bc_run_merges_its_adapters_and_resumes_exactly(
        bc_run: Path, tmp_path: Path) -> None:
    init = str(bc_run / "checkpoints" / "last.pt")
    bc = policy_from_arch(load_checkpoint(init)["algo"]["arch"])
    bc.load_state_dict(load_checkpoint(init)["algo"]["policy"])
    seed_everything(0)
    runner = build_runner(_run(tmp_path / "full", GRPO_ALGO, init=init, num_envs=8,
                               total_steps=480, eval_interval=0))
    policy = runner.alg.policy
    # BC's adapters were merged into the LM and restarted at zero: the LM without adapters
    # is BC's policy (to rounding) and the reference is GRPO's starting policy (exactly)
    assert not policy._adapters_trained() and bc._adapters_trained()
    env = _env()
    obs = env.reset(seed=3)
    with torch.no_grad():
        action = bc.sample(obs, torch.Generator().manual_seed(0))[0]
        start = policy.evaluate(obs, action)[0]
        torch.testing.assert_close(start, bc.evaluate(obs, action)[0], atol=1e-5, rtol=0)
        assert torch.equal(runner.alg.ref_policy.evaluate(obs, action)[0], start)
    runner.train()
    with torch.no_grad():
        assert torch.equal(runner.alg.ref_policy.evaluate(obs, action)[0], start)
        assert (policy.evaluate(obs, action)[0] - start).abs().max() > 1e-3
    # resume: half the run, then the rest from its checkpoint, equals the whole run
    seed_everything(0)
    build_runner(_run(tmp_path / "part", GRPO_ALGO, init=init, num_envs=8, total_steps=320,
                      eval_interval=0)).train()
    seed_everything(0)
    resumed = build_runner(_run(tmp_path / "part", GRPO_ALGO, num_envs=8, total_steps=480,
                                eval_interval=0))
    resumed.load(tmp_path / "part" / "checkpoints" / "last.pt")
    assert isinstance(resumed.alg.ref_policy, LoRAReference)
    resumed.train()
    assert resumed.global_step == runner.global_step
    for key, value in runner.alg.state_dict().items():
        if key in ("policy", "ref_policy"):
            other = resumed.alg.state_dict()[key]
            assert value.keys() == other.keys()
            for name, tensor in value.items():
                assert torch.equal(tensor, other[name]), (key, name)
    with torch.no_grad():
        assert torch.equal(resumed.alg.ref_policy.evaluate(obs, action)[0], start)


# ----------------------------------------------------------------------------- refusals
def test_building_a_lora_policy_warns_nothing() -> None:
    env = _env(4)
    for model_type in ("llama", "gpt2"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. get_peft_model's FutureWarning on transformers 5
            _policy(env, model_type=model_type).reference()


def test_bad_lora_settings_fail_naming_the_key() -> None:
    with pytest.raises(ValueError, match="policy.lora must be >= 0"):
        HFPolicyConfig(lora=-1)
    with pytest.raises(ValueError, match="policy.lora_targets='.*nothing'"):
        _policy(_env(4), lora_targets=".*nothing")


def test_missing_peft_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = HFPolicyConfig(**POLICY)  # made while peft is there; the build finds it gone
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` raises ImportError
    message = r"policy.lora=8 needs peft: pip install 'robotrl\[vla\]'"
    with pytest.raises(ValueError, match=message):
        HFPolicyConfig(**POLICY)
    with pytest.raises(ValueError, match=message):
        _run(tmp_path / "run", {"name": "grpo"})
    with pytest.raises(ImportError, match=r"policy.lora needs peft: pip install 'robotrl\[vla\]'"):
        build_policy(cfg, _env(4).spec)
    _policy(_env(4), lora=0)  # full fine-tuning needs no peft
    run_dir = tmp_path / "cli"
    code = ("import sys; sys.modules['peft'] = None; from robotrl.cli.main import main; "
            "main(['train', 'algo=grpo', 'env=tabletop', 'policy=hf', 'policy.lora=8', "
            f"'run_dir={run_dir}'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "config error: policy.lora=8 needs peft: pip install 'robotrl[vla]'")
    assert not run_dir.exists()
