"""The KV cache's layout, computed once from the configs (`EngineConfig.kv_layout`) and read by every part
that needs it: sizing and the planner (bytes per block, blocks per request), the KV manager and admission
(table entries, the blocks a window frees), the input processor (what a beam search may need), the workers
(the tensors they allocate and which layer reads which table).

KV cache groups (vLLM v1's hybrid KV-cache manager): layers are sorted by attention type (their sliding
window; None: full attention) and each type is cut into groups of `group_size` layers (vLLM's
`_get_kv_cache_config_uniform_page_size`): the smallest type's layer count, or the largest one's when all
counts are within 25% of each other (then no type is cut). A request has one block table per group, all
drawn from one pool, and a block id is memory for `group_size` layers: the workers allocate `group_size`
K/V tensors, and the i-th layer of every group reads and writes tensor i. A block a window group no longer
reads therefore returns the memory of that group's layers. Group 0 is a full-attention group when the
model has one (the draft model of speculative decoding reads its tables). One group (every layer of the
same type: Llama, Mistral, ...) is the layout of a model without groups.

Each group's attention type is one of two rules behind one interface (vLLM v1's per-type managers):
`FullAttention` keeps every block of a request; `SlidingWindow` frees the blocks before its window."""

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedserve.config.parallel import PipelineStage, pipeline_stages
from pagedserve.families import MLA_ARCHITECTURES
from pagedserve.utils import cdiv
from pagedserve.utils.hf_config import (
    head_dim,
    layer_windows,
    mla_latent_dims,
    num_kv_heads,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from pagedserve.config.cache import CacheConfig
    from pagedserve.config.model import ModelConfig

# Bytes per element of each dtype the engine or the planner knows.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class FullAttention:
    """Every position reads every earlier one: a request keeps all its blocks."""

    block_size: int
    window: None = None

    def num_unreachable_blocks(self, num_computed_tokens: int) -> int:
        return 0

    def max_blocks(self, entries: int, chunk: int) -> int:
        return entries


@dataclass(frozen=True)
class SlidingWindow:
    """The query at position p reads positions (p - window, p]: the blocks before are freed."""

    block_size: int
    window: int

    def num_unreachable_blocks(self, num_computed_tokens: int) -> int:
        """Leading blocks never read again once `num_computed_tokens` tokens are computed."""
        return max(0, num_computed_tokens - self.window + 1) // self.block_size

    def max_blocks(self, entries: int, chunk: int) -> int:
        """Blocks held at most while growing by chunks of up to `chunk` tokens: the window, the chunk and
        a partly filled block at each end (one decode step: ceil(W / block_size) + 1)."""
        return min(entries, cdiv(self.window - 1 + chunk, self.block_size) + 1)


AttentionType = FullAttention | SlidingWindow


@dataclass(frozen=True)
class KVCacheGroups:
    """`layers[g]`: the layer indices of group g (in model order); `windows[g]`: their window."""

    layers: tuple[tuple[int, ...], ...]
    windows: tuple[int | None, ...]
    block_size: int

    @classmethod
    def from_layer_windows(cls, layer_windows: Sequence[int | None], block_size: int) -> "KVCacheGroups":
        by_type: dict[int | None, list[int]] = {}
        for layer, window in enumerate(layer_windows):
            by_type.setdefault(window, []).append(layer)
        # Full attention first, then windows from the narrowest.
        types = sorted(by_type, key=lambda w: (w is not None, w or 0))
        counts = [len(by_type[w]) for w in types]
        size = max(counts) if max(counts) < 1.25 * min(counts) else min(counts)
        layers: list[tuple[int, ...]] = []
        windows: list[int | None] = []
        for window in types:
            members = by_type[window]
            for start in range(0, len(members), size):
                layers.append(tuple(members[start : start + size]))
                windows.append(window)
        return cls(tuple(layers), tuple(windows), block_size)

    @classmethod
    def uniform(cls, block_size: int) -> "KVCacheGroups":
        """One group of full-attention layers: the layout of a model without windows."""
        return cls(((0,),), (None,), block_size)

    @classmethod
    def for_model(cls, hf_config: "PretrainedConfig", architecture: str, block_size: int) -> "KVCacheGroups":
        """The groups of a model's layers, read from its HF config."""
        return cls.from_layer_windows(layer_windows(hf_config, architecture), block_size)

    @property
    def num_groups(self) -> int:
        return len(self.layers)

    @property
    def group_size(self) -> int:
        """Layers per group (the last group of a type may have fewer): the K/V tensors a block id spans."""
        return max(len(members) for members in self.layers)

    @functools.cached_property
    def attention_types(self) -> tuple[AttentionType, ...]:
        """Each group's rule (built once: the KV manager asks for it every step)."""
        return tuple(
            FullAttention(self.block_size) if window is None else SlidingWindow(self.block_size, window)
            for window in self.windows
        )

    @property
    def has_windows(self) -> bool:
        return self.windows != (None,)

    def tensor_of_layer(self) -> dict[int, tuple[int, int]]:
        """Layer index -> (its group, the K/V tensor it uses: its place in the group)."""
        return {
            layer: (group, slot)
            for group, members in enumerate(self.layers)
            for slot, layer in enumerate(members)
        }

    def table_entries(self, num_tokens: int) -> int:
        """Length of a request's table (every group's blocks, those freed out of a window included) that
        holds `num_tokens` tokens."""
        return cdiv(num_tokens, self.block_size) * self.num_groups

    def num_unreachable_blocks(self, group: int, num_computed_tokens: int) -> int:
        """Leading blocks of `group`'s table that it never reads again once `num_computed_tokens` tokens
        are computed."""
        return self.attention_types[group].num_unreachable_blocks(num_computed_tokens)

    def max_blocks(self, num_tokens: int, chunk: int) -> int:
        """Blocks (all groups) a request of `num_tokens` tokens holds at most, growing by prefill chunks of
        up to `chunk` tokens."""
        entries = cdiv(num_tokens, self.block_size)
        return sum(kind.max_blocks(entries, chunk) for kind in self.attention_types)


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """KV heads are split over the ranks, or replicated (one per rank) when there are fewer."""
    return num_kv_heads // tp if num_kv_heads >= tp else 1


@dataclass(frozen=True)
class KVTensors:
    """One model's attention layers as the KV cache stores them on one rank: a K and a V tensor per layer
    [blocks, block_size, num_kv_heads, head_dim], or for multi-head latent attention (`latent`: DeepSeek
    V2/V3) one tensor [blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim], the latent every head's
    K and V are expanded from and the rotary key they share, replicated on every tensor-parallel rank."""

    num_layers: int
    num_kv_heads: int  # on the rank
    head_dim: int
    latent: bool = False

    @classmethod
    def of(cls, hf_config: "PretrainedConfig", architecture: str, tp: int) -> "KVTensors":
        if architecture in MLA_ARCHITECTURES:
            return cls(hf_config.num_hidden_layers, 1, sum(mla_latent_dims(hf_config)), latent=True)
        heads = kv_heads_per_rank(num_kv_heads(hf_config, architecture), tp)
        return cls(hf_config.num_hidden_layers, heads, head_dim(hf_config))

    @property
    def tensors_per_layer(self) -> int:
        return 1 if self.latent else 2

    @property
    def values_per_token(self) -> int:
        """K and V values (or the latent's) of one token in one layer."""
        return self.tensors_per_layer * self.num_kv_heads * self.head_dim

    def describe(self) -> str:
        """What one token stores per layer, for the startup log and the planner."""
        if self.latent:
            return f"MLA latent: {self.head_dim} values per token per layer (kv_lora_rank + qk_rope_head_dim)"
        return f"K and V: 2 x {self.num_kv_heads} KV heads x {self.head_dim} values per token per layer"


@dataclass(frozen=True)
class KVCacheLayout:
    """The KV cache of the ranks: its groups, the tensors a block id spans (`group_size` of the model's
    layers, and every layer of a draft model, which keeps its own cache under the same block ids) and the
    bytes of one stored value. Under pipeline parallelism each stage stores its own layers only: the
    `stage_*` figures are one stage's; the unprefixed ones the largest stage's."""

    groups: KVCacheGroups
    model: KVTensors
    dtype_bytes: int
    draft: KVTensors | None = None
    max_chunk: int = 0  # the most tokens a request computes in one step (the step's token budget)
    stages: tuple[PipelineStage, ...] = ()  # every pipeline stage's layers (build: one stage at pp=1)

    @classmethod
    def build(
        cls,
        model: "ModelConfig",
        block_size: int,
        kv_dtype_bytes: int,
        tp: int = 1,
        max_chunk: int = 0,
        draft: "ModelConfig | None" = None,
        pp: int = 1,
    ) -> "KVCacheLayout":
        return cls(
            KVCacheGroups.for_model(model.hf_config, model.architecture, block_size),
            KVTensors.of(model.hf_config, model.architecture, tp),
            kv_dtype_bytes,
            None if draft is None else KVTensors.of(draft.hf_config, draft.architecture, tp),
            max_chunk,
            pipeline_stages(model.hf_config.num_hidden_layers, pp),
        )

    @classmethod
    def for_engine(
        cls,
        model: "ModelConfig",
        cache: "CacheConfig",
        tp: int,
        max_chunk: int,
        draft: "ModelConfig | None",
        pp: int = 1,
    ) -> "KVCacheLayout":
        """The layout the engine's configs give (an fp8 cache stores one byte per value)."""
        dtype = model.dtype if cache.cache_dtype == "auto" else cache.cache_dtype
        return cls.build(model, cache.block_size, DTYPE_BYTES[dtype], tp, max_chunk, draft, pp)

    @property
    def block_size(self) -> int:
        return self.groups.block_size

    @property
    def num_groups(self) -> int:
        return self.groups.num_groups

    def stage_num_tensors(self, stage: int) -> int:
        """The model's K/V tensors a stage allocates: one per place in a group that its layers use (at
        pp=1 `group_size`: the i-th layer of every group shares tensor i)."""
        holds = self.stages[stage].holds
        return len({slot for layer, (_, slot) in self.groups.tensor_of_layer().items() if holds(layer)})

    def stage_draft_values_per_token(self, stage: int) -> int:
        """K and V values of one token in the draft model's layers on `stage`: all of them on the last
        stage (which samples, so it runs the draft model whole), none elsewhere."""
        if self.draft is None or not self.stages[stage].is_last:
            return 0
        return self.draft.num_layers * self.draft.values_per_token

    def stage_bytes_per_block(self, stage: int) -> int:
        """What one block id costs on a rank of `stage`: `block_size` tokens of K and V in every tensor it
        spans there."""
        values = self.stage_num_tensors(stage) * self.model.values_per_token
        values += self.stage_draft_values_per_token(stage)
        return values * self.block_size * self.dtype_bytes

    @property
    def bytes_per_block(self) -> int:
        """What one block id costs on the ranks of the largest stage (all of them at pp=1)."""
        return max(self.stage_bytes_per_block(stage) for stage in range(len(self.stages)))

    @property
    def bytes_per_token(self) -> int:
        """K and V of one token in every attention layer of a rank of the largest stage (draft included)."""
        values = max(
            (stage.end - stage.start) * self.model.values_per_token + self.stage_draft_values_per_token(rank)
            for rank, stage in enumerate(self.stages)
        )
        return values * self.dtype_bytes

    def max_blocks(self, num_tokens: int) -> int:
        """Blocks a request of `num_tokens` tokens holds at most (a window group's freed ones not)."""
        return self.groups.max_blocks(num_tokens, min(max(self.max_chunk, 1), num_tokens))

    @property
    def widest_window(self) -> int | None:
        """The widest window when every layer has one (nothing older is read again), else None."""
        windows = self.groups.windows
        return None if None in windows else max(w for w in windows if w is not None)
