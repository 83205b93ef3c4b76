"""Write a tiny HF checkpoint as a GGUF file the way llama.cpp's converter lays it out (its tensor names,
Gemma's norms stored as 1 + w, fused tensors kept fused, Llama's q/k rows permuted, experts stacked per
projection, Qwen-MoE's expert sizes), with the default model's tokenizer metadata: a GGUF of any family for
the loading tests, read back by both pagedserve and transformers. `write_bert_gguf`: a BERT embedding GGUF
with its own WordPiece vocabulary, which transformers cannot read."""

import functools
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


@functools.cache
def _default_tokenizer() -> list[tuple[str, object, GGUFValueType]]:
    """The default model's tokenizer.* metadata: (key, value, type), read once (GGUFReader takes ~2 s)."""
    fields = GGUFReader(default_model_path()).fields.items()
    return [(k, f.contents(), f.types[0]) for k, f in fields if k.startswith("tokenizer.")]


def _copy_tokenizer(writer: GGUFWriter) -> None:
    for key, value, value_type in _default_tokenizer():
        if value_type == GGUFValueType.ARRAY:
            writer.add_array(key, value)  # type: ignore[arg-type]
        else:
            writer.add_key_value(key, value, value_type)


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
        if name.startswith("pooler."):  # llama.cpp's BERT converter drops the unused pooler
            continue
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


def _writer(path: str, arch: str, config) -> GGUFWriter:
    """A writer of `arch` with the shape keys every architecture has."""
    writer = GGUFWriter(path, arch)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_embedding_length(config.hidden_size)
    writer.add_head_count(config.num_attention_heads)
    return writer


def write_gguf(folder: str, arch: str, path: str, quant_type: str = "F32") -> str:
    """`folder`'s config and tensors as `path` (general.architecture `arch`: gemma2 | phi3 | llama, Mixtral
    being llama with experts | qwen2moe | qwen3moe, every Qwen-MoE layer sparse as llama.cpp builds them).
    With `quant_type` (e.g. Q8_0), every matrix whose rows fill whole blocks is stored quantized (the
    router and norms stay F32, as llama.cpp's quantizer leaves them), and `folder`'s safetensors are
    rewritten with the dequantized values, so HF loads the weights the GGUF holds."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    writer = _writer(path, arch, config)
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
    return _write_tensors(writer, folder, arch, config, quant_type, path)


def write_bert_gguf(folder: str, path: str, quant_type: str = "F32", pooling_type: int = 1) -> str:
    """A BertModel folder (WordPiece tokenizer) as llama.cpp's converter writes an embedding GGUF: arch
    "bert", its metadata keys, the vocabulary in phantom-space form ("▁word", "##piece" as "piece"), [CLS]
    as BOS and [SEP] as EOS and separator, `pooling_type` (llama.cpp's enum: 1 mean, 2 CLS, 4 rank)."""
    from gguf import PoolingType, TokenType
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    writer = _writer(path, "bert", config)
    writer.add_layer_norm_eps(config.layer_norm_eps)
    writer.add_causal_attention(False)
    writer.add_pooling_type(PoolingType(pooling_type))
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    special = set(tokenizer.all_special_tokens)
    writer.add_tokenizer_model("bert")
    writer.add_token_type_count(config.type_vocab_size)
    writer.add_token_list([_phantom(token) for token, _ in vocab])
    writer.add_token_types([TokenType.CONTROL if t in special else TokenType.NORMAL for t, _ in vocab])
    writer.add_bos_token_id(tokenizer.cls_token_id)
    writer.add_eos_token_id(tokenizer.sep_token_id)
    writer.add_sep_token_id(tokenizer.sep_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_unk_token_id(tokenizer.unk_token_id)
    writer.add_mask_token_id(tokenizer.mask_token_id)
    return _write_tensors(writer, folder, "bert", config, quant_type, path)


def _phantom(token: str) -> str:
    """llama.cpp's BERT vocabulary form (convert_hf_to_gguf.py's `phantom`)."""
    if token.startswith("[") and token.endswith("]"):
        return token
    return token[2:] if token.startswith("##") else "\u2581" + token


def _write_tensors(writer: GGUFWriter, folder: str, arch: str, config, quant_type: str, path: str) -> str:
    """`folder`'s tensors in `quant_type` (see write_gguf), then the file; returns `path`."""
    qtype = GGMLQuantizationType[quant_type]
    for name, weight in _gguf_tensors(folder, arch, config).items():
        if _stays_float(name, weight, qtype):
            writer.add_tensor(name, weight)
        else:
            writer.add_tensor(name, _quantize(weight, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if qtype != GGMLQuantizationType.F32:
        _round_trip_folder(folder, qtype)
    return path


def _quantize(weight: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """gguf-py's quantizer, and round-to-nearest K-quants where it has none (Q4_K, Q5_K, Q6_K: the blocks
    llama.cpp's formats hold, not its search for the best scales)."""
    if qtype in _K_QUANT_BITS:
        return _quantize_k(weight, qtype)
    return quantize(weight, qtype)


_K_QUANT_BITS = {GGMLQuantizationType.Q4_K: 4, GGMLQuantizationType.Q5_K: 5, GGMLQuantizationType.Q6_K: 6}


def _quantize_k(weight: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Rows of 256-value super-blocks -> uint8 [rows, row_bytes] in ggml's K-quant layout."""
    x = weight.astype(np.float32).reshape(-1, 256)
    if qtype == GGMLQuantizationType.Q6_K:
        blocks = _q6_k(x)
    else:
        blocks = _q4_k_q5_k(x, _K_QUANT_BITS[qtype])
    return blocks.reshape(*weight.shape[:-1], -1)


def _fp16_scale(values: np.ndarray, levels: int) -> np.ndarray:
    """A super-block's fp16 scale putting its largest sub-block value at `levels`."""
    return (values.max(axis=1, keepdims=True) / levels).astype(np.float16)


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros_like(a), where=b != 0)


def _q4_k_q5_k(x: np.ndarray, bits: int) -> np.ndarray:
    """Per 32-value sub-block w = d sc q - dmin m (q < 2^bits, sc and m 6-bit), ggml's byte layout."""
    sub = x.reshape(-1, 8, 32)
    low = np.minimum(sub.min(axis=2), 0.0)
    scale, offset = (sub.max(axis=2) - low) / (2**bits - 1), -low
    d, dmin = _fp16_scale(scale, 63), _fp16_scale(offset, 63)
    sc = np.clip(np.round(_divide(scale, d.astype(np.float32))), 0, 63).astype(np.uint8)
    mn = np.clip(np.round(_divide(offset, dmin.astype(np.float32))), 0, 63).astype(np.uint8)
    step = (d.astype(np.float32) * sc)[..., None]
    q = np.clip(np.round(_divide(sub + (dmin.astype(np.float32) * mn)[..., None], step)), 0, 2**bits - 1)
    q = q.astype(np.uint8).reshape(-1, 4, 2, 32)  # [chunk of 64][low / high 32]
    packed_scales = np.concatenate(  # get_scale_min_k4's inverse: 6-bit pairs, high bits of 4..7 in 0..3
        [
            sc[:, :4] | (sc[:, 4:] >> 4) << 6,
            mn[:, :4] | (mn[:, 4:] >> 4) << 6,
            (sc[:, 4:] & 15) | (mn[:, 4:] & 15) << 4,
        ],
        axis=1,
    )
    nibbles = ((q[:, :, 0] & 15) | (q[:, :, 1] & 15) << 4).reshape(-1, 128)
    parts = [d.view(np.uint8), dmin.view(np.uint8), packed_scales]
    if bits == 5:  # qh bit 2c of byte l: value 64c + l's fifth bit; bit 2c + 1: value 64c + 32 + l's
        fifth = (q >> 4).transpose(0, 3, 1, 2).reshape(-1, 32, 8)
        parts.append((fifth << np.arange(8, dtype=np.uint8)).sum(axis=2, dtype=np.uint8))
    return np.concatenate([*parts, nibbles], axis=1)


def _q6_k(x: np.ndarray) -> np.ndarray:
    """Per 16-value sub-block w = d sc (u - 32) (u < 64, sc int8), ggml's byte layout."""
    sub = x.reshape(-1, 16, 16)
    scale = np.abs(sub).max(axis=2) / 31
    d = _fp16_scale(scale, 127)
    sc = np.clip(np.round(_divide(scale, d.astype(np.float32))), -128, 127).astype(np.int8)
    step = (d.astype(np.float32) * sc)[..., None]
    u = (np.clip(np.round(_divide(sub, step)), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)
    low, high = u & 15, u >> 4
    ql = np.concatenate([low[:, :, 0] | low[:, :, 2] << 4, low[:, :, 1] | low[:, :, 3] << 4], axis=2)
    qh = high[:, :, 0] | high[:, :, 1] << 2 | high[:, :, 2] << 4 | high[:, :, 3] << 6
    return np.concatenate(
        [ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), d.view(np.uint8)], axis=1
    )


# HF matrices whose GGUF tensor stays float: the routers and BERT's position and token-type tables (as
# llama.cpp's quantizer leaves them) and the shared expert's gate (a vector in the GGUF).
_FLOAT_MATRICES = (
    "block_sparse_moe.gate.weight",
    "mlp.gate.weight",
    "shared_expert_gate.weight",
    "position_embeddings.weight",
    "token_type_embeddings.weight",
)


def _stays_float(name: str, weight: np.ndarray, qtype: GGMLQuantizationType) -> bool:
    return (
        qtype == GGMLQuantizationType.F32
        or weight.ndim < 2
        or any(part in name for part in ("ffn_gate_inp", "position_embd", "token_types"))
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
            tensors[name] = torch.from_numpy(dequantize(_quantize(weight, qtype), qtype).copy())
    save_file(tensors, path, metadata={"format": "pt"})
