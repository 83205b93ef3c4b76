"""What the GGUF kernel tests compare against, in plain PyTorch and gguf-py: random ggml blocks, their
dequantized weights (gguf-py's reference dequantizer), and the kernels' integer activations."""

import numpy as np
import torch

from pagedserve.config.weight_bytes import MXFP4_GGML_TYPE as MXFP4
from pagedserve.kernels.cpu.gguf_ops import GGML_BLOCK_FORMATS


def rounded_activations(x: torch.Tensor, bits: int, block: int = 32) -> torch.Tensor:
    """x with each block of `block` values (the K-quant kernels: 256) rounded as the kernel does:
    q = round(x * (L / max|x|)), x ~ q max|x| / L, L = 2^(bits-1) - 1 (float32 arithmetic, ties to even),
    as float64."""
    largest = 2 ** (bits - 1) - 1
    blocks = x.reshape(-1, block)
    block_max = blocks.abs().amax(dim=1, keepdim=True)
    # NOTE: the float32 inverse comes from a float64 division: torch's float32 `scalar / tensor` is not
    # correctly rounded (off by an ulp), which moved a product across a rounding tie at batch 64.
    inverse = torch.where(block_max > 0, (largest / block_max.double()).float(), torch.zeros_like(block_max))
    q = torch.round(blocks * inverse)
    return (q.double() * (block_max / largest).double()).reshape(x.shape)


# Byte offsets of the fp16 fields (scales, minimums) inside each type's block.
_HALF_OFFSETS = {2: (0,), 3: (0, 2), 8: (0,), 12: (0, 2), 13: (0, 2), 14: (208,)}


def random_rows(ggml_type: int, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [rows, row_bytes] of random blocks whose fp16 fields are finite values of a weight's scale."""
    if ggml_type in (0, 1):
        dtype = np.float32 if ggml_type == 0 else np.float16
        return rng.standard_normal((rows, cols)).astype(dtype).view(np.uint8)
    weights, nbytes = GGML_BLOCK_FORMATS[ggml_type]
    blocks = rng.integers(0, 256, (rows * cols // weights, nbytes), dtype=np.uint8)
    if ggml_type == MXFP4:  # the E8M0 scale byte: 2^-9 .. 2^2 (a 0 or 1 would be subnormal, 255 NaN)
        blocks[:, 0] = rng.integers(118, 130, len(blocks), dtype=np.uint8)
    for offset in _HALF_OFFSETS.get(ggml_type, ()):
        halves = (rng.standard_normal(len(blocks)) * 0.01).astype(np.float16)
        blocks[:, offset : offset + 2] = halves.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def reference_weight(rows: np.ndarray, ggml_type: int) -> torch.Tensor:
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    if ggml_type in (0, 1):
        return torch.from_numpy(rows.view(np.float32 if ggml_type == 0 else np.float16).astype(np.float32))
    return torch.from_numpy(dequantize(rows, GGMLQuantizationType(ggml_type)).astype(np.float32))
