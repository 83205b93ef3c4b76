"""Python entry point of the row-invariant float matmul (`float_matmul.cpp`), registered as torch.ops.pagedserve."""

import torch

from pagedserve.kernels.cpu import load_cpu_kernels


def float_matmul_available() -> bool:
    """Whether the native kernels (and so `float_matmul`) loaded in this process."""
    return load_cpu_kernels().module is not None


def float_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32 times weight^T, weight [N, K] float32, float16 or bfloat16 (widened as read).
    Returns [M, N] float32, each element summed in one order that depends on K alone: a row's result has
    the same bits whatever M, its position among the rows, its neighbours' values or the thread count.
    Raises RuntimeError when the kernels are unavailable or a shape or dtype is wrong."""
    kernels = load_cpu_kernels()
    if kernels.module is None:
        raise RuntimeError(f"The native CPU kernels are unavailable: {kernels.error}")
    out: torch.Tensor = torch.ops.pagedserve.float_matmul(x, weight)
    return out
