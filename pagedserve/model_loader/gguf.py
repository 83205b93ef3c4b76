"""Checkpoint tensors of a GGUF file, renamed to HF names, in HF's layout: dequantized, or (`--quantization
gguf`) with 2-D tensors kept in their ggml blocks. The model's `checkpoint_tensors` then treats them as it
treats a HF folder's.

llama.cpp's converters change some tensors, undone here: q/k rows permuted for its rope layout (llama,
mistral), Gemma's norm weights stored as 1 + w, Falcon's fused q/k/v regrouped as [q; k; v], and experts
stacked into one tensor per projection (split here into HF's per-expert tensors). Mixtral is arch "llama"
with `llama.expert_count` in its metadata; its config, and Qwen2/3-MoE's expert sizes, are completed in
`utils/gguf_config.py`. BERT's ("bert", llama.cpp's embedding GGUFs) tensors take HF BertModel's names."""

import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch

from pagedserve.kernels.cpu.gguf_ops import NATIVE_GGML_TYPES
from pagedserve.logger import init_logger
from pagedserve.quantization.ggml_backend import check_kernel, kernel_types

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from pagedserve.utils.gguf_tensors import GGUFTensor

logger = init_logger(__name__)

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_qkv": "self_attn.qkv_proj",
    # Mixture of experts (Qwen2/3-MoE): the router, stacked experts, the shared expert and its gate.
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}
# Per architecture (general.architecture): names that differ from the table above.
_ARCH_LAYER_NAMES = {
    "phi3": {"ffn_up": "mlp.gate_up_proj"},  # gate and up fused, as in HF's checkpoint
    "gemma2": {
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
    "falcon": {
        "attn_norm": "input_layernorm",
        "attn_norm_2": "ln_mlp",
        "attn_qkv": "self_attention.query_key_value",
        "attn_output": "self_attention.dense",
        "ffn_up": "mlp.dense_h_to_4h",
        "ffn_down": "mlp.dense_4h_to_h",
    },
}
_ARCH_LAYER_NAMES["gemma3"] = _ARCH_LAYER_NAMES["gemma2"]
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_FALCON_GLOBAL_NAMES = {
    "token_embd": "transformer.word_embeddings",
    "output_norm": "transformer.ln_f",
    "output": "lm_head",
}
# BERT ("bert"): llama.cpp's names -> HF BertModel's (its reranker head, `cls`, is not read).
_BERT_GLOBAL_NAMES = {
    "token_embd": "embeddings.word_embeddings",
    "token_types": "embeddings.token_type_embeddings",
    "position_embd": "embeddings.position_embeddings",
    "token_embd_norm": "embeddings.LayerNorm",
}
_BERT_LAYER_NAMES = {
    "attn_q": "attention.self.query",
    "attn_k": "attention.self.key",
    "attn_v": "attention.self.value",
    "attn_output": "attention.output.dense",
    "attn_output_norm": "attention.output.LayerNorm",
    "ffn_up": "intermediate.dense",
    "ffn_down": "output.dense",
    "layer_output_norm": "output.LayerNorm",
}
# Matrices that are read as float32 whatever `keep_quantized` says: their layers are plain torch ones (a
# MoE router, BERT's position and token-type tables).
_ALWAYS_FLOAT = (".mlp.gate.weight", "position_embeddings.weight", "token_type_embeddings.weight")
# llama.cpp's converter permutes q/k rows of these architectures for its rope layout; we undo it.
_PERMUTED_ARCHS = ("llama", "mistral")
_GEMMA_ARCHS = ("gemma2", "gemma3")
_FLOAT_TYPES = ("F32", "F16", "BF16")


def _hf_name(name: str, arch: str, hf_config: "PretrainedConfig") -> str | None:
    base, _, suffix = name.rpartition(".")
    match = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if arch == "falcon":
        if match and match.group(2) == "attn_norm" and hf_config.new_decoder_architecture:
            return f"transformer.h.{match.group(1)}.ln_attn.{suffix}"
        names = {**_LAYER_NAMES, **_ARCH_LAYER_NAMES["falcon"]}
        if match and match.group(2) in names:
            return f"transformer.h.{match.group(1)}.{names[match.group(2)]}.{suffix}"
        return f"{_FALCON_GLOBAL_NAMES[base]}.{suffix}" if base in _FALCON_GLOBAL_NAMES else None
    if arch == "bert":
        if match and match.group(2) in _BERT_LAYER_NAMES:
            return f"encoder.layer.{match.group(1)}.{_BERT_LAYER_NAMES[match.group(2)]}.{suffix}"
        return f"{_BERT_GLOBAL_NAMES[base]}.{suffix}" if base in _BERT_GLOBAL_NAMES else None
    names = {**_LAYER_NAMES, **_ARCH_LAYER_NAMES.get(arch, {})}
    if match and match.group(2) in names:
        return f"model.layers.{match.group(1)}.{names[match.group(2)]}.{suffix}"
    return f"{_GLOBAL_NAMES[base]}.{suffix}" if base in _GLOBAL_NAMES else None


def _unpermute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _falcon_qkv(weight: np.ndarray, hf_config: "PretrainedConfig") -> np.ndarray:
    """[q; k; v] (llama.cpp) -> per KV group its query heads, key, value (HF's new architecture)."""
    if not hf_config.new_decoder_architecture:
        return weight  # 7B's multi-query layout is [q; k; v] already
    heads, kv_heads = hf_config.num_attention_heads, hf_config.num_kv_heads
    head_dim = weight.shape[0] // (heads + 2 * kv_heads)
    q, k, v = np.split(weight, [heads * head_dim, (heads + kv_heads) * head_dim])
    rest = weight.shape[1:]
    grouped = np.concatenate(
        [
            q.reshape(kv_heads, heads // kv_heads, head_dim, *rest),
            k.reshape(kv_heads, 1, head_dim, *rest),
            v.reshape(kv_heads, 1, head_dim, *rest),
        ],
        axis=1,
    )
    return grouped.reshape(weight.shape)


def _hf_tensors(
    name: str, weight: np.ndarray, arch: str, hf_config: "PretrainedConfig"
) -> Iterator[tuple[str, np.ndarray]]:
    """One GGUF tensor (already under its HF name) -> HF tensors in HF's layout."""
    if arch in _PERMUTED_ARCHS and name.endswith(("q_proj.weight", "k_proj.weight")):
        heads = hf_config.num_attention_heads if "q_proj" in name else hf_config.num_key_value_heads
        weight = _unpermute(weight, heads)
    elif arch in _GEMMA_ARCHS and name.endswith("norm.weight"):
        weight = weight - 1
    elif arch == "falcon" and "query_key_value" in name:
        weight = _falcon_qkv(weight, hf_config)
    elif name.endswith("shared_expert_gate.weight"):
        weight = weight.reshape(1, -1)
    match = re.fullmatch(r"(.*\.experts)\.(\w+)\.weight", name)
    if match:  # [num_experts, ...] -> one tensor per expert
        for expert, expert_weight in enumerate(weight):
            yield f"{match.group(1)}.{expert}.{match.group(2)}.weight", expert_weight
        return
    yield name, weight


def iterate_gguf(
    path: str,
    hf_config: "PretrainedConfig",
    keep_quantized: bool = False,
    loads: Callable[[str], bool] = lambda name: True,
    backend: str = "native",
    device: str = "cpu",
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, float32 tensor) for every tensor of the file. With `keep_quantized`, a 2-D tensor
    `<x>.weight` that needs no regrouping comes instead as `<x>.qweight_type` (its ggml type id, a 0-d
    int64 tensor) followed by `<x>.qweight` (uint8 [rows, row_bytes], its raw blocks, q/k rows in HF's
    order); float types (F32, F16, BF16) without a kernel in `backend` (--linear-backend) become F32 rows,
    on native any type without a kernel too, with a log line; on the others such a type raises ConfigError
    naming it and `device`. Stacked experts come the same way, one expert at a time
    (`<experts>.<e>.<proj>.qweight_type`, `.qweight`). The `_ALWAYS_FLOAT` matrices always come as float32.
    Tensors whose HF name `loads` refuses (another pipeline stage's) are skipped unread."""
    from gguf.quants import dequantize

    from pagedserve.utils.gguf_tensors import read_gguf

    reader = read_gguf(path)  # NOTE: not gguf's GGUFReader, which decodes every metadata value (seconds)
    arch = str(reader.metadata["general.architecture"])
    dequantized_types: set[str] = set()
    for tensor in reader.tensors:
        name = _hf_name(tensor.name, arch, hf_config)
        if name is None or not loads(name):
            continue
        permuted = arch in _PERMUTED_ARCHS and name.endswith(("q_proj.weight", "k_proj.weight"))
        # NOTE: Falcon's fused q/k/v is regrouped row-wise in float (see _hf_tensors).
        regrouped = arch == "falcon" and "query_key_value" in name
        if keep_quantized and len(tensor.shape) == 2 and not regrouped and not name.endswith(_ALWAYS_FLOAT):
            ggml_type, rows = _kernel_rows(tensor, dequantized_types, backend, device)
            base = name.removesuffix(".weight")
            yield f"{base}.qweight_type", torch.tensor(ggml_type)
            if permuted:  # the same row order as _hf_tensors gives a dequantized q/k
                rows = _unpermute(
                    rows, hf_config.num_attention_heads if "q_proj" in name else hf_config.num_key_value_heads
                )
            yield f"{base}.qweight", torch.from_numpy(np.array(rows))
            continue
        expert = re.fullmatch(r"(.*\.experts)\.(\w+)\.weight", name)
        if keep_quantized and len(tensor.shape) == 3 and expert:
            # NOTE: one expert's blocks per tensor, the names the experts layer takes (layers/moe.py).
            ggml_type, stacked = _kernel_rows(tensor, dequantized_types, backend, device)
            for index, rows in enumerate(stacked):
                base = f"{expert.group(1)}.{index}.{expert.group(2)}"
                yield f"{base}.qweight_type", torch.tensor(ggml_type)
                yield f"{base}.qweight", torch.from_numpy(np.array(rows))
            continue
        weight = dequantize(tensor.data, tensor.tensor_type)
        for hf_name, hf_weight in _hf_tensors(name, weight, arch, hf_config):
            yield hf_name, torch.from_numpy(np.array(hf_weight, dtype=np.float32))
    if dequantized_types:
        logger.info(
            "GGUF tensors of type(s) %s have no kernel in --linear-backend %s: dequantized to float32 at "
            "load.",
            ", ".join(sorted(dequantized_types)),
            backend,
        )


def _kernel_rows(
    tensor: "GGUFTensor", dequantized_types: set[str], backend: str, device: str
) -> tuple[int, np.ndarray]:
    """(ggml type id, uint8 [rows, row_bytes]) of a 2-D tensor, dequantized to F32 rows if `backend` has
    no kernel for its type (its name is then added to `dequantized_types`). Raises ConfigError for a
    quantized type without a kernel on a backend other than native (whose fallback predates the others)."""
    from gguf.quants import dequantize

    type_name, ggml_type = tensor.tensor_type.name, int(tensor.tensor_type)
    if ggml_type in kernel_types(backend):
        return ggml_type, np.ascontiguousarray(tensor.data).view(np.uint8)
    if backend != "native" and type_name not in _FLOAT_TYPES:
        check_kernel(backend, ggml_type, type_name, device)
    dequantized_types.add(type_name)
    weight = np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    return NATIVE_GGML_TYPES["F32"], weight.view(np.uint8)
