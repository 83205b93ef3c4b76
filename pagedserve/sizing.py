"""KV-cache sizing, the one module that decides the cache's size, on plain numbers (no torch): the
arithmetic the engine's startup and `pagedserve plan` share, so the planner's figures are the engine's
own. Each rank's platform measures its memory (platforms/: an explicit budget, a CPU default, or a
profiled GPU); `size_kv_cache` turns those reports into the one KVCacheConfig every rank allocates.

Per rank: weights = parameters (model_shape.py) x dtype bytes; KV bytes per token = 2 (K and V) x layers
x KV heads on the rank x head_dim x KV dtype bytes (MLA, DeepSeek: layers x (kv_lora_rank + qk_rope_head_dim) x KV dtype
bytes, the latent replicated on every rank); on CUDA the KV budget is total x gpu_memory_utilization - weights - peak
activations - memory outside torch; blocks = budget // bytes per block (one of them the reserved null
block); capacity = usable blocks x block_size tokens.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pagedserve.config import EngineConfig, KVCacheConfig
from pagedserve.config.kv_layout import KVCacheLayout
from pagedserve.errors import ConfigError
from pagedserve.logger import init_logger
from pagedserve.utils import format_bytes

logger = init_logger(__name__)

# The CPU's KV cache without --kv-cache-memory: at most this (platforms/cpu.py takes less when RAM is short).
CPU_DEFAULT_KV_BYTES = 4 * 2**30


@dataclass(frozen=True)
class WeightBytes:
    """One rank's weight bytes: those outside the decoder layers (embedding, LM head, final norm) and each
    of its decoder layers'."""

    outside: int
    layers: tuple[int, ...]

    @property
    def total(self) -> int:
        return self.outside + sum(self.layers)


@dataclass(frozen=True)
class CPUOffload:
    """--cpu-offload-gb: the decoder layers whose weights live in host memory, and what the device keeps
    for them (two buffers of the largest, filled one layer ahead; one buffer for a single layer)."""

    layers: tuple[int, ...]  # positions in WeightBytes.layers, ascending
    host_bytes: int
    buffer_bytes: int

    def device_bytes(self, weights: WeightBytes) -> int:
        """The weights' bytes on the device: all but the host-resident layers, plus the buffers."""
        return weights.total - self.host_bytes + self.buffer_bytes


def choose_offloaded_layers(layer_bytes: Sequence[int], offload_gib: float) -> CPUOffload:
    """Whole decoder layers from the last backwards until at least `offload_gib` GiB are host-resident.
    Raises ConfigError when the layers hold less than that."""
    wanted = int(offload_gib * 2**30)
    if wanted > sum(layer_bytes):
        raise ConfigError(
            f"--cpu-offload-gb {offload_gib} is more than the {format_bytes(sum(layer_bytes))} of decoder "
            "layer weights that can live in host memory (the embedding and LM head stay on the device); "
            "lower --cpu-offload-gb."
        )
    chosen: list[int] = []
    host = 0
    for index in reversed(range(len(layer_bytes))):
        if host >= wanted:
            break
        chosen.append(index)
        host += layer_bytes[index]
    largest = max((layer_bytes[index] for index in chosen), default=0)
    return CPUOffload(tuple(sorted(chosen)), host, min(len(chosen), 2) * largest)


def gpu_kv_budget(total: int, utilization: float, weights: int, peak_activations: int, non_torch: int) -> int:
    """What the KV cache gets on a GPU: this engine's share of the memory (total x utilization) less the
    weights, the peak activations and the memory used outside torch (NCCL, cuBLAS workspaces)."""
    return int(total * utilization) - weights - peak_activations - non_torch


def kv_cache_config(kv_bytes: int, bytes_per_block: int, block_size: int) -> KVCacheConfig:
    """The KV cache a budget of `kv_bytes` holds (the reserved null block included)."""
    return KVCacheConfig(max(0, kv_bytes) // bytes_per_block, block_size, bytes_per_block)


def max_concurrency(kv: KVCacheConfig, max_model_len: int, layout: KVCacheLayout) -> float:
    """How many requests of `max_model_len` tokens the cache holds at once, as the startup log says."""
    if not layout.groups.has_windows:
        return kv.capacity_tokens / max_model_len
    return max(0, kv.num_blocks - 1) / layout.max_blocks(max_model_len)


def max_full_requests(kv: KVCacheConfig, num_tokens: int, layout: KVCacheLayout) -> int:
    """How many requests of `num_tokens` tokens fit at once, whole blocks each."""
    return max(0, kv.num_blocks - 1) // layout.max_blocks(num_tokens)


def check_fits(kv: KVCacheConfig, max_model_len: int, layout: KVCacheLayout) -> None:
    """Raises ConfigError (numbers and flags) when one request of `max_model_len` tokens cannot fit."""
    if kv.num_blocks < 2 or max_full_requests(kv, max_model_len, layout) < 1:
        raise ConfigError(
            f"The KV cache holds {kv.capacity_tokens} tokens, fewer than one request of "
            f"max_model_len={max_model_len} tokens needs; the largest max_model_len that fits is "
            f"{kv.capacity_tokens}. Raise --kv-cache-memory (or --gpu-memory-utilization on a GPU) "
            "or lower --max-model-len."
        )


@dataclass(frozen=True)
class MemoryReport:
    """One rank's KV budget, as its platform measured it."""

    kv_cache_bytes: int
    weights_bytes: int
    detail: str  # the breakdown, for the startup log


def tightest(reports: Sequence[MemoryReport], bytes_per_block: Sequence[int] | None = None) -> MemoryReport:
    """The report of the rank whose budget holds the fewest blocks (`bytes_per_block[rank]`: its stage's
    block; default the same on every rank): every rank allocates the same block count."""
    if len(reports) == 1:
        return reports[0]
    sizes = bytes_per_block or [1] * len(reports)
    rank = min(range(len(reports)), key=lambda r: reports[r].kv_cache_bytes // sizes[r])
    return MemoryReport(
        reports[rank].kv_cache_bytes,
        reports[rank].weights_bytes,
        f"rank {rank}, the tightest of {len(reports)}: {reports[rank].detail}",
    )


def size_kv_cache(config: EngineConfig, measure: Callable[[], Sequence[MemoryReport]]) -> KVCacheConfig:
    """The KV cache of the engine: --num-gpu-blocks-override, else what the tightest rank's measured
    budget (`measure()`, one report per rank) holds; swap space in blocks. Logs the breakdown and
    raises ConfigError (numbers and flags) when one request of max_model_len tokens cannot fit."""
    cache, layout = config.cache, config.kv_layout
    block_size, bytes_per_block = layout.block_size, layout.bytes_per_block
    if cache.num_gpu_blocks_override is not None:
        num_blocks, source = cache.num_gpu_blocks_override, "num_gpu_blocks_override"
    else:
        reports, tp = measure(), config.parallel.tensor_parallel_size
        # NOTE: ranks in order, pp_rank * tp + tp_rank: a pipeline stage stores only its own layers.
        stage_bytes = [layout.stage_bytes_per_block(rank // tp) for rank in range(len(reports))]
        report = tightest(reports, stage_bytes)
        num_blocks = min(
            kv_cache_config(r.kv_cache_bytes, size, block_size).num_blocks
            for r, size in zip(reports, stage_bytes)
        )
        source = report.detail
        logger.info("Model weights: %s.", format_bytes(report.weights_bytes))
    kv = KVCacheConfig(num_blocks, block_size, bytes_per_block, cache.swap_space_bytes // bytes_per_block)
    max_model_len = config.model.max_model_len
    cache_dtype = config.model.dtype if cache.cache_dtype == "auto" else cache.cache_dtype
    logger.info(
        "KV cache (%s, %s): %s per token, %s per block of %d tokens, %d blocks (+1 reserved), "
        "%s in all, capacity %d tokens.",
        source,
        cache_dtype,
        format_bytes(bytes_per_block // block_size),
        format_bytes(bytes_per_block),
        block_size,
        num_blocks - 1,
        format_bytes(bytes_per_block * num_blocks),
        kv.capacity_tokens,
    )
    if layout.model.latent:
        logger.info("KV layout: %s, not K and V per head.", layout.model.describe())
    if layout.groups.has_windows:
        groups = layout.groups
        logger.info(
            "Sliding windows: %d KV cache group(s) of %d layer(s), windows %s (None: full attention); a block "
            "holds one group's layers, and blocks out of a window group's reach are freed as requests grow.",
            groups.num_groups,
            groups.group_size,
            list(groups.windows),
        )
    logger.info(
        "Maximum concurrency for %d tokens per request: %.2fx",
        max_model_len,
        max_concurrency(kv, max_model_len, layout),
    )
    logger.info(
        "Swap space: %d host blocks (%s, --swap-space); prefix caching %s.",
        kv.num_host_blocks,
        format_bytes(kv.num_host_blocks * bytes_per_block),
        "on" if cache.enable_prefix_caching else "off (--no-enable-prefix-caching)",
    )
    check_fits(kv, max_model_len, layout)
    return kv
