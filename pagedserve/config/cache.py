"""The KV cache: block size and the memory it may take (CacheConfig, what the user asked for), and
KVCacheConfig (what startup sized from measured memory; never written back into the config)."""

from dataclasses import dataclass
from typing import Literal, get_args

from pagedserve.errors import ConfigError
from pagedserve.logger import init_logger

logger = init_logger(__name__)

BlockSize = Literal[8, 16, 32]
SUPPORTED_BLOCK_SIZES: tuple[int, ...] = get_args(BlockSize)
# --kv-cache-dtype (vLLM's names): auto is the model's dtype; bfloat16 halves a float32 model's cache; fp8
# is fp8_e4m3 (attention/kv_quant.py).
KVCacheDType = Literal["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]
KV_CACHE_DTYPES: tuple[str, ...] = get_args(KVCacheDType)


@dataclass(frozen=True)
class CacheConfig:
    """Validated KV-cache settings. Raises ConfigError naming the flag to change."""

    block_size: int
    gpu_memory_utilization: float
    kv_cache_memory: int | None  # bytes; explicit budget (the way to size on CPU)
    num_gpu_blocks_override: int | None
    enable_prefix_caching: bool = True
    swap_space: float = 0.0  # GiB of host memory per worker for swapped-out KV blocks
    cache_dtype: KVCacheDType = "auto"
    calculate_kv_scales: bool = False  # fp8: per-layer scales from the first batch, else 1.0

    def __post_init__(self) -> None:
        if self.cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"kv_cache_dtype={self.cache_dtype!r} is not supported; --kv-cache-dtype must "
                f"be one of {', '.join(KV_CACHE_DTYPES)}."
            )
        if self.block_size not in SUPPORTED_BLOCK_SIZES:
            raise ConfigError(
                f"block_size={self.block_size} is not supported; --block-size must be one "
                f"of {', '.join(map(str, SUPPORTED_BLOCK_SIZES))}."
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1] "
                "(--gpu-memory-utilization)."
            )
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ConfigError(
                f"kv_cache_memory={self.kv_cache_memory} bytes must be positive (--kv-cache-memory)."
            )
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 2:
            raise ConfigError("num_gpu_blocks_override must be at least 2 (one block is reserved).")
        if self.swap_space < 0:
            raise ConfigError(f"swap_space={self.swap_space} GiB must not be negative (--swap-space).")
        if self.calculate_kv_scales and not self.cache_dtype.startswith("fp8"):
            # NOTE: a warning, not an error: vLLM accepts the flag with any cache dtype.
            logger.warning(
                "--calculate-kv-scales has no effect with --kv-cache-dtype %s: only an fp8 cache has "
                "scales (--kv-cache-dtype fp8).",
                self.cache_dtype,
            )

    @property
    def swap_space_bytes(self) -> int:
        return int(self.swap_space * 2**30)


@dataclass(frozen=True)
class KVCacheConfig:
    """The sized KV cache: decided at startup from measured memory, never written into EngineConfig."""

    num_blocks: int  # including the reserved null block
    block_size: int
    bytes_per_block: int
    num_host_blocks: int = 0  # swap space, per worker

    @property
    def capacity_tokens(self) -> int:
        return (self.num_blocks - 1) * self.block_size
