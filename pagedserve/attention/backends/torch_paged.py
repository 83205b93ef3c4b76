"""Plain-PyTorch paged attention: the reference every backend is tested against, and the CPU fallback.

Decodes (one query token each) are attended in one batched call over K/V gathered through their
block tables; each prefill chunk is attended with its own causal mask over its cached prefix. Layers with
a sliding window mask what lies outside it; a logits soft cap or attention sinks take the plain (non-SDPA)
computation.
Not batch-invariant: SDPA's sums follow the shape of a chunk, so a token's output moves (by float32
rounding) with where its prompt was cut; the cpu backend's kernel does not (docs/cpu.md).
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from pagedserve.attention.backends.base import (
    AttentionBackend,
    AttentionLayerSpec,
    AttentionMetadata,
    CommonAttentionMetadata,
    KVCache,
)
from pagedserve.attention.mla import MLAProjections
from pagedserve.utils import cdiv


@dataclass
class PrefillChunk:
    query_start: int
    query_end: int
    seq_len: int  # cached prefix + this chunk
    block_ids: torch.Tensor  # [num_blocks_of_request]
    bidirectional_spans: list[tuple[int, int]] = field(default_factory=list)  # see CommonAttentionMetadata
    _masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)  # per sliding window

    @property
    def context_len(self) -> int:
        return self.seq_len - (self.query_end - self.query_start)

    def mask(self, window: int | None) -> torch.Tensor | None:
        """[query_len, seq_len] bool (True = attend): causal, bottom-right aligned over the cached prefix,
        or within one bidirectional span; then within `window` (HF's Gemma 3 order); None when plain causal
        attention over the chunk alone is exact."""
        if window is not None and window >= self.seq_len:
            window = None  # the window cuts nothing
        if self.context_len == 0 and window is None and not self.bidirectional_spans:
            return None
        if window not in self._masks:
            device = self.block_ids.device
            rows = torch.arange(self.query_end - self.query_start, device=device)[:, None] + self.context_len
            cols = torch.arange(self.seq_len, device=device)[None, :]
            mask = cols <= rows
            for start, end in self.bidirectional_spans:
                mask |= (rows >= start) & (rows < end) & (cols >= start) & (cols < end)
            self._masks[window] = mask if window is None else mask & (cols > rows - window)
        return self._masks[window]


@dataclass
class GatherDecodeMetadata:
    block_tables: torch.Tensor  # [num_decodes, max_blocks]
    seq_lens: torch.Tensor  # [num_decodes, 1, 1, 1]
    span: torch.Tensor  # [max_blocks * block_size]: the position of each gathered slot
    _masks: dict[int | None, torch.Tensor] = field(default_factory=dict)  # per sliding window

    def mask(self, window: int | None) -> torch.Tensor:
        """[num_decodes, 1, 1, max_blocks * block_size] bool: True = attend."""
        if window not in self._masks:
            mask = self.span < self.seq_lens
            if window is not None:
                mask &= self.span >= self.seq_lens - window
            self._masks[window] = mask
        return self._masks[window]


@dataclass
class TorchAttentionMetadata(AttentionMetadata):
    slot_mapping: torch.Tensor  # [T]
    num_decode_tokens: int  # the first tokens: one per decode request, attended in one batched call
    decode: GatherDecodeMetadata
    prefills: list[PrefillChunk]


class TorchPagedAttentionBackend(AttentionBackend[TorchAttentionMetadata]):
    """K/V writes by slot mapping; decodes in one batched SDPA call over K/V gathered through their block
    tables (padded, masked); each prefill chunk through SDPA over its cached prefix."""

    name = "torch"

    def build_metadata(self, common: CommonAttentionMetadata) -> TorchAttentionMetadata:
        nd = common.num_decodes
        return TorchAttentionMetadata(
            common.slot_mapping,
            common.query_start_loc[nd],
            self.build_decode_metadata(common, nd),
            _prefill_chunks(common, nd),
        )

    def build_decode_metadata(
        self, common: CommonAttentionMetadata, num_requests: int
    ) -> GatherDecodeMetadata:
        device = common.slot_mapping.device
        nd = num_requests  # one token each
        decode_lens = common.seq_lens_tensor[:nd].view(nd, 1, 1, 1)
        max_decode_blocks = cdiv(max(common.seq_lens[:nd], default=0), common.block_size)
        span = torch.arange(max_decode_blocks * common.block_size, device=device)
        return GatherDecodeMetadata(common.block_tables[:nd, :max_decode_blocks], decode_lens, span)

    def attend_decodes(
        self,
        spec: AttentionLayerSpec,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        decode: GatherDecodeMetadata,
    ) -> torch.Tensor:
        nd = q.shape[0]
        keys = read_kv(key_cache, decode.block_tables, spec, q.dtype).view(
            nd, -1, spec.num_kv_heads, spec.head_dim
        )
        values = read_kv(value_cache, decode.block_tables, spec, q.dtype, value=True).view_as(keys)
        return attend(
            spec,
            q.unsqueeze(2),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            decode.mask(spec.sliding_window),
        ).squeeze(2)

    def forward(
        self,
        spec: AttentionLayerSpec,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: KVCache,
        metadata: TorchAttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = q.shape[0]
        q = q.view(num_tokens, spec.num_heads, spec.head_dim)
        k = k.view(num_tokens, spec.num_kv_heads, spec.head_dim)
        v = v.view(num_tokens, spec.num_kv_heads, spec.head_dim)
        key_cache, value_cache = kv_cache
        write_kv(key_cache, value_cache, k, v, metadata.slot_mapping, spec)
        nd = metadata.num_decode_tokens
        if nd == num_tokens:  # decodes only (every step of one user): no output buffer to copy into
            return self.attend_decodes(spec, q, key_cache, value_cache, metadata.decode).reshape(
                num_tokens, -1
            )
        out = torch.empty_like(q)
        if nd:
            out[:nd] = self.attend_decodes(spec, q[:nd], key_cache, value_cache, metadata.decode)
        for chunk in metadata.prefills:
            rows = slice(chunk.query_start, chunk.query_end)
            # NOTE: a cache that rounds (fp8, or bfloat16 for a float32 model) is read back even for a fresh
            # prompt, so that every token attends the same stored K/V whether its prompt was a cache hit,
            # chunked, recomputed or fresh (as the GPU kernels read everything from the cache).
            if chunk.context_len == 0 and key_cache.dtype == q.dtype:
                keys, values = k[rows], v[rows]
            else:
                keys = read_kv(key_cache, chunk.block_ids, spec, q.dtype).flatten(0, 1)[: chunk.seq_len]
                values = read_kv(value_cache, chunk.block_ids, spec, q.dtype, value=True).flatten(0, 1)[
                    : chunk.seq_len
                ]
            out[rows] = attend(
                spec,
                q[rows].transpose(0, 1),
                keys.transpose(0, 1),
                values.transpose(0, 1),
                chunk.mask(spec.sliding_window),
            ).transpose(0, 1)
        return out.view(num_tokens, -1)

    def forward_mla(
        self,
        spec: AttentionLayerSpec,
        q: torch.Tensor,
        latent: torch.Tensor,
        kv_cache: KVCache,
        metadata: TorchAttentionMetadata,
        projections: MLAProjections,
    ) -> torch.Tensor:
        """Decodes absorbed, over the gathered latents; each prefill chunk expanded: its context's latents
        into every head's K and V (at most the chunk's sequence, as chunking bounds it), then SDPA."""
        cache = kv_cache[0]
        write_latent(cache, latent, metadata.slot_mapping, spec)
        out = q.new_empty(*q.shape[:2], projections.w_uv.shape[1])
        nd = metadata.num_decode_tokens
        if nd:
            latents = read_kv(cache, metadata.decode.block_tables, spec, q.dtype).view(
                nd, 1, -1, spec.head_dim
            )
            attended = attend(
                spec,
                projections.absorb(q[:nd]).unsqueeze(2),
                latents,
                latents[..., : spec.latent_dim],
                metadata.decode.mask(None),
            )
            out[:nd] = projections.project_out(attended.squeeze(2))
        for chunk in metadata.prefills:
            rows = slice(chunk.query_start, chunk.query_end)
            # NOTE: read back from a cache that rounds, as `forward` does (the same tokens whatever the cut).
            if chunk.context_len == 0 and cache.dtype == q.dtype:
                context = latent[rows]
            else:
                context = read_kv(cache, chunk.block_ids, spec, q.dtype).view(-1, spec.head_dim)[
                    : chunk.seq_len
                ]
            keys, values = projections.expand(context)
            out[rows] = attend(
                spec, q[rows].transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1), chunk.mask(None)
            ).transpose(0, 1)
        return out


def attend(
    spec: AttentionLayerSpec,
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """q [..., num_heads, Tq, D], keys/values [..., num_kv_heads, Tk, D]; mask broadcastable to
    [..., Tq, Tk] (True = attend), None = causal. Returns [..., num_heads, Tq, D]."""
    cap, sinks = spec.logits_soft_cap, spec.sinks
    if cap is None and sinks is None:
        # NOTE: 4-D inputs: torch's CPU flash kernel takes only those, 3-D ones (a prefill chunk's
        # [heads, T, D]) fall back to the math path, 2-2.5x slower (measured on SmolLM2's prompt lengths).
        batched = q.dim() == 3
        out = F.scaled_dot_product_attention(
            q[None] if batched else q,
            keys[None] if batched else keys,
            values[None] if batched else values,
            attn_mask=mask,
            is_causal=mask is None,
            scale=spec.scale,
            enable_gqa=True,
        )
        return out[0] if batched else out
    # NOTE: SDPA has neither soft caps nor sinks: the plain computation, softmax in float32 as HF's eager
    # Gemma 2 and gpt-oss.
    group = q.shape[-3] // keys.shape[-3]
    keys, values = keys.repeat_interleave(group, dim=-3), values.repeat_interleave(group, dim=-3)
    scores = q @ keys.transpose(-1, -2) * spec.scale
    if cap is not None:
        scores = torch.tanh(scores / cap) * cap
    if mask is None:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf")).float()
    if sinks is None:
        return torch.softmax(scores, dim=-1).to(q.dtype) @ values
    # The sink joins each row's softmax as one more logit and is dropped after: its value is zero.
    sink_column = sinks.float().view(-1, 1, 1).expand(*scores.shape[:-1], 1)
    probs = torch.softmax(torch.cat([scores, sink_column], dim=-1), dim=-1)[..., :-1]
    return probs.to(q.dtype) @ values


def _prefill_chunks(common: CommonAttentionMetadata, first: int) -> list[PrefillChunk]:
    """One chunk per request from `first` on (its masks are made on first use, per window)."""
    prefills = []
    for i in range(first, len(common.seq_lens)):
        start, end, seq_len = common.query_start_loc[i], common.query_start_loc[i + 1], common.seq_lens[i]
        num_blocks = cdiv(seq_len, common.block_size)
        spans = common.bidirectional_spans.get(i, [])
        prefills.append(PrefillChunk(start, end, seq_len, common.block_tables[i, :num_blocks], spans))
    return prefills


def write_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
    spec: AttentionLayerSpec,
) -> None:
    """Store token i's K/V at slot slot_mapping[i] (block_id * block_size + offset), as fp8 bits when
    the layer's cache is quantized."""
    quant = spec.kv_quant
    if quant is not None:
        k, v = quant.quantize(k, quant.k_scale), quant.quantize(v, quant.v_scale)
    # NOTE: cast to the cache's dtype (bfloat16 for a float32 model: --kv-cache-dtype bfloat16; else a no-op)
    key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, slot_mapping, k.to(key_cache.dtype))
    value_cache.view(-1, *value_cache.shape[2:]).index_copy_(0, slot_mapping, v.to(value_cache.dtype))


def write_latent(
    cache: torch.Tensor, latent: torch.Tensor, slot_mapping: torch.Tensor, spec: AttentionLayerSpec
) -> None:
    """Store token i's MLA latent [head_dim] at slot slot_mapping[i] (fp8 bits with the layer's k_scale)."""
    quant = spec.kv_quant
    stored = latent if quant is None else quant.quantize(latent, quant.k_scale)
    cache.view(-1, cache.shape[-1]).index_copy_(0, slot_mapping, stored.to(cache.dtype))


def read_kv(
    cache: torch.Tensor,
    block_ids: torch.Tensor,
    spec: AttentionLayerSpec,
    dtype: torch.dtype,
    value: bool = False,
) -> torch.Tensor:
    """cache[block_ids] (K, or V with `value`) in `dtype`, dequantized when the layer's cache is fp8."""
    blocks = cache[block_ids]
    quant = spec.kv_quant
    if quant is None:
        return blocks.to(dtype)  # a bfloat16 cache of a float32 model (no copy when they match)
    return quant.dequantize(blocks, quant.v_scale if value else quant.k_scale, dtype)
