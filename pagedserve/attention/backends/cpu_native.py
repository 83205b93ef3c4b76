"""CPU backend: decodes through the native paged-attention kernel, everything else as the torch backend.

The kernel reads each decode's K/V in place through its block table, where the torch backend first
gathers every request's K/V into a padded copy (per layer) and then reads that copy again; an fp8 cache
too (its bits widened and scaled as they are read), and its K/V are
written by a native kernel in one pass. Short chunks right after the decodes (a speculative step's
verification: 1 + k tokens over a long context) go through the kernel too, each token one query up to its
own position. Float K/V writes and longer prefill chunks are the torch backend's, inherited from
`SdpaPrefillBackend`.
"""

from dataclasses import dataclass

import torch

from pagedserve.attention.backends.base import AttentionLayerSpec, CommonAttentionMetadata
from pagedserve.attention.backends.torch_paged import KVPair, SdpaPrefillBackend
from pagedserve.kernels import cpu as cpu_kernels

# The longest chunk whose tokens are attended by the decode kernel, one query each. The kernel reads the
# request's K/V once per query (from L2 after the first), where the torch path first gathers a copy of it
# and masks; measured per layer on SmolLM2's geometry (benchmarks/cpu_attention.py --chunk-lens), the kernel
# is 2-9x faster for chunks of 2-32 tokens over 100-1000 cached ones, and still 1.2-1.9x at 48-64.
MAX_KERNEL_CHUNK = 32


@dataclass
class NativeDecodeMetadata:
    block_tables: torch.Tensor  # [num_decode_tokens, max_blocks] int64: each token's request's table
    seq_lens: torch.Tensor  # [num_decode_tokens] int64: the K/V each token attends to (its position + 1)


class CpuNativeAttentionBackend(SdpaPrefillBackend[NativeDecodeMetadata]):
    """Needs the native CPU kernels (`pagedserve.kernels.cpu.load_cpu_kernels()` without error);
    `attend_decodes` raises RuntimeError otherwise."""

    name = "cpu"

    def num_decode_requests(self, common: CommonAttentionMetadata) -> int:
        """The decodes and the run of short chunks over a cached prefix after them (the model runner puts
        verifications there). A fresh prompt stays with SDPA, which attends its own K/V as computed (the
        torch backend's rule, exact even over an fp8 cache)."""
        starts, n = common.query_start_loc, common.num_decodes
        while n < len(common.seq_lens):
            query_len = starts[n + 1] - starts[n]
            if query_len > MAX_KERNEL_CHUNK or query_len == common.seq_lens[n]:
                break
            n += 1
        return n

    def build_decode_metadata(
        self, common: CommonAttentionMetadata, num_requests: int
    ) -> NativeDecodeMetadata:
        starts = common.query_start_loc
        if num_requests == common.num_decodes:  # one token each: the tables as they are
            return NativeDecodeMetadata(
                common.block_tables[:num_requests], torch.tensor(common.seq_lens[:num_requests])
            )
        rows: list[int] = []
        seq_lens: list[int] = []
        for i in range(num_requests):
            query_len = starts[i + 1] - starts[i]
            rows += [i] * query_len
            seq_lens += range(common.seq_lens[i] - query_len + 1, common.seq_lens[i] + 1)
        return NativeDecodeMetadata(common.block_tables[rows], torch.tensor(seq_lens))

    def store_kv(self, spec: AttentionLayerSpec, cache: KVPair, new: KVPair, slots: torch.Tensor) -> None:
        quant = spec.kv_quant
        if quant is None:
            super().store_kv(spec, cache, new, slots)
        else:
            cpu_kernels.reshape_and_cache_fp8(
                *new, *cache, slots, quant.fp8_dtype, quant.k_scale, quant.v_scale
            )

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
            None if quant is None else (quant.fp8_dtype, quant.k_scale, quant.v_scale),
        )
