"""KV-cache sizing, the one module that decides the cache's size, on plain numbers (no torch): the
arithmetic the engine's startup and `pagedserve plan` share, so the planner's figures are the engine's
own. Each rank's platform measures its memory (platforms/: an explicit budget, a CPU default, or a
profiled GPU); `size_kv_cache` turns those reports into the one KVCacheConfig every rank allocates.

Per rank: weights = parameters x dtype bytes; KV bytes per token = 2 (K and V) x layers x KV heads on the
rank x head_dim x KV dtype bytes (MLA, DeepSeek: layers x (kv_lora_rank + qk_rope_head_dim) x KV dtype
bytes, the latent replicated on every rank); on CUDA the KV budget is total x gpu_memory_utilization - weights - peak
activations - memory outside torch; blocks = budget // bytes per block (one of them the reserved null
block); capacity = usable blocks x block_size tokens.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pagedserve.config import EngineConfig, KVCacheConfig
from pagedserve.config.kv_layout import KVCacheLayout, kv_heads_per_rank
from pagedserve.config.parallel import PipelineStage
from pagedserve.errors import ConfigError
from pagedserve.families import NormPlacement, decoder_family
from pagedserve.logger import init_logger
from pagedserve.utils import cdiv, format_bytes
from pagedserve.utils.hf_config import (
    falcon_parallel_attention,
    falcon_two_layernorms,
    head_dim,
    is_deepseek_moe_layer,
    is_sparse_layer,
    num_kv_heads,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig

logger = init_logger(__name__)

# The CPU's KV cache without --kv-cache-memory: at most this (platforms/cpu.py takes less when RAM is short).
CPU_DEFAULT_KV_BYTES = 4 * 2**30


@dataclass(frozen=True)
class MLAShape:
    """Multi-head latent attention's sizes (DeepSeek V2/V3; q_lora_rank 0: one q_proj)."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @classmethod
    def of(cls, hf_config: "PretrainedConfig") -> "MLAShape":
        return cls(
            hf_config.q_lora_rank or 0,
            hf_config.kv_lora_rank,
            hf_config.qk_nope_head_dim,
            hf_config.qk_rope_head_dim,
            hf_config.v_head_dim,
        )

    def linear_matrices(self, hidden: int, heads: int) -> list[tuple[int, int]]:
        """(rows, columns) of the attention projections on a rank holding `heads` heads: q (or q_a, q_b),
        kv_a (replicated), kv_b, o."""
        q_out = heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        q = [(self.q_lora_rank, hidden), (q_out, self.q_lora_rank)] if self.q_lora_rank else [(q_out, hidden)]
        return q + [
            (self.kv_lora_rank + self.qk_rope_head_dim, hidden),
            (heads * (self.qk_nope_head_dim + self.v_head_dim), self.kv_lora_rank),
            (hidden, heads * self.v_head_dim),
        ]

    def parameters(self, hidden: int, heads: int) -> int:
        """The projections and the two latent norms."""
        return sum(rows * cols for rows, cols in self.linear_matrices(hidden, heads)) + (
            self.q_lora_rank + self.kv_lora_rank
        )


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a model that memory depends on (every supported family: dense or mixture-of-experts
    MLPs, all experts resident)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int  # of the dense MLP layers
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool = False
    norms_per_layer: int = 2
    norm_params: int = 1  # per element of a norm: 1 (RMSNorm), 2 (LayerNorm with bias: Falcon)
    mlp_matrices: int = 3  # gate, up, down (gated) or up, down (Falcon)
    linear_bias: bool = False  # Falcon's `bias`: o_proj and the MLP too
    moe_layers: tuple[int, ...] = ()  # the indices of the mixture-of-experts layers
    num_experts: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    sinks: bool = False  # a sink logit per head (gpt-oss)
    output_and_expert_biases: bool = False  # o_proj's, the router's and each expert's gate/up/down biases
    has_embedding: bool = True  # False on a pipeline stage after the first
    has_head: bool = True  # the final norm and LM head; False on a pipeline stage before the last
    first_layer: int = 0  # the model's index of the first decoder layer held (a pipeline stage's start)
    mla: MLAShape | None = None  # multi-head latent attention (DeepSeek) instead of q/k/v projections
    shared_expert_gate: bool = True  # Qwen2-MoE's sigmoid gate on its shared expert (DeepSeek has none)
    router_bias: bool = False  # DeepSeek V3's e_score_correction_bias, one per expert

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layers)

    def stage(self, stage: PipelineStage) -> "ModelShape":
        """The part one pipeline stage holds: its layers (and their experts)."""
        if stage.num_stages == 1:
            return self
        return replace(
            self,
            num_layers=stage.end - stage.start,
            first_layer=stage.start,
            moe_layers=tuple(layer for layer in self.moe_layers if stage.holds(layer)),
            has_embedding=stage.is_first,
            has_head=stage.is_last,
        )

    @classmethod
    def from_hf_config(cls, hf_config: "PretrainedConfig", architecture: str) -> "ModelShape":
        """Read a transformers config (config.json's fields), as the family (families.py) lays it out."""
        facts = decoder_family(architecture)
        heads, layers = hf_config.num_attention_heads, hf_config.num_hidden_layers
        linear_bias = facts.bias_field is not None and bool(getattr(hf_config, facts.bias_field))
        num_experts = (
            getattr(hf_config, "num_local_experts", None) or getattr(hf_config, "num_experts", 0) or 0
        )
        moe_layers: tuple[int, ...] = ()
        moe_size = 0
        deepseek = facts.mla is not None
        if deepseek:
            num_experts = hf_config.n_routed_experts
            moe_layers = tuple(i for i in range(layers) if is_deepseek_moe_layer(hf_config, i))
            moe_size = hf_config.moe_intermediate_size
        elif facts.moe is not None and (facts.moe.every_layer or num_experts):
            moe_layers = tuple(
                i for i in range(layers) if facts.moe.every_layer or is_sparse_layer(hf_config, i)
            )
            moe_size = getattr(hf_config, facts.moe.expert_size_field)
        return cls(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=getattr(hf_config, facts.mlp_size_field) or 4 * hf_config.hidden_size,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=num_kv_heads(hf_config, architecture),
            head_dim=head_dim(hf_config),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            qkv_bias=facts.qkv_bias or linear_bias,
            qk_norm=facts.qk_norm,
            norms_per_layer=_norms_per_layer(facts.norm_placement, hf_config),
            norm_params=2 if facts.layer_norm else 1,
            mlp_matrices=3 if facts.gated_mlp else 2,
            linear_bias=linear_bias,
            moe_layers=moe_layers,
            num_experts=num_experts if moe_layers else 0,
            moe_intermediate_size=moe_size,
            shared_expert_intermediate_size=(hf_config.n_shared_experts or 0) * moe_size
            if deepseek
            else getattr(hf_config, "shared_expert_intermediate_size", 0) or 0,
            sinks=facts.sinks,
            output_and_expert_biases=facts.output_and_expert_biases,
            mla=MLAShape.of(hf_config) if deepseek else None,
            shared_expert_gate=not deepseek,
            router_bias=facts.mla is not None and facts.mla.correction_bias,
        )

    def kv_heads_per_rank(self, tp: int) -> int:
        return kv_heads_per_rank(self.num_kv_heads, tp)

    def num_parameters(self, tp: int = 1) -> int:
        """Parameters held by one of `tp` ranks: the vocabulary split (padded) over the ranks, linear
        layers (experts included) split, norms and MoE routers replicated, a tied LM head counted once."""
        layers = sum(self.layer_parameters(tp, index) for index in self.layer_indices)
        # NOTE: a tied head is the embedding, unless a later pipeline stage holds it (as a copy).
        own_head = self.has_head and not (self.tie_word_embeddings and self.has_embedding)
        vocab = cdiv(self.vocab_size, tp) * self.hidden_size * (int(self.has_embedding) + int(own_head))
        return vocab + layers + (self.norm_params * self.hidden_size if self.has_head else 0)

    @property
    def layer_indices(self) -> range:
        """The model's indices of the decoder layers this shape holds."""
        return range(self.first_layer, self.first_layer + self.num_layers)

    def layer_parameters(self, tp: int, index: int) -> int:
        """Parameters of decoder layer `index` on one of `tp` ranks: attention, norms, and its dense MLP
        or its experts (router and shared expert included)."""
        hidden, head_dim = self.hidden_size, self.head_dim
        qkv_out = (self.num_heads // tp + 2 * self.kv_heads_per_rank(tp)) * head_dim
        attention = (
            hidden * qkv_out
            + (qkv_out if self.qkv_bias else 0)  # qkv_proj
            + self.num_heads * head_dim // tp * hidden  # o_proj
            + (hidden if self.linear_bias else 0)
            + (2 * head_dim if self.qk_norm else 0)
            + (self.num_heads // tp if self.sinks else 0)
            + (hidden if self.output_and_expert_biases else 0)  # o_proj's bias
        )
        if self.mla is not None:
            attention = self.mla.parameters(hidden, self.num_heads // tp)
        norms = self.norms_per_layer * self.norm_params * hidden
        if index not in self.moe_layers:
            return attention + norms + self._mlp(self.intermediate_size, tp)
        # router (and its bias) + experts
        moe = self.num_experts * (hidden + int(self.router_bias) + self._mlp(self.moe_intermediate_size, tp))
        if self.output_and_expert_biases:  # the router's, each expert's gate/up (split) and down (whole)
            moe += self.num_experts * (1 + 2 * self.moe_intermediate_size // tp + hidden)
        if self.shared_expert_intermediate_size:
            moe += self._mlp(self.shared_expert_intermediate_size, tp)  # shared expert(s)
            moe += hidden if self.shared_expert_gate else 0
        return attention + norms + moe

    def linear_matrices(self, tp: int, index: int) -> list[tuple[int, int]]:
        """(rows, columns) of decoder layer `index`'s attention projections and dense MLP matrices on one
        of `tp` ranks (no experts): the matrices a GPTQ/AWQ/fp8 checkpoint quantizes."""
        hidden = self.hidden_size
        qkv_out = (self.num_heads // tp + 2 * self.kv_heads_per_rank(tp)) * self.head_dim
        attention_width = self.num_heads * self.head_dim // tp
        matrices = [(qkv_out, hidden), (hidden, attention_width)]  # qkv_proj, o_proj
        if self.mla is not None:
            matrices = self.mla.linear_matrices(hidden, self.num_heads // tp)
        if index not in self.moe_layers:
            intermediate = self.intermediate_size // tp
            # gate and up (or Falcon's up alone) read the hidden state, down the intermediate one
            matrices += [(intermediate, hidden)] * (self.mlp_matrices - 1) + [(hidden, intermediate)]
        return matrices

    def expert_matrices(self, tp: int, index: int) -> list[tuple[int, int]]:
        """(rows, columns) of decoder layer `index`'s expert matrices on one of `tp` ranks, all experts:
        the matrices an MXFP4 checkpoint quantizes."""
        if index not in self.moe_layers:
            return []
        intermediate = self.moe_intermediate_size // tp
        gate_up = [(intermediate, self.hidden_size)] * (self.mlp_matrices - 1)
        return (gate_up + [(self.hidden_size, intermediate)]) * self.num_experts

    def _mlp(self, intermediate_size: int, tp: int) -> int:
        per_rank = intermediate_size // tp
        bias = per_rank + self.hidden_size if self.linear_bias else 0
        return self.mlp_matrices * self.hidden_size * per_rank + bias

    def activation_bytes(self, num_tokens: int, tp: int, dtype_bytes: int) -> int:
        """An estimate of the peak activations of a forward over `num_tokens` tokens (the engine
        measures it instead, with a profiling run): the residual and hidden states, the q/k/v and
        attention outputs, the MLP's gate/up output and its activation, and one row of float32 logits."""
        qkv = (self.num_heads // tp + 2 * self.kv_heads_per_rank(tp)) * self.head_dim
        per_token = (
            3 * self.hidden_size
            + qkv
            + self.num_heads // tp * self.head_dim
            + 3 * max(self.intermediate_size, self.moe_intermediate_size) // tp
        )
        return num_tokens * per_token * dtype_bytes + 4 * self.vocab_size


def _norms_per_layer(placement: NormPlacement, hf_config: "PretrainedConfig") -> int:
    """Norms per decoder layer: two before attention and MLP, Gemma's four, Falcon's one before parallel
    attention and MLP (else two)."""
    if placement == "sandwich":
        return 4
    if (
        placement == "parallel"
        and falcon_parallel_attention(hf_config)
        and not falcon_two_layernorms(hf_config)
    ):
        return 1
    return 2


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
