"""Parameter memory of the GRPO learner for a Hugging Face policy, full fine-tuning vs LoRA.

Builds ``robotrl train algo=grpo policy=hf algo.kl_coef=0.1 ...`` (a random LM from the policy's
size keys; nothing is downloaded) through the experiment API, trains one iteration so that Adam
holds its state, and counts the bytes of the distinct tensors the learner holds: the policy
(parameters and buffers), its KL reference beyond what the policy holds (a full frozen copy
without LoRA, copies of the layers around the LM with it) and the optimizer state.

    python benchmarks/lora_memory.py                          # the tiny default and hidden 256 x 4
    python benchmarks/lora_memory.py --sizes 1024x8 --lora 16
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import torch
from common import banner, machine_meta, write_json
from rich.console import Console

from robotrl.experiment import Experiment

console = Console()


def distinct_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages among ``tensors``."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in tensors}.values())


def measure(hidden: int, layers: int, lora: int, run_dir: str) -> dict[str, Any]:
    """One GRPO iteration on tabletop with an ``hidden`` x ``layers`` random Llama; bytes held."""
    experiment = Experiment.from_overrides([
        "algo=grpo", "env=tabletop", "env.options.image_size=16", "policy=hf",
        f"policy.hidden_size={hidden}", f"policy.layers={layers}", f"policy.lora={lora}",
        "algo.kl_coef=0.1", "algo.group_size=4", "algo.dynamic_sampling=false",
        "algo.num_epochs=1", "algo.num_minibatches=1", "algo.train_states=8",
        "algo.test_states=4", "num_envs=8", "total_steps=160", "eval_interval=0",
        "eval_episodes=4", "torch_threads=1", "logger.tensorboard=false",
        "logger.progress=false", f"run_dir={run_dir}"])
    runner = experiment.build()
    runner.train()
    alg = runner.alg
    policy = [*alg.policy.parameters(), *alg.policy.buffers()]
    reference = [*alg.ref_policy.parameters(), *alg.ref_policy.buffers()]
    state = [t for s in alg.optimizer.state.values() for t in s.values()
             if isinstance(t, torch.Tensor)]
    held = {"policy": distinct_bytes(policy),
            "reference": distinct_bytes(policy + reference) - distinct_bytes(policy),
            "optimizer": distinct_bytes(state)}
    trainable = sum(p.numel() for p in alg.policy.parameters() if p.requires_grad)
    return {"hidden": hidden, "layers": layers, "lora": lora,
            "parameters": sum(p.numel() for p in alg.policy.parameters()),
            "trainable": trainable, "bytes": {**held, "total": sum(held.values())}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="*", default=["64x2", "256x4"],
                   help="random LMs as HIDDENxLAYERS (policy.hidden_size, policy.layers)")
    p.add_argument("--lora", type=int, default=8, help="the LoRA rank compared with rank 0")
    p.add_argument("--out", default="benchmarks/figures/vla/lora_memory.json",
                   help="JSON written here")
    args = p.parse_args()
    torch.set_num_threads(1)
    console.print(banner("GRPO learner memory: full fine-tuning vs LoRA", "1 thread"))
    rows = []
    for size in args.sizes:
        hidden, layers = (int(x) for x in size.split("x"))
        for lora in (0, args.lora):
            with tempfile.TemporaryDirectory() as run_dir:
                row = measure(hidden, layers, lora, run_dir)
            b = row["bytes"]
            console.print(f"hidden {hidden} x {layers} layers, lora={lora}: "
                          f"{row['parameters']:,} parameters ({row['trainable']:,} trained); "
                          f"policy {b['policy'] / 2**20:.2f} MiB + reference "
                          f"{b['reference'] / 2**20:.2f} MiB + Adam {b['optimizer'] / 2**20:.2f} "
                          f"MiB = {b['total'] / 2**20:.2f} MiB")
            rows.append(row)
    write_json(args.out, {"meta": machine_meta(), "args": vars(args), "rows": rows}, console)


if __name__ == "__main__":
    main()
