"""x W^T with W kept as ggml rows (GGUF files, online int8/int4, GPTQ/AWQ repacked into Q4_0): uint8
[N, row_bytes] of llama.cpp's blocks, dequantized in registers by `ggml_blocks.dequantize_tile` and never
written out in 16 bits.

Two paths, by batch size:
- GEMV (B <= GEMV_MAX_BATCH): a program owns BLOCK_N output rows for the whole batch, walks K a tile at a
  time, dequantizes the tile once and dots it with each activation row: every weight byte is read once
  per call, which is what bounds a decode step.
- tiled (larger B): [BLOCK_M x BLOCK_N] output tiles, the weight tile dequantized into registers and cast
  to the activations' dtype for `tl.dot` (tensor cores on fp16/bf16; float32 dots at full precision),
  float32 accumulation.
"""

import torch
import triton
import triton.language as tl

from pagedserve.kernels.cpu.gguf_ops import GGML_BLOCK_FORMATS
from pagedserve.kernels.triton.ggml_blocks import dequantize_tile

# ggml type ids (gguf.GGMLQuantizationType) with a decoder in ggml_blocks: Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K,
# MXFP4 (gpt-oss's experts: layers/moe.py)
GGML_TRITON_TYPES: frozenset[int] = frozenset({2, 3, 8, 12, 13, 14, 39})

# Batches up to this run the GEMV. tl.dot takes at least 16 rows, so a smaller batch would pad the tile with
# zeros and still pay the dequantization per tile; the GEMV dequantizes each weight once for all rows, and
# at these sizes the step is bound by reading the weights either way.
GEMV_MAX_BATCH = 16
GEMV_BLOCK_N = 32  # output rows per GEMV program: N / 32 programs keep every SM busy at 4096 and up
TILE_M, TILE_N = 64, 64  # output tile of the tiled path
MAX_BLOCK_K = 128  # columns per step (a power of two dividing K, at least a 32-weight block)
DEQUANTIZE_BLOCK_R = 16  # rows per ggml_dequantize program (times _block_k(cols) columns)


# NOTE: untyped: triton ships no types, and @triton.jit compiles this source (tl.constexpr marks only).
@triton.jit  # type: ignore[untyped-decorator]
def _matmul_kernel(  # type: ignore[no-untyped-def]
    out_ptr,
    x_ptr,
    rows_ptr,
    batch,
    out_features,
    in_features,
    row_stride,
    stride_x_row,
    stride_x_col,
    GGML_TYPE: tl.constexpr,
    BLOCK_WEIGHTS: tl.constexpr,
    BLOCK_BYTES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GEMV: tl.constexpr,
):
    """out[m, n] = x[m] · W[n] for a [BLOCK_M, BLOCK_N] tile. GEMV: the weight tile [BLOCK_N, BLOCK_K] is
    dotted with each of the BLOCK_M activation rows in turn (the whole batch: one program along M);
    otherwise x tile [BLOCK_M, BLOCK_K] @ W^T tile [BLOCK_K, BLOCK_N] on tl.dot."""
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    # NOTE: rows past the batch or the weight read its last row again (no masks: the interpreter rejects
    # `vector & scalar` ones) and are never stored.
    x_rows = x_ptr + tl.minimum(m, batch - 1).to(tl.int64) * stride_x_row
    weight_rows = tl.minimum(n, out_features - 1).to(tl.int64)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):  # BLOCK_K divides K: no column masks
        k = k0 + tl.arange(0, BLOCK_K)
        if GEMV:
            w = dequantize_tile(
                rows_ptr, row_stride, weight_rows[:, None], k[None, :], GGML_TYPE, BLOCK_WEIGHTS, BLOCK_BYTES
            )
            for r in tl.static_range(BLOCK_M):
                x_row = x_ptr + tl.minimum(r, batch - 1).to(tl.int64) * stride_x_row
                x = tl.load(x_row + k * stride_x_col).to(tl.float32)
                acc = tl.where(m[:, None] == r, acc + tl.sum(w * x[None, :], axis=1)[None, :], acc)
        else:
            x = tl.load(x_rows[:, None] + k[None, :] * stride_x_col)
            w = dequantize_tile(
                rows_ptr, row_stride, weight_rows[None, :], k[:, None], GGML_TYPE, BLOCK_WEIGHTS, BLOCK_BYTES
            )
            if x_ptr.dtype.element_ty == tl.float32:
                # NOTE: float32 activations get float32 products: tl.dot's default TF32 keeps 10 bits of them.
                acc = tl.dot(x, w, acc, input_precision="ieee")
            else:
                acc = tl.dot(x, w.to(x.dtype), acc)
    out = out_ptr + m[:, None].to(tl.int64) * out_features + n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(m[:, None] < batch) & (n[None, :] < out_features))


@triton.jit  # type: ignore[untyped-decorator]
def _dequantize_kernel(  # type: ignore[no-untyped-def]
    out_ptr,
    rows_ptr,
    num_rows,
    cols,
    row_stride,
    GGML_TYPE: tl.constexpr,
    BLOCK_WEIGHTS: tl.constexpr,
    BLOCK_BYTES: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """out[r, c] = W[r, c] for a [BLOCK_R, BLOCK_C] tile (BLOCK_C divides cols)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    weight_rows = tl.minimum(r, num_rows - 1).to(tl.int64)[:, None]
    w = dequantize_tile(rows_ptr, row_stride, weight_rows, c[None, :], GGML_TYPE, BLOCK_WEIGHTS, BLOCK_BYTES)
    out = out_ptr + r[:, None].to(tl.int64) * cols + c[None, :]
    tl.store(out, w.to(out_ptr.dtype.element_ty), mask=r[:, None] < num_rows)


def _block_k(in_features: int) -> int:
    """The largest power of two up to MAX_BLOCK_K that divides K (K is whole 32-weight blocks, so >= 32)."""
    return min(MAX_BLOCK_K, in_features & -in_features)


def _check_rows(rows: torch.Tensor, ggml_type: int, cols: int) -> tuple[int, int]:
    """(weights, bytes) per block of `ggml_type` after checking that `rows` holds rows of `cols` weights."""
    if ggml_type not in GGML_TRITON_TYPES:
        raise ValueError(
            f"ggml type {ggml_type} has no Triton kernel (types {sorted(GGML_TRITON_TYPES)}); "
            "use --linear-backend torch or native for it."
        )
    weights, nbytes = GGML_BLOCK_FORMATS[ggml_type]
    if cols % weights:
        raise ValueError(f"{cols} columns are not whole blocks of {weights} weights (ggml type {ggml_type}).")
    expected = cols // weights * nbytes
    if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] != expected or rows.stride(1) != 1:
        raise ValueError(
            f"ggml rows of type {ggml_type} and {cols} columns must be uint8 [rows, {expected}] with "
            f"contiguous rows; got {rows.dtype} {list(rows.shape)} strides {list(rows.stride())}."
        )
    return weights, nbytes


def ggml_matmul(x: torch.Tensor, rows: torch.Tensor, ggml_type: int, out_features: int) -> torch.Tensor:
    """x [B, K] (float32/float16/bfloat16, any strides) times W^T, W [out_features, K] stored as
    rows uint8 [out_features, row_bytes] of ggml blocks; returns [B, out_features] in x.dtype
    (accumulated in float32)."""
    if x.dim() != 2 or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(
            f"ggml_matmul takes x [B, K] float32/float16/bfloat16; got {x.dtype} {list(x.shape)}."
        )
    batch, in_features = x.shape
    weights, nbytes = _check_rows(rows, ggml_type, in_features)
    if rows.shape[0] != out_features or rows.device != x.device:
        raise ValueError(
            f"ggml rows {list(rows.shape)} on {rows.device} do not hold out_features={out_features} rows "
            f"on x's device {x.device}."
        )
    out = torch.empty(batch, out_features, dtype=x.dtype, device=x.device)
    if batch == 0 or out_features == 0 or in_features == 0:
        return out.zero_()
    args = (out, x, rows, batch, out_features, in_features, rows.stride(0), x.stride(0), x.stride(1))
    gemv = batch <= GEMV_MAX_BATCH
    # The GEMV takes the whole batch in one program along M (BLOCK_M rows, a power of two for tl.arange).
    block_m, block_n = (triton.next_power_of_2(batch), GEMV_BLOCK_N) if gemv else (TILE_M, TILE_N)
    grid = (triton.cdiv(batch, block_m), triton.cdiv(out_features, block_n))
    _matmul_kernel[grid](*args, ggml_type, weights, nbytes, block_m, block_n, _block_k(in_features), gemv)
    return out


def ggml_dequantize(rows: torch.Tensor, ggml_type: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """rows uint8 [R, row_bytes] -> [R, cols] in dtype (embedding lookups, tests, the torch reference)."""
    weights, nbytes = _check_rows(rows, ggml_type, cols)
    out = torch.empty(rows.shape[0], cols, dtype=dtype, device=rows.device)
    if out.numel() == 0:
        return out
    block_c = _block_k(cols)
    grid = (triton.cdiv(rows.shape[0], DEQUANTIZE_BLOCK_R), cols // block_c)
    _dequantize_kernel[grid](
        out,
        rows,
        rows.shape[0],
        cols,
        rows.stride(0),
        ggml_type,
        weights,
        nbytes,
        DEQUANTIZE_BLOCK_R,
        block_c,
    )
    return out
