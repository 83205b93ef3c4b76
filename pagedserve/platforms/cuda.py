"""The CUDA platform: one GPU per rank, a KV budget profiled as vLLM does (total x
gpu_memory_utilization - weights - peak activations - memory outside torch), NCCL, pinned swap memory."""

from collections.abc import Callable

import torch

from pagedserve.config import CacheConfig, ParallelConfig
from pagedserve.errors import ConfigError
from pagedserve.platforms.interface import Platform
from pagedserve.sizing import MemoryReport, gpu_kv_budget
from pagedserve.utils import format_bytes


class CudaPlatform(Platform):
    device_type = "cuda"
    dist_backend = "nccl"
    default_attention_backend = "triton"  # torch when triton does not import (logged)

    def init_device(self, local_rank: int, parallel: ParallelConfig) -> torch.device:
        # NOTE: the r-th data-parallel replica on this node takes its r-th run of tp x pp GPUs.
        device = torch.device("cuda", parallel.data_parallel_rank_local * parallel.world_size + local_rank)
        torch.cuda.set_device(device)
        return device

    def memory_baseline(self, device: torch.device) -> int:
        return int(torch.cuda.mem_get_info(device)[0])

    def kv_budget(
        self,
        cache: CacheConfig,
        weights_bytes: int,
        device: torch.device,
        profile: Callable[[], None],
        baseline: int,
    ) -> MemoryReport:
        """Profile one forward pass of the largest batch, then give the KV cache what remains of this
        process's share (total x gpu_memory_utilization). `baseline`: free memory before this process
        loaded anything."""
        if cache.kv_cache_memory is not None:
            return MemoryReport(cache.kv_cache_memory, weights_bytes, "explicit --kv-cache-memory")
        _, total = torch.cuda.mem_get_info(device)
        requested = int(total * cache.gpu_memory_utilization)
        if requested > baseline:
            raise ConfigError(
                f"--gpu-memory-utilization {cache.gpu_memory_utilization} asks for "
                f"{format_bytes(requested)} but only {format_bytes(baseline)} of "
                f"{format_bytes(total)} is free on {device}; lower --gpu-memory-utilization."
            )
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        profile()
        torch.cuda.synchronize(device)
        peak_activations = torch.cuda.max_memory_allocated(device) - before
        free_after, _ = torch.cuda.mem_get_info(device)
        non_torch = max(0, (baseline - free_after) - torch.cuda.memory_reserved(device))
        kv_bytes = gpu_kv_budget(
            total, cache.gpu_memory_utilization, weights_bytes, peak_activations, non_torch
        )
        detail = (
            f"total {format_bytes(total)} x gpu_memory_utilization {cache.gpu_memory_utilization} = "
            f"{format_bytes(requested)}; weights {format_bytes(weights_bytes)}, peak activations "
            f"{format_bytes(peak_activations)}, non-torch {format_bytes(non_torch)}"
        )
        if kv_bytes <= 0:
            raise ConfigError(
                f"No GPU memory is left for the KV cache: {detail}. Raise "
                "--gpu-memory-utilization or lower --max-num-batched-tokens."
            )
        return MemoryReport(kv_bytes, weights_bytes, detail)

    def allocate_kv_cache(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=device)

    def allocate_host_swap(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def ray_bundle(self) -> dict[str, float]:
        return {"CPU": 1.0, "GPU": 1.0}
