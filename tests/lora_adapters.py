"""PEFT LoRA adapters written by the tests (PEFT's file layout and names), and the reference they must
equal: the base model with the adapter merged into its weights (W += scale * B @ A)."""

import json
import math
import os

import torch
from safetensors.torch import save_file

from pagedserve.lora.shapes import ModelShapes

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def write_adapter(
    path: str,
    config,
    rank: int,
    alpha: float,
    targets: tuple[str, ...] = ATTENTION + MLP,
    seed: int = 0,
    use_rslora: bool = False,
    std: float = 0.3,
    weights_format: str = "safetensors",
    decoder: str = "model.",
    **extra_config: object,
) -> str:
    """A random adapter of `rank` on `targets` of every layer of a model of `config` (its decoder's modules
    under `decoder`); B nonzero (PEFT initializes it to zero, a trained adapter's is not) and large enough
    to change greedy tokens."""
    os.makedirs(path, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    sizes = ModelShapes.of(config).sizes
    for layer in range(config.num_hidden_layers):
        for kind in targets:
            n_in, n_out = sizes[kind]
            parent = "self_attn" if kind in ATTENTION else "mlp"
            prefix = f"base_model.model.{decoder}layers.{layer}.{parent}.{kind}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, n_in, generator=generator) * std
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(n_out, rank, generator=generator) * std
    if weights_format == "safetensors":
        save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    else:
        torch.save(tensors, os.path.join(path, "adapter_model.bin"))
    settings = dict(
        peft_type="LORA",
        r=rank,
        lora_alpha=alpha,
        target_modules=list(targets),
        use_rslora=use_rslora,
        bias="none",
        modules_to_save=None,
    )
    settings.update(extra_config)
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(settings, f)
    return path


def merge_adapter(model: torch.nn.Module, adapter_path: str) -> None:
    """W += scale * B @ A for every module of the adapter, in place (an HF transformers model)."""
    from safetensors.torch import load_file

    with open(os.path.join(adapter_path, "adapter_config.json")) as f:
        settings = json.load(f)
    tensors = load_file(os.path.join(adapter_path, "adapter_model.safetensors"))
    modules = dict(model.named_modules())
    with torch.no_grad():
        for key, a in tensors.items():
            if ".lora_A." not in key:
                continue
            b = tensors[key.replace(".lora_A.", ".lora_B.")]
            rank = a.shape[0]
            scale = settings["lora_alpha"] / (math.sqrt(rank) if settings.get("use_rslora") else rank)
            name = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            modules[name].weight += scale * (b @ a)
