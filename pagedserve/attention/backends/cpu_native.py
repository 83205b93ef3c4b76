"""CPU backend: decodes through the native paged-attention kernel, everything else as the torch backend.

The kernel reads each decode's K/V in place through its block table, where the torch backend first
gathers every request's K/V into a padded copy (per layer) and then reads that copy again. K/V writes
and prefill chunks (query length > 1) are the torch backend's, inherited from `SdpaPrefillBackend`.
"""

from dataclasses import dataclass

import torch

from pagedserve.attention.backends.base import AttentionLayerSpec, CommonAttentionMetadata
from pagedserve.attention.backends.torch_paged import SdpaPrefillBackend, read_kv
from pagedserve.kernels import cpu as cpu_kernels


@dataclass
class NativeDecodeMetadata:
    block_tables: torch.Tensor  # [num_decodes, max_blocks] int64
    seq_lens: torch.Tensor  # [num_decodes] int64


class CpuNativeAttentionBackend(SdpaPrefillBackend[NativeDecodeMetadata]):
    """Needs the native CPU kernels (`pagedserve.kernels.cpu.load_cpu_kernels()` without error);
    `attend_decodes` raises RuntimeError otherwise."""

    name = "cpu"

    def build_decode_metadata(self, common: CommonAttentionMetadata) -> NativeDecodeMetadata:
        nd = common.num_decodes
        return NativeDecodeMetadata(common.block_tables[:nd], torch.tensor(common.seq_lens[:nd]))

    def attend_decodes(
        self,
        spec: AttentionLayerSpec,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        decode: NativeDecodeMetadata,
    ) -> torch.Tensor:
        block_tables = decode.block_tables
        if spec.kv_quant is not None:
            # NOTE: the kernel reads q's dtype only: an fp8 cache is dequantized here, just the blocks these
            # decodes use, into a compact cache with renumbered block tables (a gather, as the torch
            # backend does; reading fp8 inside the kernel would save it).
            used, block_tables = torch.unique(block_tables, return_inverse=True)
            key_cache = read_kv(key_cache, used, spec, q.dtype)
            value_cache = read_kv(value_cache, used, spec, q.dtype, value=True)
        return cpu_kernels.paged_attention_decode(
            q,
            key_cache,
            value_cache,
            block_tables,
            decode.seq_lens,
            spec.scale,
            spec.sliding_window,
            spec.logits_soft_cap,
        )
