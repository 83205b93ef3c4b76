"""ggml rows dequantized in plain PyTorch on any device: the `torch` linear backend's weights (dequantize,
then F.linear) and the reference the native and Triton kernels are tested against.

Each type decodes all blocks of all rows at once ([blocks, block_bytes] -> [blocks, weights]) with
ggml-quants.c's float32 arithmetic in its order, so the results equal ggml's dequantizers bit for bit.
"""

from collections.abc import Callable

import torch

from pagedserve.kernels.cpu.gguf_ops import GGML_BLOCK_FORMATS


def _half(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 field at byte `offset` of each block, float32 [blocks, 1]."""
    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).float()


def _nibbles(packed: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Bytes -> int32 twice as long along `dim`: the low nibbles, then the high ones (ggml's 4-bit order)."""
    values = packed.int()
    return torch.cat([values & 15, values >> 4], dim=dim)


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    return _half(blocks, 0) * (_nibbles(blocks[:, 2:18]) - 8).float()


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    return _half(blocks, 0) * _nibbles(blocks[:, 4:20]).float() + _half(blocks, 2)


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    return _half(blocks, 0) * blocks[:, 2:34].contiguous().view(torch.int8).float()


def _kquant_scales_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes -> 8 6-bit scales and 8 mins per block (ggml's get_scale_min_k4): sub-blocks
    0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); 4-7 in the nibbles of bytes 8-11, their
    top 2 bits in the high bits of bytes 0-3 (scales) and 4-7 (mins)."""
    values = packed.int()
    low, middle, high = values[:, 0:4], values[:, 4:8], values[:, 8:12]
    scales = torch.cat([low & 63, (high & 15) | ((low >> 6) << 4)], dim=1)
    mins = torch.cat([middle & 63, (high >> 4) | ((middle >> 6) << 4)], dim=1)
    return scales.float(), mins.float()


def _kquant_low_bits(packed: torch.Tensor) -> torch.Tensor:
    """128 bytes per block -> int32 [blocks, 8, 32]: each 32 bytes give two sub-blocks, low nibbles first."""
    return _nibbles(packed.reshape(-1, 4, 32)).reshape(-1, 8, 32)


def _kquant(blocks: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Q4_K/Q5_K: w = (d scale) q - dmin min per 32-weight sub-block; q int32 [blocks, 8, 32]."""
    scales, mins = _kquant_scales_mins(blocks[:, 4:16])
    scaled = (_half(blocks, 0) * scales)[:, :, None] * q.float() - (_half(blocks, 2) * mins)[:, :, None]
    return scaled.reshape(-1, 256)


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    return _kquant(blocks, _kquant_low_bits(blocks[:, 16:144]))


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    """Sub-block s's fifth bits: bit s of the 32 bytes at 16."""
    shifts = torch.arange(8, device=blocks.device)[None, :, None]
    fifth = (blocks[:, None, 16:48].int() >> shifts) & 1
    return _kquant(blocks, _kquant_low_bits(blocks[:, 48:176]) | (fifth << 4))


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    """Per half of 128 weights: 64 low bytes (quarters 0, 1 their low nibbles, 2, 3 their high ones), 32
    high bytes (quarter g: bits 2g, 2g + 1); int8 scales per 16 weights, fp16 d at 208."""
    low = _nibbles(blocks[:, 0:128].reshape(-1, 2, 2, 32), dim=2)
    shifts = 2 * torch.arange(4, device=blocks.device)[None, None, :, None]
    high = (blocks[:, 128:192].reshape(-1, 2, 1, 32).int() >> shifts) & 3
    q = ((low | (high << 4)) - 32).reshape(-1, 16, 16).float()
    scales = blocks[:, 192:208].contiguous().view(torch.int8).float()
    return ((_half(blocks, 208) * scales)[:, :, None] * q).reshape(-1, 256)


# ggml type id -> [blocks, block_bytes] uint8 -> [blocks, block_weights] float32
_DECODERS: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    0: lambda blocks: blocks.contiguous().view(torch.float32),
    1: lambda blocks: blocks.contiguous().view(torch.float16).float(),
    2: _q4_0,
    3: _q4_1,
    8: _q8_0,
    12: _q4_k,
    13: _q5_k,
    14: _q6_k,
}


def dequantize_ggml_rows(rows: torch.Tensor, ggml_type: int, cols: int) -> torch.Tensor:
    """rows uint8 [R, row_bytes] of ggml blocks of `ggml_type` (F32, F16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K,
    Q6_K), `cols` weights each -> float32 [R, cols] on rows' device. Raises ValueError on another type or
    rows that are not `cols` weights long."""
    if ggml_type not in _DECODERS:
        raise ValueError(f"ggml type {ggml_type} cannot be dequantized (types {sorted(_DECODERS)}).")
    weights, nbytes = GGML_BLOCK_FORMATS[ggml_type]
    if (
        cols % weights
        or rows.dtype != torch.uint8
        or rows.dim() != 2
        or rows.shape[1] * weights != cols * nbytes
    ):
        raise ValueError(
            f"ggml rows of type {ggml_type} and {cols} columns must be uint8 [rows, {cols // weights * nbytes}] "
            f"in whole blocks of {weights} weights; got {rows.dtype} {list(rows.shape)}."
        )
    return _DECODERS[ggml_type](rows.reshape(-1, nbytes)).reshape(rows.shape[0], cols)
