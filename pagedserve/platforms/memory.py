"""KV-cache budgets. CPU: an explicit budget (or a modest default). CUDA: profiled, as vLLM does:
total x gpu_memory_utilization - weights - peak activations - memory outside torch."""
from collections.abc import Callable
from dataclasses import dataclass

import psutil
import torch

from pagedserve.config import CacheConfig
from pagedserve.errors import ConfigError
from pagedserve.logger import init_logger
from pagedserve.sizing import gpu_kv_budget
from pagedserve.utils import format_bytes

logger = init_logger(__name__)

CPU_DEFAULT_KV_BYTES = 4 * 2**30


@dataclass(frozen=True)
class MemoryReport:
    kv_cache_bytes: int
    weights_bytes: int
    detail: str  # the breakdown, for the startup log


def cpu_kv_budget(cache: CacheConfig, weights_bytes: int) -> MemoryReport:
    """The explicit --kv-cache-memory, else min(4 GiB, a quarter of available RAM)."""
    if cache.kv_cache_memory is not None:
        return MemoryReport(cache.kv_cache_memory, weights_bytes, "explicit --kv-cache-memory")
    available = psutil.virtual_memory().available
    budget = min(CPU_DEFAULT_KV_BYTES, available // 4)
    logger.info("CPU: --gpu-memory-utilization=%s does not apply; KV cache gets the default "
                "min(4 GiB, available RAM %s / 4) = %s (set --kv-cache-memory to change).",
                cache.gpu_memory_utilization, format_bytes(available), format_bytes(budget))
    return MemoryReport(budget, weights_bytes, f"CPU default of {format_bytes(budget)}")


def cuda_kv_budget(cache: CacheConfig, weights_bytes: int, device: torch.device,
                   profile: Callable[[], None], free_at_start: int) -> MemoryReport:
    """Profile one forward pass of the largest batch, then give the KV cache what remains of this
    process's share (total x gpu_memory_utilization). `free_at_start`: free memory before this process
    loaded anything, so memory of other processes on the GPU is never counted as ours."""
    if cache.kv_cache_memory is not None:
        return MemoryReport(cache.kv_cache_memory, weights_bytes, "explicit --kv-cache-memory")
    _, total = torch.cuda.mem_get_info(device)
    requested = int(total * cache.gpu_memory_utilization)
    if requested > free_at_start:
        raise ConfigError(f"--gpu-memory-utilization {cache.gpu_memory_utilization} asks for "
                          f"{format_bytes(requested)} but only {format_bytes(free_at_start)} of "
                          f"{format_bytes(total)} is free on {device}; lower --gpu-memory-utilization.")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    profile()
    torch.cuda.synchronize(device)
    peak_activations = torch.cuda.max_memory_allocated(device) - before
    free_after, _ = torch.cuda.mem_get_info(device)
    non_torch = max(0, (free_at_start - free_after) - torch.cuda.memory_reserved(device))
    kv_bytes = gpu_kv_budget(total, cache.gpu_memory_utilization, weights_bytes, peak_activations, non_torch)
    detail = (f"total {format_bytes(total)} x gpu_memory_utilization {cache.gpu_memory_utilization} = "
              f"{format_bytes(requested)}; weights {format_bytes(weights_bytes)}, peak activations "
              f"{format_bytes(peak_activations)}, non-torch {format_bytes(non_torch)}")
    if kv_bytes <= 0:
        raise ConfigError(f"No GPU memory is left for the KV cache: {detail}. Raise "
                          "--gpu-memory-utilization or lower --max-num-batched-tokens.")
    return MemoryReport(kv_bytes, weights_bytes, detail)
