"""Write a tiny HF checkpoint as a GGUF file the way llama.cpp's converter lays it out (its tensor names,
Gemma's norms stored as 1 + w, fused tensors kept fused, Llama's q/k rows permuted, experts stacked per
projection, Qwen-MoE's expert sizes), with the default model's tokenizer metadata: a GGUF of any family for
the loading tests, read back by both pagedserve and transformers."""

import os
import re

import numpy as np
import torch
from gguf import (
    GGML_QUANT_SIZES,
    MODEL_ARCH_NAMES,
    GGMLQuantizationType,
    GGUFReader,
    GGUFValueType,
    GGUFWriter,
    get_tensor_name_map,
)
from gguf.quants import dequantize, quantize
from safetensors.torch import load_file, save_file

from pagedserve.utils.default_model import default_model_path

_MODEL_ARCH = {name: arch for arch, name in MODEL_ARCH_NAMES.items()}


def _copy_tokenizer(writer: GGUFWriter) -> None:
    reader = GGUFReader(default_model_path())
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value_type = field.types[0]
        if value_type == GGUFValueType.ARRAY:
            writer.add_array(key, field.contents())
        else:
            writer.add_key_value(key, field.contents(), value_type)


# A per-expert tensor (Mixtral's w1/w2/w3, Qwen-MoE's gate/up/down_proj) -> the name of its projection's
# stacked tensor, which llama.cpp's converter maps like any other.
_EXPERT = re.compile(r"(model\.layers\.\d+\.\w+\.experts)\.(\d+)\.(\w+\.weight)")


def _permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for its rope (the converter's `permute`)."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _gguf_tensors(folder: str, arch: str, config) -> dict[str, np.ndarray]:
    """llama.cpp name (its converter's map, from the gguf package) -> float32 tensor in llama.cpp's layout."""
    tensors: dict[str, np.ndarray] = {}
    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, tensor in load_file(os.path.join(folder, "model.safetensors")).items():
        weight = tensor.to(torch.float32).numpy().astype(np.float32)
        if arch == "gemma2" and name.endswith("norm.weight"):
            weight = weight + 1  # llama.cpp stores Gemma's (1 + w)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            weight = _permute(
                weight, config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
            )
        if name.endswith("shared_expert_gate.weight"):
            weight = weight.reshape(-1)  # [1, hidden] -> llama.cpp's [hidden]
        match = _EXPERT.fullmatch(name)
        if match:
            stacked, expert, part = match.groups()
            experts.setdefault(f"{stacked}.{part}", {})[int(expert)] = weight
        else:
            tensors[name] = weight
    for name, per_expert in experts.items():
        tensors[name] = np.stack([per_expert[e] for e in sorted(per_expert)])
    names = get_tensor_name_map(_MODEL_ARCH[arch], config.num_hidden_layers)
    converted = {}
    for name, weight in tensors.items():
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, f"llama.cpp's {arch} has no tensor for {name}"
        converted[gguf_name] = weight
    return converted


def write_gguf(folder: str, arch: str, path: str, quant_type: str = "F32") -> str:
    """`folder`'s config and tensors as `path` (general.architecture `arch`: gemma2 | phi3 | llama, Mixtral
    being llama with experts | qwen2moe | qwen3moe, every Qwen-MoE layer sparse as llama.cpp builds them).
    With `quant_type` (e.g. Q8_0), every matrix whose rows fill whole blocks is stored quantized (the
    router and norms stay F32, as llama.cpp's quantizer leaves them), and `folder`'s safetensors are
    rewritten with the dequantized values, so HF loads the weights the GGUF holds."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    writer = GGUFWriter(path, arch)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_embedding_length(config.hidden_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters.get("rope_theta", 10000.0))
    if arch in ("gemma2", "qwen3moe"):
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
    if arch == "gemma2":
        writer.add_sliding_window(config.sliding_window)
    if arch == "llama":
        writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    num_experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    if num_experts:
        writer.add_expert_count(num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
    if getattr(config, "moe_intermediate_size", None):  # Qwen-MoE, as llama.cpp's Qwen2MoeModel writes it
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    if getattr(config, "shared_expert_intermediate_size", None):
        writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    _copy_tokenizer(writer)
    qtype = GGMLQuantizationType[quant_type]
    for name, weight in _gguf_tensors(folder, arch, config).items():
        if _stays_float(name, weight, qtype):
            writer.add_tensor(name, weight)
        else:
            writer.add_tensor(name, quantize(weight, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if qtype != GGMLQuantizationType.F32:
        _round_trip_folder(folder, qtype)
    return path


# HF matrices whose GGUF tensor stays float: the routers (as llama.cpp's quantizer leaves them) and the
# shared expert's gate (a vector in the GGUF).
_FLOAT_MATRICES = ("block_sparse_moe.gate.weight", "mlp.gate.weight", "shared_expert_gate.weight")


def _stays_float(name: str, weight: np.ndarray, qtype: GGMLQuantizationType) -> bool:
    return (
        qtype == GGMLQuantizationType.F32
        or weight.ndim < 2
        or "ffn_gate_inp" in name
        or not _fills_blocks(weight, qtype)
    )


def _fills_blocks(weight: np.ndarray, qtype: GGMLQuantizationType) -> bool:
    """Rows a whole number of `qtype` blocks (else llama.cpp's quantizer keeps the tensor float)."""
    return weight.shape[-1] % GGML_QUANT_SIZES[qtype][0] == 0


def _round_trip_folder(folder: str, qtype: GGMLQuantizationType) -> None:
    """Replace `folder`'s matrices by the values the GGUF holds. ggml blocks run along rows and each row is
    quantized on its own, so quantizing in HF's row order (before the q/k permutation, per expert) gives
    the same values."""
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    for name, tensor in tensors.items():
        weight = tensor.to(torch.float32).numpy()
        if tensor.ndim == 2 and not name.endswith(_FLOAT_MATRICES) and _fills_blocks(weight, qtype):
            tensors[name] = torch.from_numpy(dequantize(quantize(weight, qtype), qtype).copy())
    save_file(tensors, path, metadata={"format": "pt"})
