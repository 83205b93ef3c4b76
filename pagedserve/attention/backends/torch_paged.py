"""Plain-PyTorch paged attention: the reference every backend is tested against, and the CPU fallback.

Decodes (one query token each) are attended in one batched call over K/V gathered through their
block tables; each prefill chunk is attended with its own causal mask over its cached prefix.
`SdpaPrefillBackend` (K/V writes and prefill chunks) is shared with backends that only replace decodes.
"""
from abc import abstractmethod
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch
import torch.nn.functional as F

from pagedserve.attention.backends.base import (AttentionBackend, AttentionLayerSpec, AttentionMetadata,
                                                CommonAttentionMetadata)
from pagedserve.utils import cdiv


@dataclass
class PrefillChunk:
    query_start: int
    query_end: int
    seq_len: int  # cached prefix + this chunk
    block_ids: torch.Tensor  # [num_blocks_of_request]
    causal_mask: torch.Tensor | None  # [query_len, seq_len] bool; None: plain causal, no prefix


@dataclass
class GatherDecodeMetadata:
    block_tables: torch.Tensor  # [num_decodes, max_blocks]
    mask: torch.Tensor  # [num_decodes, 1, 1, max_blocks * block_size] bool: True = attend


DecodeT = TypeVar("DecodeT")


@dataclass
class TorchAttentionMetadata(AttentionMetadata, Generic[DecodeT]):
    slot_mapping: torch.Tensor  # [T]
    num_decodes: int
    decode: DecodeT  # built by the backend's `build_decode_metadata`, read by its `attend_decodes`
    prefills: list[PrefillChunk]


class SdpaPrefillBackend(AttentionBackend[TorchAttentionMetadata[DecodeT]], Generic[DecodeT]):
    """K/V writes by slot mapping and prefill chunks through torch SDPA; subclasses say how decodes
    (the first `num_decodes` requests, one query token each) are attended."""

    def build_metadata(self, common: CommonAttentionMetadata) -> TorchAttentionMetadata[DecodeT]:
        return TorchAttentionMetadata(common.slot_mapping, common.num_decodes,
                                      self.build_decode_metadata(common), _prefill_chunks(common))

    @abstractmethod
    def build_decode_metadata(self, common: CommonAttentionMetadata) -> DecodeT:
        """Once per step: what `attend_decodes` needs for the first `common.num_decodes` requests."""

    @abstractmethod
    def attend_decodes(self, spec: AttentionLayerSpec, q: torch.Tensor, key_cache: torch.Tensor,
                       value_cache: torch.Tensor, decode: DecodeT) -> torch.Tensor:
        """q [num_decodes, num_heads, head_dim], one token per request, whose K/V (this step's
        included) is already in the cache. Returns [num_decodes, num_heads, head_dim]."""

    def forward(self, spec: AttentionLayerSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], metadata: TorchAttentionMetadata[DecodeT]
                ) -> torch.Tensor:
        num_tokens = q.shape[0]
        q = q.view(num_tokens, spec.num_heads, spec.head_dim)
        k = k.view(num_tokens, spec.num_kv_heads, spec.head_dim)
        v = v.view(num_tokens, spec.num_kv_heads, spec.head_dim)
        key_cache, value_cache = kv_cache
        write_kv(key_cache, value_cache, k, v, metadata.slot_mapping)
        out = torch.empty_like(q)
        nd = metadata.num_decodes
        if nd:
            out[:nd] = self.attend_decodes(spec, q[:nd], key_cache, value_cache, metadata.decode)
        for chunk in metadata.prefills:
            rows = slice(chunk.query_start, chunk.query_end)
            if chunk.causal_mask is None:
                keys, values = k[rows], v[rows]
            else:
                keys = key_cache[chunk.block_ids].flatten(0, 1)[: chunk.seq_len]
                values = value_cache[chunk.block_ids].flatten(0, 1)[: chunk.seq_len]
            out[rows] = F.scaled_dot_product_attention(
                q[rows].transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
                attn_mask=chunk.causal_mask, is_causal=chunk.causal_mask is None, scale=spec.scale,
                enable_gqa=True).transpose(0, 1)
        return out.view(num_tokens, -1)


class TorchPagedAttentionBackend(SdpaPrefillBackend[GatherDecodeMetadata]):
    """Decodes in one batched SDPA call over K/V gathered through their block tables (padded, masked)."""

    name = "torch"

    def build_decode_metadata(self, common: CommonAttentionMetadata) -> GatherDecodeMetadata:
        device = common.slot_mapping.device
        nd = common.num_decodes
        decode_lens = torch.tensor(common.seq_lens[:nd], device=device)
        max_decode_blocks = cdiv(max(common.seq_lens[:nd], default=0), common.block_size)
        span = torch.arange(max_decode_blocks * common.block_size, device=device)
        mask = (span[None, :] < decode_lens[:, None]).view(nd, 1, 1, span.numel())
        return GatherDecodeMetadata(common.block_tables[:nd, :max_decode_blocks], mask)

    def attend_decodes(self, spec: AttentionLayerSpec, q: torch.Tensor, key_cache: torch.Tensor,
                       value_cache: torch.Tensor, decode: GatherDecodeMetadata) -> torch.Tensor:
        nd = q.shape[0]
        keys = key_cache[decode.block_tables].view(nd, -1, spec.num_kv_heads, spec.head_dim)
        values = value_cache[decode.block_tables].view_as(keys)
        return F.scaled_dot_product_attention(
            q.unsqueeze(2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=decode.mask,
            scale=spec.scale, enable_gqa=True).squeeze(2)


def _prefill_chunks(common: CommonAttentionMetadata) -> list[PrefillChunk]:
    """One chunk per request after the decodes, with its causal mask over any cached prefix."""
    device = common.slot_mapping.device
    prefills = []
    for i in range(common.num_decodes, len(common.seq_lens)):
        start, end, seq_len = common.query_start_loc[i], common.query_start_loc[i + 1], common.seq_lens[i]
        num_blocks = cdiv(seq_len, common.block_size)
        context = seq_len - (end - start)
        mask = None
        if context > 0:  # bottom-right aligned causal mask over the cached prefix
            rows = torch.arange(end - start, device=device)[:, None] + context
            mask = torch.arange(seq_len, device=device)[None, :] <= rows
        prefills.append(PrefillChunk(start, end, seq_len, common.block_tables[i, :num_blocks], mask))
    return prefills


def write_kv(key_cache: torch.Tensor, value_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store token i's K/V at slot slot_mapping[i] (block_id * block_size + offset)."""
    key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, slot_mapping, k)
    value_cache.view(-1, *value_cache.shape[2:]).index_copy_(0, slot_mapping, v)
