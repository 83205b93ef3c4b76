"""Python entry points of the fused layer kernels (`fused_ops.cpp`), registered as torch.ops.pagedserve.

The layers (`layers/layernorm.py`, `rotary.py`, `activation.py`) call these when `usable(x)` says so and
keep their torch ops otherwise (another device, a dtype or layout the kernels do not take, the kernels
unbuilt or turned off with PAGEDSERVE_FUSED_CPU_OPS=0).
"""

import functools
from typing import Any

import torch

from pagedserve import envs
from pagedserve.kernels.cpu import load_cpu_kernels

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def _ops() -> Any:
    """torch.ops.pagedserve when the kernels are built and the fused ones enabled, else None (once per
    process: a decode step asks ~100 times)."""
    if not envs.fused_cpu_ops_enabled() or load_cpu_kernels().module is None:
        return None
    return torch.ops.pagedserve


def usable(x: torch.Tensor) -> bool:
    """Whether the fused kernels take `x`: a CPU tensor of a kernel dtype, the kernels available."""
    return x.device.type == "cpu" and x.dtype in KERNEL_DTYPES and _ops() is not None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: bool) -> torch.Tensor:
    """x [rows, n] (rows contiguous) -> norm(x) * weight, or * (1 + weight) with `offset` (Gemma)."""
    out: torch.Tensor = _ops().rms_norm(x, weight, eps, offset)
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, offset: bool
) -> None:
    """In place (vLLM's contract): residual <- x + residual, then x <- norm(residual) * weight."""
    _ops().fused_add_rms_norm(x, residual, weight, eps, offset)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_dim: int,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    neox: bool,
) -> None:
    """Rotates query [T, heads * head_dim] and key [T, kv_heads * head_dim] in place (rows may be strided
    views) by the float32 cos/sin rows [max_position, rotary_dim // 2] at positions [T]. Raises
    RuntimeError for a position outside the cache."""
    _ops().rotary_embedding(positions, query, key, head_dim, cos_cache, sin_cache, neox)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [rows, 2d] -> silu(x[:, :d]) * x[:, d:]."""
    out: torch.Tensor = _ops().silu_and_mul(x)
    return out


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [rows, 2d] -> gelu_tanh(x[:, :d]) * x[:, d:]."""
    out: torch.Tensor = _ops().gelu_tanh_and_mul(x)
    return out
