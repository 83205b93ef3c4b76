"""The interface every attention backend implements, and the batch description they all start from."""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Generic, TypeAlias, TypeVar

import torch

from pagedserve.attention.kv_quant import KVQuantization
from pagedserve.attention.mla import MLAProjections

# One layer's cache: (K, V), each [num_blocks, block_size, num_kv_heads, head_dim]; an MLA layer's
# (latent,) [num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim] (attention/mla.py).
KVCache = tuple[torch.Tensor, ...]


@dataclass
class CommonAttentionMetadata:
    """One step's batch, flattened: request i owns query tokens
    [query_start_loc[i], query_start_loc[i + 1]) and, after this step, seq_lens[i] tokens of K/V.
    The model runner puts the `num_decodes` single-token requests first. Both are given twice: as host
    lists (for the backends' Python-side shapes) and as int64 tensors on the device, staged with the step's
    other inputs (so no backend copies them to the device again)."""

    query_start_loc: list[int]  # [num_reqs + 1]
    seq_lens: list[int]  # [num_reqs]
    query_start_loc_tensor: torch.Tensor  # [num_reqs + 1] int64, on the device
    seq_lens_tensor: torch.Tensor  # [num_reqs] int64, on the device
    block_tables: torch.Tensor  # [num_reqs, max_blocks_per_req] int64, padded with the null block 0
    slot_mapping: torch.Tensor  # [num_tokens] int64: block_id * block_size + offset
    num_decodes: int
    block_size: int
    # Request i's runs of positions [start, end) whose tokens attend each other both ways (one image's
    # tokens, Gemma 3), each whole in its prefill chunk or before it; requests without any are absent.
    bidirectional_spans: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    @classmethod
    def from_lists(
        cls,
        query_start_loc: list[int],
        seq_lens: list[int],
        block_tables: torch.Tensor,
        slot_mapping: torch.Tensor,
        num_decodes: int,
        block_size: int,
    ) -> "CommonAttentionMetadata":
        """A batch described by its lists alone (tests, benchmarks): the tensors made here, on the slot
        mapping's device."""
        device = slot_mapping.device
        return cls(
            query_start_loc,
            seq_lens,
            torch.tensor(query_start_loc, dtype=torch.int64, device=device),
            torch.tensor(seq_lens, dtype=torch.int64, device=device),
            block_tables,
            slot_mapping,
            num_decodes,
            block_size,
        )


class AttentionMetadata:
    """Base of every backend's per-step metadata (what its `build_metadata` precomputes and every
    layer's `forward` reads through the forward context)."""


MetadataT = TypeVar("MetadataT", bound=AttentionMetadata)


@dataclass
class AttentionLayerSpec:
    """One attention layer's shape and math. Every backend honours each field:
    `sliding_window` W: the query at position i attends only to positions (i - W, i] (HF's rule);
    `logits_soft_cap` c: scores s (already scaled) become c * tanh(s / c) before the softmax (Gemma 2);
    `sinks` [num_heads] (this rank's heads, float32): head h's softmax denominator gains e^sinks[h], a
    learned logit whose value is zero (gpt-oss's attention sinks), so a head may attend to nothing."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    sinks: torch.Tensor | None = None
    # fp8 KV cache: the format and this layer's K/V scales; None: the cache holds the model's dtype.
    kv_quant: KVQuantization | None = None
    # MLA (attention/mla.py): the layer caches one tensor (num_kv_heads 1, head_dim kv_lora_rank +
    # qk_rope_head_dim), its first `latent_dim` values the latent; None: a K and a V tensor.
    latent_dim: int | None = None

    @property
    def num_cache_tensors(self) -> int:
        return 2 if self.latent_dim is None else 1


class AttentionBackend(ABC, Generic[MetadataT]):
    """Writes the step's new K/V into the paged cache and attends over block tables."""

    name: str
    # Whether decode steps through this backend can be captured in CUDA graphs (worker/cuda_graph.py).
    supports_cuda_graphs: bool = False

    @abstractmethod
    def build_metadata(self, common: CommonAttentionMetadata) -> MetadataT:
        """Precompute, once per step, what `forward` needs in every layer."""

    def build_graph_metadata(
        self,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_tables: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_size: int,
        max_seq_len: int,
    ) -> MetadataT:
        """For backends that support CUDA graphs: decode-only metadata over a graph's static buffers
        (one query token per request; slot < 0 marks a padding row), valid for any contents of them."""
        raise NotImplementedError(f"the {self.name} attention backend does not support CUDA graphs")

    @abstractmethod
    def forward(
        self,
        spec: AttentionLayerSpec,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: KVCache,
        metadata: MetadataT,
    ) -> torch.Tensor:
        """q [T, num_heads * head_dim], k/v [T, num_kv_heads * head_dim]; kv_cache is this layer's
        (key_cache, value_cache), each [num_blocks, block_size, num_kv_heads, head_dim], in q's dtype or,
        when `spec.kv_quant` is set, uint8 fp8 bits to store and read through it.
        Returns [T, num_heads * head_dim]."""

    def forward_mla(
        self,
        spec: AttentionLayerSpec,
        q: torch.Tensor,
        latent: torch.Tensor,
        kv_cache: KVCache,
        metadata: MetadataT,
        projections: MLAProjections,
    ) -> torch.Tensor:
        """MLA: q [T, num_heads, qk_nope_head_dim + qk_rope_head_dim] (rotated), latent [T, head_dim] the
        step's latents and rotary keys to store; kv_cache (latent_cache,). Returns [T, num_heads, v_head_dim].

        Every token absorbed, through this backend's own paged kernel: multi-query attention whose key and
        value caches are the one latent cache, the output's first latent_dim values kept.
        NOTE: `forward` then stores each latent twice into the same slot (as K and as V, the same values
        and, for fp8, one scale: the layer's k_scale and v_scale are kept equal), a write of one token's
        latent per layer, for no change to the kernels."""
        assert spec.latent_dim is not None, "forward_mla is for MLA layers"
        num_tokens, num_heads, _ = q.shape
        cache = kv_cache[0]
        out = self.forward(
            spec, projections.absorb(q).reshape(num_tokens, -1), latent, latent, (cache, cache), metadata
        )
        return projections.project_out(out.view(num_tokens, num_heads, -1)[..., : spec.latent_dim])


# A backend held where its metadata type is not known (the model runner, the layers): its metadata
# goes from its own build_metadata, unread, to its own forward.
AnyAttentionBackend: TypeAlias = "AttentionBackend[Any]"
