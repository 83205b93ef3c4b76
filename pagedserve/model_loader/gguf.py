"""Checkpoint tensors of a GGUF file, renamed to HF names, in HF's layout: dequantized, or (`--quantization
gguf`) with 2-D tensors kept in their ggml blocks. The model's `checkpoint_tensors` then treats them as it
treats a HF folder's.

llama.cpp's converters rename tensors and change some, as each family's entry in pagedserve/families.py
(`GGUFFacts`) says, undone here: q/k rows permuted for its rope layout, norm weights stored as 1 + w,
a fused q/k/v regrouped as [q; k; v], experts stacked into one tensor per projection (split here into
HF's per-expert tensors), gpt-oss's fused gate/up experts split in two (joined in gguf_gate_up.py),
and DeepSeek's kv_b_proj split into k_b and v_b (joined in gguf_latent.py). A config the metadata leaves
incomplete (Mixtral's, Qwen-MoE's expert sizes, BERT's) is completed in `utils/gguf_config.py`."""

import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch

from pagedserve.families import GGUF_ARCHITECTURES, GGUFFacts
from pagedserve.kernels.cpu.gguf_ops import NATIVE_GGML_TYPES
from pagedserve.logger import init_logger
from pagedserve.model_loader.gguf_gate_up import GateUpJoiner, split_experts_name
from pagedserve.model_loader.gguf_latent import LatentJoiner, latent_half
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
# Llama's names of the tensors outside the layers (families.GGUFFacts.global_names: another family's).
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Matrices that are read as float32 whatever `keep_quantized` says: their layers are plain torch ones (a
# MoE router (gpt-oss's too), BERT's position and token-type tables).
_ALWAYS_FLOAT = (
    ".mlp.gate.weight",
    ".mlp.router.weight",
    "position_embeddings.weight",
    "token_type_embeddings.weight",
)
_FLOAT_TYPES = ("F32", "F16", "BF16")


def _hf_name(name: str, gguf: GGUFFacts, hf_config: "PretrainedConfig") -> str | None:
    """HF's name of GGUF tensor `name` in a file of `gguf`'s architecture; None for tensors not read."""
    base, _, suffix = name.rpartition(".")
    match = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if match:
        names = {**(_LAYER_NAMES if gguf.common_layer_names else {}), **gguf.layer_names}
        if getattr(hf_config, "new_decoder_architecture", False):
            names.update(gguf.new_decoder_layer_names)
        block = match.group(2)
        if block not in names:
            return None
        hf_name = f"{gguf.layer_prefix}.{match.group(1)}.{names[block]}"
        return hf_name if block in gguf.bare_tensors else f"{hf_name}.{suffix}"
    global_names = _GLOBAL_NAMES if gguf.global_names is None else gguf.global_names
    return f"{global_names[base]}.{suffix}" if base in global_names else None


def _unpermute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _permuted(name: str, gguf: GGUFFacts) -> bool:
    """q/k rows that llama.cpp's converter permuted for its rope layout (undone here)."""
    return gguf.permuted_qk and name.endswith(("q_proj.weight", "k_proj.weight"))


def _regrouped(name: str, gguf: GGUFFacts) -> bool:
    """Falcon's fused q/k/v, regrouped row-wise in float (`_falcon_qkv`)."""
    return gguf.grouped_fused_qkv and "query_key_value" in name


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
    name: str, weight: np.ndarray, gguf: GGUFFacts, hf_config: "PretrainedConfig"
) -> Iterator[tuple[str, np.ndarray]]:
    """One GGUF tensor (already under its HF name) -> HF tensors in HF's layout."""
    if _permuted(name, gguf):
        heads = hf_config.num_attention_heads if "q_proj" in name else hf_config.num_key_value_heads
        weight = _unpermute(weight, heads)
    elif gguf.norm_plus_one and name.endswith("norm.weight"):
        weight = weight - 1
    elif _regrouped(name, gguf):
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
    # NOTE: the config reader (utils/gguf_config.py) refused any other architecture first.
    gguf = GGUF_ARCHITECTURES[str(reader.metadata["general.architecture"])]
    dequantized_types: set[str] = set()
    joiner = GateUpJoiner(keep_quantized) if gguf.joined_gate_up else None
    latent = LatentJoiner()
    for tensor in reader.tensors:
        name = _hf_name(tensor.name, gguf, hf_config)
        if name is None or not loads(name):
            continue
        if joiner is not None and split_experts_name(name):
            yield from joiner.add(name, tensor.tensor_type, tensor.data)
            continue
        half = latent_half(name) if gguf.split_latent_kv else None
        if half is not None:
            joined = latent.add(*half, dequantize(tensor.data, tensor.tensor_type))
            if joined is not None:
                yield from _latent_matrix(*joined, keep_quantized, gguf, hf_config)
            continue
        if (
            keep_quantized
            and len(tensor.shape) == 2
            and not _regrouped(name, gguf)
            and not name.endswith(_ALWAYS_FLOAT)
        ):
            ggml_type, rows = _kernel_rows(tensor, dequantized_types, backend, device)
            yield from _packed_matrix(name, ggml_type, rows, gguf, hf_config)
            continue
        expert = re.fullmatch(r"(.*\.experts)\.(\w+)\.weight", name)
        if keep_quantized and len(tensor.shape) == 3 and expert:
            ggml_type, stacked = _kernel_rows(tensor, dequantized_types, backend, device)
            yield from _packed_experts(expert.group(1), expert.group(2), ggml_type, stacked)
            continue
        weight = dequantize(tensor.data, tensor.tensor_type)
        for hf_name, hf_weight in _hf_tensors(name, weight, gguf, hf_config):
            yield hf_name, torch.from_numpy(np.array(hf_weight, dtype=np.float32))
    if joiner is not None:
        joiner.check_done()
    _log_dequantized(dequantized_types, backend)


def _log_dequantized(types: set[str], backend: str) -> None:
    if types:
        logger.info(
            "GGUF tensors of type(s) %s have no kernel in --linear-backend %s: dequantized to float32 at "
            "load.",
            ", ".join(sorted(types)),
            backend,
        )


def _latent_matrix(
    name: str, weight: np.ndarray, keep_quantized: bool, gguf: GGUFFacts, hf_config: "PretrainedConfig"
) -> Iterator[tuple[str, torch.Tensor]]:
    """DeepSeek's kv_b_proj joined from llama.cpp's halves: float32 rows (kept quantized: as F32 blocks,
    since its halves' blocks do not join)."""
    rows = np.ascontiguousarray(weight, dtype=np.float32)
    if keep_quantized:
        yield from _packed_matrix(name, NATIVE_GGML_TYPES["F32"], rows.view(np.uint8), gguf, hf_config)
    else:
        yield name, torch.from_numpy(rows)


def _packed_experts(
    experts: str, projection: str, ggml_type: int, stacked: np.ndarray
) -> Iterator[tuple[str, torch.Tensor]]:
    """Stacked experts' blocks, one expert a tensor, under the names the experts layer takes
    (layers/moe.py): `<experts>.<e>.<projection>.qweight_type` and `.qweight`."""
    for index, rows in enumerate(stacked):
        base = f"{experts}.{index}.{projection}"
        yield f"{base}.qweight_type", torch.tensor(ggml_type)
        yield f"{base}.qweight", torch.from_numpy(np.array(rows))


def _packed_matrix(
    name: str, ggml_type: int, rows: np.ndarray, gguf: GGUFFacts, hf_config: "PretrainedConfig"
) -> Iterator[tuple[str, torch.Tensor]]:
    """A matrix's `.qweight_type` and `.qweight` (its blocks, q/k rows in HF's order)."""
    base = name.removesuffix(".weight")
    yield f"{base}.qweight_type", torch.tensor(ggml_type)
    if _permuted(name, gguf):  # the same row order as _hf_tensors gives a dequantized q/k
        heads = hf_config.num_attention_heads if "q_proj" in name else hf_config.num_key_value_heads
        rows = _unpermute(rows, heads)
    yield f"{base}.qweight", torch.from_numpy(np.array(rows))


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
