"""Plain-PyTorch paged attention: the reference backend, and the CPU path.

Decodes (one query token each) are attended in one batched call over K/V gathered through their
block tables; each prefill chunk is attended with its own causal mask over its cached prefix.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagedserve.attention.backends.base import (AttentionBackend, AttentionLayerSpec,
                                                CommonAttentionMetadata)


@dataclass
class PrefillChunk:
    query_start: int
    query_end: int
    seq_len: int  # cached prefix + this chunk
    block_ids: torch.Tensor  # [num_blocks_of_request]
    causal_mask: torch.Tensor | None  # [query_len, seq_len] bool; None: plain causal, no prefix


@dataclass
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor  # [T]
    num_decodes: int
    decode_block_tables: torch.Tensor  # [num_decodes, max_blocks]
    decode_mask: torch.Tensor  # [num_decodes, 1, 1, max_blocks * block_size] bool: True = attend
    prefills: list[PrefillChunk]


class TorchPagedAttentionBackend(AttentionBackend):
    name = "torch"

    def build_metadata(self, common: CommonAttentionMetadata) -> TorchAttentionMetadata:
        device = common.slot_mapping.device
        nd = common.num_decodes
        decode_lens = torch.tensor(common.seq_lens[:nd], device=device)
        max_decode_blocks = -(-max(common.seq_lens[:nd], default=0) // common.block_size)
        decode_tables = common.block_tables[:nd, :max_decode_blocks]
        span = torch.arange(max_decode_blocks * common.block_size, device=device)
        decode_mask = (span[None, :] < decode_lens[:, None]).view(nd, 1, 1, span.numel())
        prefills = []
        for i in range(nd, len(common.seq_lens)):
            start, end, seq_len = common.query_start_loc[i], common.query_start_loc[i + 1], common.seq_lens[i]
            num_blocks = -(-seq_len // common.block_size)
            context = seq_len - (end - start)
            mask = None
            if context > 0:  # bottom-right aligned causal mask over the cached prefix
                rows = torch.arange(end - start, device=device)[:, None] + context
                mask = torch.arange(seq_len, device=device)[None, :] <= rows
            prefills.append(PrefillChunk(start, end, seq_len, common.block_tables[i, :num_blocks], mask))
        return TorchAttentionMetadata(common.slot_mapping, nd, decode_tables, decode_mask, prefills)

    def forward(self, spec: AttentionLayerSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], metadata: TorchAttentionMetadata
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
            keys = key_cache[metadata.decode_block_tables].view(nd, -1, spec.num_kv_heads, spec.head_dim)
            values = value_cache[metadata.decode_block_tables].view_as(keys)
            out[:nd] = F.scaled_dot_product_attention(
                q[:nd].unsqueeze(2), keys.transpose(1, 2), values.transpose(1, 2),
                attn_mask=metadata.decode_mask, scale=spec.scale, enable_gqa=True).squeeze(2)
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


def write_kv(key_cache: torch.Tensor, value_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store token i's K/V at slot slot_mapping[i] (block_id * block_size + offset)."""
    key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, slot_mapping, k)
    value_cache.view(-1, *value_cache.shape[2:]).index_copy_(0, slot_mapping, v)
