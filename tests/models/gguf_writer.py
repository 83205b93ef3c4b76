"""Write a tiny HF checkpoint as a GGUF file the way llama.cpp's converter lays it out (its tensor names,
Gemma's norms stored as 1 + w, fused tensors kept fused), with the default model's tokenizer metadata: a
GGUF of any family for the loading tests, read back by both pagedserve and transformers."""

import os

import numpy as np
import torch
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from safetensors.torch import load_file

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


def write_gguf(folder: str, arch: str, path: str) -> str:
    """`folder`'s config and float32 tensors as `path` (general.architecture `arch`: gemma2 | phi3)."""
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
    writer.add_rope_freq_base(10000.0)
    if arch == "gemma2":
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
        writer.add_sliding_window(config.sliding_window)
    _copy_tokenizer(writer)
    for name, tensor in load_file(os.path.join(folder, "model.safetensors")).items():
        if arch == "gemma2" and name.endswith("norm.weight"):
            tensor = tensor + 1  # llama.cpp stores Gemma's (1 + w)
        writer.add_tensor(_gguf_name(name, arch), tensor.to(torch.float32).numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
