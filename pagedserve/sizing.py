"""KV-cache sizing, the one module that decides the cache's size, on plain numbers (no torch): the
arithmetic the engine's startup and `pagedserve plan` share, so the planner's figures are the engine's
own. Each rank's platform measures its memory (platforms/: an explicit budget, a CPU default, or a
profiled GPU); `size_kv_cache` turns those reports into the one KVCacheConfig every rank allocates.

Per rank: weights = parameters x dtype bytes; KV bytes per token = 2 (K and V) x layers x KV heads on the
rank x head_dim x KV dtype bytes; on CUDA the KV budget is total x gpu_memory_utilization - weights - peak
activations - memory outside torch; blocks = budget // bytes per block (one of them the reserved null
block); capacity = usable blocks x block_size tokens.
"""
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedserve.config import EngineConfig, KVCacheConfig
from pagedserve.errors import ConfigError
from pagedserve.logger import init_logger
from pagedserve.utils import cdiv, format_bytes

if TYPE_CHECKING:
    from transformers import PretrainedConfig

logger = init_logger(__name__)

# Bytes per element of each dtype the engine or the planner knows.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
# Architectures whose q/k/v projections carry a bias (models/qwen2.py).
_QKV_BIAS_ARCHITECTURES = frozenset({"Qwen2ForCausalLM"})


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama-family model (Llama, Mistral, Qwen2) that memory depends on."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    qkv_bias: bool

    @classmethod
    def from_hf_config(cls, hf_config: "PretrainedConfig", architecture: str) -> "ModelShape":
        """Read a transformers config (config.json's fields)."""
        heads = hf_config.num_attention_heads
        return cls(vocab_size=hf_config.vocab_size, hidden_size=hf_config.hidden_size,
                   intermediate_size=hf_config.intermediate_size, num_layers=hf_config.num_hidden_layers,
                   num_heads=heads, num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
                   head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
                   tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
                   qkv_bias=architecture in _QKV_BIAS_ARCHITECTURES)

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads are split over the ranks, or replicated (one per rank) when there are fewer."""
        return self.num_kv_heads // tp if self.num_kv_heads >= tp else 1

    def num_parameters(self, tp: int = 1) -> int:
        """Parameters held by one of `tp` ranks: the vocabulary split (padded) over the ranks, linear
        layers split, norms replicated, a tied LM head counted once."""
        hidden, head_dim = self.hidden_size, self.head_dim
        qkv_out = (self.num_heads // tp + 2 * self.kv_heads_per_rank(tp)) * head_dim
        per_layer = (hidden * qkv_out + (qkv_out if self.qkv_bias else 0)  # qkv_proj
                     + self.num_heads * head_dim // tp * hidden  # o_proj
                     + 3 * hidden * (self.intermediate_size // tp)  # gate_up_proj + down_proj
                     + 2 * hidden)  # the two RMSNorms
        vocab = cdiv(self.vocab_size, tp) * hidden
        return vocab * (1 if self.tie_word_embeddings else 2) + self.num_layers * per_layer + hidden

    def kv_bytes_per_token(self, tp: int, kv_dtype_bytes: int) -> int:
        """K and V of one token in every layer of one rank."""
        return 2 * self.num_layers * self.kv_heads_per_rank(tp) * self.head_dim * kv_dtype_bytes

    def activation_bytes(self, num_tokens: int, tp: int, dtype_bytes: int) -> int:
        """An estimate of the peak activations of a forward over `num_tokens` tokens (the engine
        measures it instead, with a profiling run): the residual and hidden states, the q/k/v and
        attention outputs, the MLP's gate/up output and its activation, and one row of float32 logits."""
        qkv = (self.num_heads // tp + 2 * self.kv_heads_per_rank(tp)) * self.head_dim
        per_token = 3 * self.hidden_size + qkv + self.num_heads // tp * self.head_dim \
            + 3 * self.intermediate_size // tp
        return num_tokens * per_token * dtype_bytes + 4 * self.vocab_size


def gpu_kv_budget(total: int, utilization: float, weights: int, peak_activations: int, non_torch: int) -> int:
    """What the KV cache gets on a GPU: this engine's share of the memory (total x utilization) less the
    weights, the peak activations and the memory used outside torch (NCCL, cuBLAS workspaces)."""
    return int(total * utilization) - weights - peak_activations - non_torch


def kv_cache_config(kv_bytes: int, bytes_per_block: int, block_size: int) -> KVCacheConfig:
    """The KV cache a budget of `kv_bytes` holds (the reserved null block included)."""
    return KVCacheConfig(max(0, kv_bytes) // bytes_per_block, block_size, bytes_per_block)


def max_concurrency(kv: KVCacheConfig, max_model_len: int) -> float:
    """How many requests of `max_model_len` tokens the cache holds at once, as the startup log says."""
    return kv.capacity_tokens / max_model_len


def max_full_requests(kv: KVCacheConfig, num_tokens: int) -> int:
    """How many requests of `num_tokens` tokens fit at once, whole blocks each."""
    return max(0, kv.num_blocks - 1) // cdiv(num_tokens, kv.block_size)


def check_fits(kv: KVCacheConfig, max_model_len: int) -> None:
    """Raises ConfigError (numbers and flags) when one request of `max_model_len` tokens cannot fit."""
    if kv.num_blocks < 2 or max_full_requests(kv, max_model_len) < 1:
        raise ConfigError(
            f"The KV cache holds {kv.capacity_tokens} tokens, fewer than one request of "
            f"max_model_len={max_model_len} tokens needs; the largest max_model_len that fits is "
            f"{kv.capacity_tokens}. Raise --kv-cache-memory (or --gpu-memory-utilization on a GPU) "
            "or lower --max-model-len.")


@dataclass(frozen=True)
class MemoryReport:
    """One rank's KV budget, as its platform measured it."""

    kv_cache_bytes: int
    weights_bytes: int
    detail: str  # the breakdown, for the startup log


def tightest(reports: Sequence[MemoryReport]) -> MemoryReport:
    """The report of the rank with the smallest budget: every rank allocates the same block count."""
    if len(reports) == 1:
        return reports[0]
    rank = min(range(len(reports)), key=lambda r: reports[r].kv_cache_bytes)
    return MemoryReport(reports[rank].kv_cache_bytes, reports[rank].weights_bytes,
                        f"rank {rank}, the tightest of {len(reports)}: {reports[rank].detail}")


def size_kv_cache(config: EngineConfig, bytes_per_block: int,
                  measure: Callable[[], Sequence[MemoryReport]]) -> KVCacheConfig:
    """The KV cache of the engine: --num-gpu-blocks-override, else what the tightest rank's measured
    budget (`measure()`, one report per rank) holds; swap space in blocks. Logs the breakdown and
    raises ConfigError (numbers and flags) when one request of max_model_len tokens cannot fit."""
    cache, block_size = config.cache, config.cache.block_size
    if cache.num_gpu_blocks_override is not None:
        num_blocks, source = cache.num_gpu_blocks_override, "num_gpu_blocks_override"
    else:
        report = tightest(measure())
        num_blocks = kv_cache_config(report.kv_cache_bytes, bytes_per_block, block_size).num_blocks
        source = report.detail
        logger.info("Model weights: %s.", format_bytes(report.weights_bytes))
    kv = KVCacheConfig(num_blocks, block_size, bytes_per_block, cache.swap_space_bytes // bytes_per_block)
    max_model_len = config.model.max_model_len
    logger.info("KV cache (%s): %s per token, %s per block of %d tokens, %d blocks (+1 reserved), "
                "%s in all, capacity %d tokens.", source, format_bytes(bytes_per_block // block_size),
                format_bytes(bytes_per_block), block_size, num_blocks - 1,
                format_bytes(bytes_per_block * num_blocks), kv.capacity_tokens)
    logger.info("Maximum concurrency for %d tokens per request: %.2fx", max_model_len,
                max_concurrency(kv, max_model_len))
    logger.info("Swap space: %d host blocks (%s, --swap-space); prefix caching %s.", kv.num_host_blocks,
                format_bytes(kv.num_host_blocks * bytes_per_block),
                "on" if cache.enable_prefix_caching else "off (--no-enable-prefix-caching)")
    check_fits(kv, max_model_len)
    return kv
