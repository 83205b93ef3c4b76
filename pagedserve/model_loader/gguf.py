"""Checkpoint tensors of a GGUF file, renamed to HF names: dequantized, or (`--quantization gguf`) with
every 2-D tensor kept in its ggml blocks."""
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from pagedserve.kernels.cpu.gguf_ops import NATIVE_GGML_TYPES
from pagedserve.logger import init_logger

logger = init_logger(__name__)

_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# llama.cpp's converter permutes q/k rows of these architectures for its rope layout; we undo it.
_PERMUTED_ARCHS = ("llama", "mistral")


def _hf_name(name: str) -> str | None:
    base, _, suffix = name.rpartition(".")
    match = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if match and match.group(2) in _LAYER_NAMES:
        return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}.{suffix}"
    return f"{_GLOBAL_NAMES[base]}.{suffix}" if base in _GLOBAL_NAMES else None


def _unpermute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    rows = weight.shape[0]
    return (weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def iterate_gguf(path: str, num_heads: int, num_kv_heads: int, keep_quantized: bool = False
                 ) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, float32 tensor) for every tensor of the file. With `keep_quantized`, a 2-D tensor
    `<x>.weight` comes instead as `<x>.qweight_type` (its ggml type id, a 0-d int64 tensor) followed by
    `<x>.qweight` (uint8 [rows, row_bytes], its raw blocks); types without a native kernel are dequantized
    to F32 rows, with a log line."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    dequantized_types: set[str] = set()
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        if name is None:
            continue
        heads = num_heads if "q_proj" in name else num_kv_heads
        permuted = arch in _PERMUTED_ARCHS and name.endswith(("q_proj.weight", "k_proj.weight"))
        if keep_quantized and len(tensor.shape) == 2:
            ggml_type, rows = _native_rows(tensor, dequantized_types)
            base = name.removesuffix(".weight")
            yield f"{base}.qweight_type", torch.tensor(ggml_type)
            yield f"{base}.qweight", torch.from_numpy(np.array(_unpermute(rows, heads) if permuted else rows))
            continue
        weight = dequantize(tensor.data, tensor.tensor_type)
        if permuted:
            weight = _unpermute(weight, heads)
        yield name, torch.from_numpy(np.array(weight, dtype=np.float32))
    if dequantized_types:
        logger.info("GGUF tensors of type(s) %s have no native kernel: dequantized to float32 at load "
                    "(native: %s).", ", ".join(sorted(dequantized_types)), ", ".join(NATIVE_GGML_TYPES))


def _native_rows(tensor: Any, dequantized_types: set[str]) -> tuple[int, np.ndarray]:
    """(ggml type id, uint8 [rows, row_bytes]) of a 2-D tensor, dequantized to F32 rows if its type has no
    native kernel (its name is then added to `dequantized_types`)."""
    from gguf.quants import dequantize

    type_name = tensor.tensor_type.name
    if type_name in NATIVE_GGML_TYPES:
        return int(tensor.tensor_type), np.ascontiguousarray(tensor.data).view(np.uint8)
    dequantized_types.add(type_name)
    weight = np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    return NATIVE_GGML_TYPES["F32"], weight.view(np.uint8)
