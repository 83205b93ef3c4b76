"""Triton decoders of llama.cpp's ggml blocks: one per type, shared by both matmul paths of
`quant_matmul.py`. Each takes the weights' row indices and column indices as broadcastable tensors and
returns the dequantized weights of their broadcast shape in float32, so the GEMV asks for [rows, columns]
tiles and the tiled path for [columns, rows] ones (tl.dot's B operand) from the same code.

Every element loads the bytes it needs (its block's scales again and again): the repeats hit the cache, so
each weight byte still comes from memory once. Arithmetic follows ggml's dequantizers (ggml-quants.c) in
float32 and in their order: d * q, d * q + m, (d * scale) * q - dmin * min (MXFP4: an exact power of two times
an integer).
"""

import triton
import triton.language as tl


# NOTE: untyped: triton ships no types, and @triton.jit compiles this source (tl.constexpr marks only).
@triton.jit
def _byte(ptr):  # type: ignore[no-untyped-def]
    """The unsigned byte at ptr as int32 (shifts and masks on uint8 would wrap at 8 bits)."""
    return tl.load(ptr).to(tl.int32)


@triton.jit
def _half(ptr):  # type: ignore[no-untyped-def]
    """The little-endian fp16 at ptr as float32, assembled from bytes: blocks of 18 or 34 bytes leave
    fp16 fields at any even offset of a row, and a view of the rows may start anywhere."""
    bits = (_byte(ptr) | (_byte(ptr + 1) << 8)).to(tl.uint16)
    return bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _nibble(byte, high):  # type: ignore[no-untyped-def]
    return tl.where(high, byte >> 4, byte & 15)


@triton.jit
def _q4_0(block, i):  # type: ignore[no-untyped-def]
    """18 bytes: fp16 d, 16 bytes of nibbles (weight i < 16 the low nibble of byte i, i >= 16 the high one
    of byte i - 16); w = d (q - 8)."""
    q = _nibble(_byte(block + 2 + i % 16), i >= 16) - 8
    return _half(block) * q.to(tl.float32)


@triton.jit
def _q4_1(block, i):  # type: ignore[no-untyped-def]
    """20 bytes: fp16 d, fp16 m, nibbles as Q4_0; w = d q + m."""
    q = _nibble(_byte(block + 4 + i % 16), i >= 16)
    return _half(block) * q.to(tl.float32) + _half(block + 2)


@triton.jit
def _q8_0(block, i):  # type: ignore[no-untyped-def]
    """34 bytes: fp16 d, 32 int8; w = d q."""
    q = tl.load(block + 2 + i).to(tl.int8, bitcast=True)
    return _half(block) * q.to(tl.float32)


@triton.jit
def _mxfp4(block, i):  # type: ignore[no-untyped-def]
    """17 bytes: the E8M0 scale e, 16 bytes of E2M1 codes laid out as Q4_0's nibbles; w = (2 e2m1) 2^(e - 128).
    A code's low three bits are (exponent, mantissa) pairs: doubled, 0 and 1 below exponent 1, else
    (2 + mantissa) << (exponent - 1); bit 3 the sign. The scale is built from its float32 bits (e 0 and 1
    are subnormal), as ggml's E8M0_TO_FP32_HALF."""
    code = _nibble(_byte(block + 1 + i % 16), i >= 16)
    exponent, mantissa = (code >> 1) & 3, code & 1
    magnitude = tl.where(exponent == 0, mantissa, (2 + mantissa) << tl.maximum(exponent - 1, 0))
    q = tl.where(code >= 8, -magnitude, magnitude)
    e = _byte(block)
    scale = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23).to(tl.float32, bitcast=True)
    return scale * q.to(tl.float32)


@triton.jit
def _kquant_scale_min(scales, sub):  # type: ignore[no-untyped-def]
    """Q4_K/Q5_K: the 6-bit scale and min of 32-weight sub-block `sub` (0..7) from their 12 packed bytes
    (ggml's get_scale_min_k4): sub-blocks 0-3 in the low 6 bits of bytes sub and sub + 4; 4-7 in the
    nibbles of byte sub + 4 with their top 2 bits in the high bits of bytes sub - 4 and sub."""
    own = _byte(scales + sub)
    upper = _byte(scales + sub + 4)
    lower = _byte(scales + sub % 4)  # byte sub - 4 for sub >= 4 (read but unused below 4)
    scale = tl.where(sub < 4, own & 63, (upper & 15) | ((lower >> 6) << 4))
    minimum = tl.where(sub < 4, upper & 63, (upper >> 4) | ((own >> 6) << 4))
    return scale.to(tl.float32), minimum.to(tl.float32)


@triton.jit
def _kquant_low_bits(qs, i):  # type: ignore[no-untyped-def]
    """Q4_K/Q5_K's 4-bit part: each 64 weights share 32 bytes, the first 32 their low nibbles."""
    return _nibble(_byte(qs + 32 * (i // 64) + i % 32), (i // 32) % 2 == 1)


@triton.jit
def _q4_k(block, i):  # type: ignore[no-untyped-def]
    """144 bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles;
    w = (d scale) q - dmin min per 32-weight sub-block."""
    scale, minimum = _kquant_scale_min(block + 4, i // 32)
    q = _kquant_low_bits(block + 16, i)
    return (_half(block) * scale) * q.to(tl.float32) - _half(block + 2) * minimum


@triton.jit
def _q5_k(block, i):  # type: ignore[no-untyped-def]
    """176 bytes: Q4_K's d, dmin and scales, then 32 bytes of fifth bits (bit `sub` of byte i % 32), then
    its 128 bytes of nibbles."""
    sub = i // 32
    scale, minimum = _kquant_scale_min(block + 4, sub)
    q = _kquant_low_bits(block + 48, i) | (((_byte(block + 16 + i % 32) >> sub) & 1) << 4)
    return (_half(block) * scale) * q.to(tl.float32) - _half(block + 2) * minimum


@triton.jit
def _q6_k(block, i):  # type: ignore[no-untyped-def]
    """210 bytes: 128 bytes of low nibbles, 64 of 2-bit high parts, 16 int8 scales (one per 16 weights),
    fp16 d. Each half of 128 weights reads 64 low bytes and 32 high bytes: its quarter g (32 weights)
    takes the low (g < 2) or high nibble of low byte 32 (g % 2) + l and bits 2g of high byte l;
    w = (d scale) (q - 32)."""
    half, g, lane = i // 128, (i % 128) // 32, i % 32
    low = _nibble(_byte(block + 64 * half + 32 * (g % 2) + lane), g >= 2)
    high = (_byte(block + 128 + 32 * half + lane) >> (2 * g)) & 3
    q = (low | (high << 4)) - 32
    scale = tl.load(block + 192 + i // 16).to(tl.int8, bitcast=True).to(tl.float32)
    return (_half(block + 208) * scale) * q.to(tl.float32)


@triton.jit  # type: ignore[untyped-decorator]
def dequantize_tile(  # type: ignore[no-untyped-def]
    rows_ptr,
    row_stride,
    row,
    col,
    GGML_TYPE: tl.constexpr,
    BLOCK_WEIGHTS: tl.constexpr,
    BLOCK_BYTES: tl.constexpr,
):
    """Weights W[row, col] (broadcast shapes; int64 rows, every index in range) of uint8 rows of ggml
    blocks of GGML_TYPE (BLOCK_WEIGHTS weights in BLOCK_BYTES bytes: GGML_BLOCK_FORMATS), `row_stride`
    bytes apart, as float32."""
    block = rows_ptr + row * row_stride + (col // BLOCK_WEIGHTS) * BLOCK_BYTES
    i = col % BLOCK_WEIGHTS
    if GGML_TYPE == 2:
        w = _q4_0(block, i)
    elif GGML_TYPE == 3:
        w = _q4_1(block, i)
    elif GGML_TYPE == 8:
        w = _q8_0(block, i)
    elif GGML_TYPE == 12:
        w = _q4_k(block, i)
    elif GGML_TYPE == 13:
        w = _q5_k(block, i)
    elif GGML_TYPE == 39:
        w = _mxfp4(block, i)
    else:
        tl.static_assert(GGML_TYPE == 14, "ggml type without a Triton decoder")
        w = _q6_k(block, i)
    return w
