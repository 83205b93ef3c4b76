"""The CPU platform: ranks share the host's cores, the KV cache is lazily committed memory with an
explicit (or modest default) budget, gloo joins the ranks, the native C++ kernels decode."""

import math
import mmap
import os
from collections.abc import Callable

import psutil
import torch

from pagedserve.config import CacheConfig, ParallelConfig
from pagedserve.config.parallel import MAX_CPU_THREADS
from pagedserve.logger import init_logger
from pagedserve.platforms.interface import Platform
from pagedserve.sizing import CPU_DEFAULT_KV_BYTES, MemoryReport
from pagedserve.utils import format_bytes

logger = init_logger(__name__)


class CpuPlatform(Platform):
    device_type = "cpu"
    dist_backend = "gloo"
    default_attention_backend = "cpu"

    def init_device(self, local_rank: int, parallel: ParallelConfig) -> torch.device:
        # NOTE: every native kernel splits its output rows over ATen's one OpenMP pool (at::parallel_for):
        # its threads start once and wait between calls, so its size is the only thread setting.
        threads = cpu_threads(parallel.cpu_threads, parallel.world_size * max(1, parallel.local_replicas))
        torch.set_num_threads(threads)
        logger.info("CPU: %d threads per rank (--cpu-threads).", threads)
        return torch.device("cpu")

    def kv_budget(
        self,
        cache: CacheConfig,
        weights_bytes: int,
        device: torch.device,
        profile: Callable[[], None],
        baseline: int,
    ) -> MemoryReport:
        """The explicit --kv-cache-memory, else min(4 GiB, a quarter of available RAM)."""
        if cache.kv_cache_memory is not None:
            return MemoryReport(cache.kv_cache_memory, weights_bytes, "explicit --kv-cache-memory")
        available = psutil.virtual_memory().available
        budget = min(CPU_DEFAULT_KV_BYTES, available // 4)
        logger.info(
            "CPU: --gpu-memory-utilization=%s does not apply; KV cache gets the default "
            "min(4 GiB, available RAM %s / 4) = %s (set --kv-cache-memory to change).",
            cache.gpu_memory_utilization,
            format_bytes(available),
            format_bytes(budget),
        )
        return MemoryReport(budget, weights_bytes, f"CPU default of {format_bytes(budget)}")

    def allocate_kv_cache(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        return lazy_zeros(shape, dtype)

    def allocate_host_swap(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return lazy_zeros(shape, dtype)

    def ray_bundle(self) -> dict[str, float]:
        return {"CPU": 1.0}


def cpu_threads(requested: int | None, num_ranks: int) -> int:
    """--cpu-threads, else OMP_NUM_THREADS (a user's pin, as llama.cpp's -t), else the physical cores this
    process may run on, shared by the ranks (tensor-parallel ranks times data-parallel replicas). Why
    physical: a core's two hyperthreads share its vector units, so a second matmul thread per core only
    waits on them; and more threads than free cores make every parallel region wait on a descheduled one."""
    if requested is not None:
        return requested
    pinned = os.environ.get("OMP_NUM_THREADS", "")
    if pinned.isdigit() and int(pinned) > 0:
        return min(int(pinned), MAX_CPU_THREADS)  # one pool thread each: a typo must not start millions
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cores = min(psutil.cpu_count(logical=False) or usable, usable)
    return max(1, cores // num_ranks)


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled CPU tensor whose pages are committed only when first touched."""
    # NOTE: an anonymous mmap is zero-filled lazily by the kernel: no 4 GiB memset at startup, and RSS
    # grows only as blocks are used. (torch.empty is not enough: below glibc's mmap threshold, which
    # grows to 32 MiB after weights are loaded, it reuses freed heap memory holding NaN bits.)
    buffer = mmap.mmap(-1, math.prod(shape) * dtype.itemsize)
    return torch.frombuffer(buffer, dtype=dtype).view(shape)
