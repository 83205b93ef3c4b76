"""CPU backend: every query token of a step through the native paged-attention kernel.

Decodes, speculative verifications and prefill chunks alike, each token one query over its request's K/V
up to its own position, read in place through its block table (where the torch backend gathers each
decode's K/V into a padded copy per layer and attends each prefill chunk with SDPA). So a token's output
is the same bits however its prompt was cut into chunks and whatever shares its step: the kernel gives
each query one order of operations, fixed by its position (kernels/cpu/paged_attention.cpp). The
cache is always read back, so a cache that rounds (fp8, bfloat16 for a float32 model) is read as stored
even for a fresh prompt's own tokens. fp8 K/V are written by a native kernel in one pass, float K/V as
the torch backend writes them.
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
from pagedserve.attention.backends.torch_paged import write_kv
from pagedserve.kernels import cpu as cpu_kernels


@dataclass
class NativeAttentionMetadata(AttentionMetadata):
    slot_mapping: torch.Tensor  # [num_tokens] int64
    block_tables: torch.Tensor  # [num_reqs, max_blocks] int64
    query_start_loc: torch.Tensor  # [num_reqs + 1] int64
    seq_lens: torch.Tensor  # [num_reqs] int64
    attend_ends: torch.Tensor | None  # [num_tokens] int64: an image token's image end, else 0; None: none


class CpuNativeAttentionBackend(AttentionBackend[NativeAttentionMetadata]):
    """Needs the native CPU kernels (`pagedserve.kernels.cpu.load_cpu_kernels()` without error);
    `forward` raises RuntimeError otherwise."""

    name = "cpu"

    def build_metadata(self, common: CommonAttentionMetadata) -> NativeAttentionMetadata:
        return NativeAttentionMetadata(
            common.slot_mapping,
            common.block_tables,
            common.query_start_loc_tensor,
            common.seq_lens_tensor,
            _attend_ends(common) if common.bidirectional_spans else None,
        )

    def forward(
        self,
        spec: AttentionLayerSpec,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: KVCache,
        metadata: NativeAttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = q.shape[0]
        k = k.view(num_tokens, spec.num_kv_heads, spec.head_dim)
        v = v.view(num_tokens, spec.num_kv_heads, spec.head_dim)
        key_cache, value_cache = kv_cache
        quant = spec.kv_quant
        if quant is None:
            write_kv(key_cache, value_cache, k, v, metadata.slot_mapping, spec)
        else:
            cpu_kernels.reshape_and_cache_fp8(
                k,
                v,
                key_cache,
                value_cache,
                metadata.slot_mapping,
                quant.fp8_dtype,
                quant.k_scale,
                quant.v_scale,
            )
        return cpu_kernels.paged_attention(
            q.view(num_tokens, spec.num_heads, spec.head_dim),
            key_cache,
            value_cache,
            metadata.block_tables,
            metadata.seq_lens,
            spec.scale,
            spec.sliding_window,
            spec.logits_soft_cap,
            None if quant is None else (quant.fp8_dtype, quant.k_scale, quant.v_scale),
            query_start_loc=metadata.query_start_loc,
            sinks=spec.sinks,
            attend_ends=metadata.attend_ends,
        ).view(num_tokens, -1)


def _attend_ends(common: CommonAttentionMetadata) -> torch.Tensor:
    """Per query row, the end of its bidirectional span (its image's) when it lies in one, else 0."""
    ends = torch.zeros(common.query_start_loc[-1], dtype=torch.int64)
    for index, spans in common.bidirectional_spans.items():
        start_row, end_row = common.query_start_loc[index], common.query_start_loc[index + 1]
        first_position = common.seq_lens[index] - (end_row - start_row)
        for start, end in spans:
            rows = slice(start_row + max(start - first_position, 0), start_row + max(end - first_position, 0))
            ends[rows] = end
    return ends
