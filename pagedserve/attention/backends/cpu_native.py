"""CPU backend: decodes through the native paged-attention kernel, everything else as the torch backend.

The kernel reads each decode's K/V in place through its block table, where the torch backend first
gathers every request's K/V into a padded copy (per layer) and then reads that copy again; an fp8 cache
too (each value widened through a table of its format's 256 values times the scale), and its K/V are
written by a native kernel in one pass. Float K/V writes and prefill chunks (query length > 1) are the
torch backend's, inherited from `SdpaPrefillBackend`.
"""

from dataclasses import dataclass

import torch

from pagedserve.attention.backends.base import AttentionLayerSpec, CommonAttentionMetadata
from pagedserve.attention.backends.torch_paged import KVPair, SdpaPrefillBackend
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

    def store_kv(self, spec: AttentionLayerSpec, cache: KVPair, new: KVPair, slots: torch.Tensor) -> None:
        quant = spec.kv_quant
        if quant is None:
            super().store_kv(spec, cache, new, slots)
        else:
            table = quant.value_table()
            cpu_kernels.reshape_and_cache_fp8(*new, *cache, slots, table, quant.k_scale, quant.v_scale)

    def attend_decodes(
        self,
        spec: AttentionLayerSpec,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        decode: NativeDecodeMetadata,
    ) -> torch.Tensor:
        quant = spec.kv_quant
        return cpu_kernels.paged_attention_decode(
            q,
            key_cache,
            value_cache,
            decode.block_tables,
            decode.seq_lens,
            spec.scale,
            spec.sliding_window,
            spec.logits_soft_cap,
            None if quant is None else (quant.value_table(quant.k_scale), quant.value_table(quant.v_scale)),
        )
