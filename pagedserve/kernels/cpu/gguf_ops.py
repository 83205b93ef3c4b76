"""Python entry points of the native GGUF kernels (`gguf_matmul.cpp`), registered as torch.ops.pagedserve."""

import functools
from typing import Any

import torch

from pagedserve import envs

# NOTE: re-exported: the block table lives with the torch-free byte counts that `pagedserve plan` shares.
from pagedserve.config.weight_bytes import GGML_BLOCK_FORMATS as GGML_BLOCK_FORMATS
from pagedserve.config.weight_bytes import MXFP4_GGML_TYPE as MXFP4_GGML_TYPE
from pagedserve.config.weight_bytes import NATIVE_GGML_TYPES as NATIVE_GGML_TYPES
from pagedserve.kernels.cpu import load_cpu_kernels

# The ggml types with an integer-activation row decode kernel (MXFP4: gpt-oss's experts, never a GGUF linear
# layer's), and the largest batch it takes (gguf_blocks.h: kDecodeMaxBatch); larger batches compute in float32.
INTEGER_ACTIVATION_TYPES = {2, 3, 8, 12, 13, MXFP4_GGML_TYPE}
DECODE_MAX_BATCH = 8


@functools.cache  # NOTE: a decode step calls ~120 matmuls; a failure raises each time (nothing cached)
def _ops() -> Any:
    kernels = load_cpu_kernels()
    if kernels.module is None:
        raise RuntimeError(f"The native CPU kernels are unavailable: {kernels.error}")
    torch.ops.pagedserve.gguf_set_amx(envs.cpu_amx_enabled())
    return torch.ops.pagedserve


def gguf_matmul(
    x: torch.Tensor, qweight: torch.Tensor, ggml_type: int, activation_bits: int = 32
) -> torch.Tensor:
    """x [B, K] float32 times W^T, W [N, K] stored as qweight [N, row_bytes] uint8 rows of ggml blocks of
    `ggml_type` (one of NATIVE_GGML_TYPES, or MXFP4_GGML_TYPE). Returns [B, N] float32.

    activation_bits 8 or 16: at batch <= DECODE_MAX_BATCH on INTEGER_ACTIVATION_TYPES (AVX2+FMA builds),
    each 32-value block of x is rounded to that many bits (one scale per block) and dotted in integers, as
    llama.cpp does; 32 (and every other case) computes on x's float32 values. Raises RuntimeError on a bad
    shape or `activation_bits`."""
    out: torch.Tensor = _ops().gguf_matmul(x, qweight, ggml_type, activation_bits)
    return out


def gguf_dequantize(qweight: torch.Tensor, ggml_type: int, cols: int) -> torch.Tensor:
    """qweight [N, row_bytes] uint8 rows of `ggml_type` blocks holding `cols` weights each -> float32 [N, cols]."""
    weights: torch.Tensor = _ops().gguf_dequantize(qweight, ggml_type, cols)
    return weights


def gguf_packable(ggml_type: int, activation_bits: int) -> bool:
    """Whether `gguf_pack` takes `ggml_type` in this build for activations of `activation_bits`: Q4_0, Q4_1
    and Q8_0 for 8 or 16 bits (AVX2+FMA+F16C builds), Q4_K, Q5_K and Q6_K for 8 bits (every build)."""
    return bool(_ops().gguf_packable(ggml_type, activation_bits))


def gguf_pack(qweight: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """qweight [N, row_bytes] uint8 rows of ggml blocks -> 16 rows side by side (plus zero rows up to a
    multiple of 16): per 32-column block, the same bytes (Q4_0, Q4_1, Q8_0: gguf_packed_matmul.cpp); per
    256-column super-block, its integers, scales and minimums (K-quants: gguf_kquant_matmul.cpp)."""
    packed: torch.Tensor = _ops().gguf_pack(qweight, ggml_type)
    return packed


def gguf_packed_matmul(
    x: torch.Tensor, packed: torch.Tensor, ggml_type: int, rows: int, activation_bits: int
) -> torch.Tensor:
    """x [B, K] float32 times W^T, W [rows, K] as `gguf_pack` left it; activations rounded to
    `activation_bits` at every B (a row's result the same bits whatever shares its batch): K-quants with 8 or
    16 (15-bit) per 256-value super-block, the others with 8 or 16 per 32-value block; 32 computes on x's
    float32 values. Returns [B, rows] float32."""
    out: torch.Tensor = _ops().gguf_packed_matmul(x, packed, ggml_type, rows, activation_bits)
    return out


def gguf_packed_matmul_greedy(
    x: torch.Tensor, packed: torch.Tensor, ggml_type: int, rows: int, activation_bits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`gguf_packed_matmul`'s [B, rows] float32, and each row's argmax (int64 [B], torch.argmax's answer): an
    LM head's greedy tokens, folded into the matmul a group of 16 rows at a time on the integer paths."""
    logits, tokens = _ops().gguf_packed_matmul_greedy(x, packed, ggml_type, rows, activation_bits)
    return logits, tokens


def gguf_set_amx(enabled: bool) -> bool:
    """Whether the packed matmul takes whole 16-row chunks of activation rows on AMX tiles (the process's
    setting, PAGEDSERVE_CPU_AMX at first use): K-quants on AMX-INT8, Q4_0/Q4_1/Q8_0 on AMX-BF16; on integer
    activations the results are the same bits either way. Returns whether it now does: False when `enabled`
    is False or this build or CPU has no AMX-INT8."""
    return bool(_ops().gguf_set_amx(enabled))


def gguf_packed_rows(
    packed: torch.Tensor, ggml_type: int, rows: int, cols: int, ids: torch.Tensor
) -> torch.Tensor:
    """Rows `ids` of a packed [rows, cols] matrix, dequantized: float32 [len(ids), cols]."""
    weights: torch.Tensor = _ops().gguf_packed_rows(packed, ggml_type, rows, cols, ids)
    return weights
