"""Write a tiny HF checkpoint as a GGUF file the way llama.cpp's converter lays it out (its tensor names,
Gemma's norms stored as 1 + w, fused tensors kept fused, Llama's q/k rows permuted, Mixtral's experts stacked
per projection), with the default model's tokenizer metadata: a GGUF of any family for the loading tests,
read back by both pagedserve and transformers."""

import os
import re

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize
from safetensors.torch import load_file, save_file

from pagedserve.utils.default_model import default_model_path

# HF layer tensor suffix -> llama.cpp's, per architecture.
_LAYER_NAMES = {
    "gemma2": {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    },
    "llama": {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "block_sparse_moe.gate": "ffn_gate_inp",
    },
    "phi3": {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.qkv_proj": "attn_qkv",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    },
}
_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def _gguf_name(name: str, arch: str) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    _, _, layer, rest = name.split(".", 3)
    module, _, suffix = rest.rpartition(".")
    return f"blk.{layer}.{_LAYER_NAMES[arch][module]}.{suffix}"


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


# Mixtral's per-expert tensor -> llama.cpp's stacked tensor of that projection.
_EXPERT = re.compile(r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w1|w2|w3)\.weight")
_EXPERT_NAMES = {"w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps"}


def _permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for its rope (the converter's `permute`)."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _gguf_tensors(folder: str, arch: str, config) -> dict[str, np.ndarray]:
    """llama.cpp name -> float32 tensor in llama.cpp's layout."""
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
        match = _EXPERT.fullmatch(name)
        if match:
            layer, expert, part = match.groups()
            experts.setdefault(f"blk.{layer}.{_EXPERT_NAMES[part]}.weight", {})[int(expert)] = weight
        else:
            tensors[_gguf_name(name, arch)] = weight
    for name, per_expert in experts.items():
        tensors[name] = np.stack([per_expert[e] for e in sorted(per_expert)])
    return tensors


def write_gguf(folder: str, arch: str, path: str, quant_type: str = "F32") -> str:
    """`folder`'s config and tensors as `path` (general.architecture `arch`: gemma2 | phi3 | llama, Mixtral
    being llama with experts). With `quant_type` (e.g. Q8_0), every matrix whose rows fill whole blocks is
    stored quantized (the router and norms stay F32, as llama.cpp's quantizer leaves them), and `folder`'s
    safetensors are rewritten with the dequantized values, so HF loads the weights the GGUF holds."""
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
    if arch == "gemma2":
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
        writer.add_sliding_window(config.sliding_window)
    if arch == "llama":
        writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    if getattr(config, "num_local_experts", None):
        writer.add_expert_count(config.num_local_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
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


def _stays_float(name: str, weight: np.ndarray, qtype: GGMLQuantizationType) -> bool:
    return qtype == GGMLQuantizationType.F32 or weight.ndim < 2 or "ffn_gate_inp" in name


def _round_trip_folder(folder: str, qtype: GGMLQuantizationType) -> None:
    """Replace `folder`'s matrices by the values the GGUF holds. ggml blocks run along rows and each row is
    quantized on its own, so quantizing in HF's row order (before the q/k permutation, per expert) gives
    the same values."""
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    for name, tensor in tensors.items():
        if tensor.ndim == 2 and not name.endswith("block_sparse_moe.gate.weight"):
            weight = tensor.to(torch.float32).numpy()
            tensors[name] = torch.from_numpy(dequantize(quantize(weight, qtype), qtype).copy())
    save_file(tensors, path, metadata={"format": "pt"})
