"""What differs between device kinds, in one place: the worker's device, KV-cache and host swap
allocation (pinned or not), the KV budget (explicit, default or profiled), the collective backend (gloo
or NCCL), the default attention backend and a rank's resources in a Ray placement group. The rest of the
engine asks its Platform instead of branching on the device."""

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from pagedserve.config import CacheConfig, ParallelConfig
from pagedserve.sizing import MemoryReport


class Platform(ABC):
    device_type: str  # torch's device type: cpu | cuda
    dist_backend: str  # torch.distributed backend of the tensor-parallel group
    default_attention_backend: str  # what --attention-backend auto means here

    @abstractmethod
    def init_device(self, local_rank: int, parallel: ParallelConfig) -> torch.device:
        """Claim this rank's device (and its share of the host's threads) and return it."""

    def memory_baseline(self, device: torch.device) -> int:
        """Free device memory before this process loads anything (CUDA; 0 elsewhere), so the KV budget
        never counts other processes' memory as this engine's."""
        return 0

    @abstractmethod
    def kv_budget(
        self,
        cache: CacheConfig,
        weights_bytes: int,
        device: torch.device,
        profile: Callable[[], None],
        baseline: int,
    ) -> MemoryReport:
        """The bytes the KV cache may take on `device` (explicit --kv-cache-memory wins). `profile` runs
        one forward of the largest batch, for platforms that measure. Raises ConfigError naming the flag
        when nothing is left."""

    @abstractmethod
    def allocate_kv_cache(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A zero-filled KV tensor: attention reads padding slots (masked out, but 0 * NaN is NaN), so
        the cache must start finite."""

    @abstractmethod
    def allocate_host_swap(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Host memory for swapped-out KV blocks (pinned where that speeds up copies)."""

    @abstractmethod
    def ray_bundle(self) -> dict[str, float]:
        """The resources one rank reserves in a Ray placement group."""
