"""The weight bytes `pagedserve plan` counts per rank: every parameter in the model's dtype, except the
linear layers of a quantized checkpoint, counted as the engine holds them once loaded (GPTQ/AWQ: their 4-bit
blocks; fp8: 1 byte per weight plus float32 scales per output row)."""

import math
from collections.abc import Callable
from dataclasses import dataclass

from pagedserve.config import ModelConfig
from pagedserve.config.int4_checkpoint import parse_int4_checkpoint
from pagedserve.config.quantization import checkpoint_quantization_config
from pagedserve.sizing import ModelShape
from pagedserve.utils import cdiv


@dataclass(frozen=True)
class LinearStorage:
    """How a quantized checkpoint's linear layers (attention projections, dense MLPs) are held."""

    bits_per_weight: float  # the weights (GPTQ/AWQ: their scales and zeros included)
    row_scales: bool = False  # fp8: a float32 scale per output row and block of input columns
    scale_block_k: int | None = None  # fp8 block-wise: columns per scale (None: one scale per row)


def linear_storage(model_config: ModelConfig) -> LinearStorage | None:
    """The checkpoint's linear layers' storage; None when they are in the model's dtype. NOTE: fp8 layers
    a checkpoint leaves in float (`ignored_layers`) are counted as fp8 (config.json has no shapes by name;
    the usual entry, lm_head, is not a linear layer here)."""
    method = model_config.quantization
    if method in ("gptq", "awq"):
        quant_config = checkpoint_quantization_config(model_config)
        return LinearStorage(parse_int4_checkpoint(method, quant_config).bits_per_weight)
    if method == "fp8":
        block = checkpoint_quantization_config(model_config).get("weight_block_size")
        block_k = int(block[1]) if isinstance(block, list | tuple) and len(block) == 2 else None
        return LinearStorage(8, row_scales=True, scale_block_k=block_k)
    return None


def weights_bytes(shape: ModelShape, tp: int, dtype_bytes: int, storage: LinearStorage | None) -> int:
    """Bytes of one rank's weights."""
    total = shape.num_parameters(tp) * dtype_bytes
    if storage is None:
        return total
    linear = shape.num_linear_weights(tp)
    total -= linear * dtype_bytes - math.ceil(linear * storage.bits_per_weight / 8)
    if storage.row_scales:
        total += 4 * _scales_per_rank(shape, tp, storage.scale_block_k)
    return total


def _scales_per_rank(shape: ModelShape, tp: int, block_k: int | None) -> int:
    """fp8's float32 scales: each linear layer's output rows times its blocks of input columns (as
    quantization/fp8.py keeps them: one row of scales per weight row)."""
    hidden, head_dim = shape.hidden_size, shape.head_dim
    qkv_rows = (shape.num_heads // tp + 2 * shape.kv_heads_per_rank(tp)) * head_dim
    attention_width = shape.num_heads * head_dim // tp
    intermediate = shape.intermediate_size // tp
    blocks: Callable[[int], int] = (lambda k: 1) if block_k is None else (lambda k: cdiv(k, block_k))
    attention = qkv_rows * blocks(hidden) + hidden * blocks(attention_width)  # qkv_proj, o_proj
    # gate and up (or Falcon's up alone) read the hidden state, down the intermediate one
    mlp = (shape.mlp_matrices - 1) * intermediate * blocks(hidden) + hidden * blocks(intermediate)
    return shape.num_layers * attention + (shape.num_layers - shape.num_moe_layers) * mlp
