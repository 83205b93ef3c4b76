"""Python entry point of the native fp8 weight matmul (`fp8_matmul.cpp`), registered as torch.ops.pagedserve."""

import torch

from pagedserve.kernels.cpu import load_cpu_kernels


def fp8_matmul(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, fp8_values: torch.Tensor, block_k: int
) -> torch.Tensor:
    """x [B, K] float32 times W^T, W [N, K] stored as fp8 bits `weight` (uint8) scaled by `scales`
    [N, ceil(K / block_k)] float32 (one column: a scale per row); `fp8_values`: the format's [256] values.
    Returns [B, N] float32. Raises RuntimeError when the kernels are unavailable or a shape is wrong."""
    kernels = load_cpu_kernels()
    if kernels.module is None:
        raise RuntimeError(f"The native CPU kernels are unavailable: {kernels.error}")
    return torch.ops.pagedserve.fp8_matmul(x, weight, scales, fp8_values, block_k)
