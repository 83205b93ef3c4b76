"""Python entry point of the native fp8 weight matmul (`fp8_matmul.cpp`), registered as torch.ops.pagedserve."""

import torch

from pagedserve.kernels.cpu import load_cpu_kernels


def _require_kernels() -> None:
    kernels = load_cpu_kernels()
    if kernels.module is None:
        raise RuntimeError(f"The native CPU kernels are unavailable: {kernels.error}")


def fp8_matmul(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, block_k: int) -> torch.Tensor:
    """x [B, K] float32 times W^T, W [N, K] stored as float8_e4m3fn bits `weight` (uint8) scaled by
    `scales` [N, ceil(K / block_k)] float32 (one column: a scale per row). Returns [B, N] float32.
    Raises RuntimeError when the kernels are unavailable or a shape is wrong."""
    _require_kernels()
    out: torch.Tensor = torch.ops.pagedserve.fp8_matmul(x, weight, scales, block_k)
    return out


def fp8_matmul_isa() -> str:
    """The vector code the build widens fp8 weights with: "avx512", "avx2" or "scalar"."""
    _require_kernels()
    isa: str = torch.ops.pagedserve.fp8_matmul_isa()
    return isa
