"""The tensors of llama.cpp's mmproj GGUF (--mmproj) under the image models' own module names, in HF's
layout and float32 (F16, Q8_0 and the like dequantized: the vision modules are plain torch ones). What
llama.cpp's converter changed is undone: Qwen2.5-VL's fused q/k/v and two-frame patch kernel, which it
splits, and Gemma 3's projector norm, which it stores as 1 + w. The text GGUF's tensors come from
model_loader/gguf.py, under `language_model.`."""

import re
from collections.abc import Iterator

import numpy as np
import torch

from pagedserve.errors import ConfigError
from pagedserve.families import MMPROJ_TOWERS

# llama.cpp's block names -> ours, per projector type (clip.projector_type).
_SIGLIP_BLOCK = {
    "ln1": "layer_norm1",
    "ln2": "layer_norm2",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
    "ffn_up": "mlp.fc1",
    "ffn_down": "mlp.fc2",
}
_QWEN_BLOCK = {
    "ln1": "norm1",
    "ln2": "norm2",
    "attn_out": "attn.proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GEMMA3_GLOBAL = {
    "v.patch_embd": "vision_tower.embeddings.patch_embedding",
    "v.position_embd": "vision_tower.embeddings.position_embedding",
    "v.post_ln": "vision_tower.post_layernorm",
    "mm.soft_emb_norm": "multi_modal_projector.mm_soft_emb_norm",
}
_QWEN_GLOBAL = {
    "v.post_ln": "visual.merger.ln_q",
    "mm.0": "visual.merger.mlp.0",
    "mm.2": "visual.merger.mlp.2",
}


def iterate_mmproj(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(our name, float32 tensor) for every tensor of the mmproj GGUF at `path` (checked by
    utils/gguf_mmproj.mmproj_facts when the config was read)."""
    from gguf.quants import dequantize

    from pagedserve.utils.gguf_tensors import read_gguf

    reader = read_gguf(path)
    projector = str(reader.metadata["clip.projector_type"])
    tensors = {
        t.name: np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32) for t in reader.tensors
    }
    renamed = _siglip(tensors) if MMPROJ_TOWERS[projector] == "siglip" else _qwen_vit(tensors)
    for name, weight in renamed:
        yield name, torch.from_numpy(np.array(weight, dtype=np.float32))  # a copy: the file is read-only


def _block(name: str) -> tuple[str, str, str] | None:
    """`v.blk.N.<block>.<suffix>` -> (N, block, suffix)."""
    match = re.fullmatch(r"v\.blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    return None if match is None else (match.group(1), match.group(2), match.group(3))


def _unknown(name: str) -> ConfigError:
    return ConfigError(f"The --mmproj GGUF holds tensor {name!r}, which this model does not have.")


def _siglip(tensors: dict[str, np.ndarray]) -> Iterator[tuple[str, np.ndarray]]:
    for name, weight in tensors.items():
        base, _, suffix = name.rpartition(".")
        block = _block(name)
        if block is not None and block[1] in _SIGLIP_BLOCK:
            yield f"vision_tower.encoder.layers.{block[0]}.{_SIGLIP_BLOCK[block[1]]}.{block[2]}", weight
        elif name == "mm.input_projection.weight":  # HF's bare [vision, text] matrix
            yield "multi_modal_projector.mm_input_projection_weight", weight
        elif base == "mm.soft_emb_norm":
            yield f"{_GEMMA3_GLOBAL[base]}.{suffix}", weight - 1
        elif base in _GEMMA3_GLOBAL:
            yield f"{_GEMMA3_GLOBAL[base]}.{suffix}", weight
        else:
            raise _unknown(name)


def _qwen_vit(tensors: dict[str, np.ndarray]) -> Iterator[tuple[str, np.ndarray]]:
    for name, weight in tensors.items():
        base, _, suffix = name.rpartition(".")
        block = _block(name)
        if name.startswith("v.patch_embd."):
            continue  # the two frames, joined below
        if block is not None and block[1] == "attn_q":  # q, k, v -> HF's fused qkv
            index, _, kind = block
            parts = [tensors[f"v.blk.{index}.attn_{p}.{kind}"] for p in "qkv"]
            yield f"visual.blocks.{index}.attn.qkv.{kind}", np.concatenate(parts)
        elif block is not None and block[1] in ("attn_k", "attn_v"):
            continue
        elif block is not None and block[1] in _QWEN_BLOCK:
            yield f"visual.blocks.{block[0]}.{_QWEN_BLOCK[block[1]]}.{block[2]}", weight
        elif base in _QWEN_GLOBAL:
            yield f"{_QWEN_GLOBAL[base]}.{suffix}", weight
        else:
            raise _unknown(name)
    # the Conv3d kernel [out, in, 2, patch, patch], stored as one Conv2d kernel per frame
    frames = [tensors["v.patch_embd.weight"], tensors["v.patch_embd.weight.1"]]
    yield "visual.patch_embed.proj.weight", np.stack(frames, axis=2)
