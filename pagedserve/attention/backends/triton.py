"""Triton backend (CUDA): K/V writes and attention over block tables in Triton kernels, one launch per
layer for the whole mixed batch (prefill chunks and decodes), split-K for decodes over long contexts.

Its decode-only metadata has a fixed shape for a given batch size, so decode steps can be captured
in CUDA graphs (`worker/cuda_graph.py`): `build_graph_metadata` builds it over static buffers.
"""

from dataclasses import dataclass

import torch

from pagedserve.attention.backends.base import (
    AttentionBackend,
    AttentionLayerSpec,
    AttentionMetadata,
    CommonAttentionMetadata,
    KVCache,
)
from pagedserve.kernels.triton import PagedBatch, choose_num_splits, paged_attention, reshape_and_cache


@dataclass
class TritonAttentionMetadata(AttentionMetadata):
    slot_mapping: torch.Tensor  # [T] int64; < 0: a padding token whose K/V is not written
    batch: PagedBatch


class TritonAttentionBackend(AttentionBackend[TritonAttentionMetadata]):
    name = "triton"
    supports_cuda_graphs = True

    def build_metadata(self, common: CommonAttentionMetadata) -> TritonAttentionMetadata:
        decode_only = common.num_decodes == len(common.seq_lens)
        batch = PagedBatch(
            query_start_loc=common.query_start_loc_tensor,
            seq_lens=common.seq_lens_tensor,
            block_tables=common.block_tables,
            block_size=common.block_size,
            num_splits=choose_num_splits(len(common.seq_lens), max(common.seq_lens), decode_only),
            decode_only=decode_only,
            query_start_loc_host=common.query_start_loc,
        )
        return TritonAttentionMetadata(common.slot_mapping, batch)

    def build_graph_metadata(
        self,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_tables: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_size: int,
        max_seq_len: int,
    ) -> TritonAttentionMetadata:
        """The kernels read whatever the buffers hold at replay. Split-K is sized for `max_seq_len`,
        since the lengths change between replays of the same graph."""
        num_requests = seq_lens.shape[0]
        batch = PagedBatch(
            query_start_loc,
            seq_lens,
            block_tables,
            block_size,
            choose_num_splits(num_requests, max_seq_len, decode_only=True),
            decode_only=True,
        )
        return TritonAttentionMetadata(slot_mapping, batch)

    def forward(
        self,
        spec: AttentionLayerSpec,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: KVCache,
        metadata: TritonAttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = q.shape[0]
        q = q.view(num_tokens, spec.num_heads, spec.head_dim)
        key_cache, value_cache = kv_cache
        # The fp8 KV cache holds the fp8 bits as uint8: viewed in its format, read through its scales.
        k_scale = v_scale = 1.0
        quant = spec.kv_quant
        if quant is not None:
            key_cache, value_cache = key_cache.view(quant.fp8_dtype), value_cache.view(quant.fp8_dtype)
            k_scale, v_scale = quant.k_scale, quant.v_scale
        reshape_and_cache(
            k.view(num_tokens, spec.num_kv_heads, spec.head_dim),
            v.view(num_tokens, spec.num_kv_heads, spec.head_dim),
            key_cache,
            value_cache,
            metadata.slot_mapping,
            k_scale,
            v_scale,
        )
        out = torch.empty_like(q)
        paged_attention(
            out,
            q,
            key_cache,
            value_cache,
            metadata.batch,
            spec.scale,
            spec.sliding_window,
            spec.logits_soft_cap,
            k_scale,
            v_scale,
            spec.sinks,
        )
        return out.view(num_tokens, -1)
