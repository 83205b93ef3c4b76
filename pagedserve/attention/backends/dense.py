"""Attention with no KV cache, for the pooling runner: each prompt of the batch attends over its own
tokens in one call (bidirectional for encoders, causal for decoder embedders), padded into a
[requests, heads, longest, head_dim] batch for torch's scaled_dot_product_attention. Nothing is stored:
a pooling request is computed once and never decodes. (Measured on CPU at batch 64, mixed lengths: one
call per prompt, or per group of similar lengths, was no faster: the calls and gathers cost what the
padding saved.)"""

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


@dataclass
class DenseAttentionMetadata(AttentionMetadata):
    """`rows[t]`: flattened token t's row in the padded [num_reqs * max_len] batch; `sources[r]`: the
    flattened token padded row r copies (a padding row copies its prompt's last token: finite, masked out
    as a key, and its output is dropped, so its value never matters, and one gather pads with no fill);
    `mask` [num_reqs, 1, max_len, max_len] (True: attend), None when every prompt has the same length."""

    rows: torch.Tensor
    sources: torch.Tensor
    num_reqs: int
    max_len: int
    mask: torch.Tensor | None
    causal: bool
    additive_masks: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def build(cls, seq_lens: list[int], causal: bool, device: torch.device) -> "DenseAttentionMetadata":
        max_len = max(seq_lens)
        lens = torch.tensor(seq_lens, device=device)
        pos = torch.arange(max_len, device=device)
        rows = (torch.arange(len(seq_lens), device=device)[:, None] * max_len + pos)[pos < lens[:, None]]
        starts = torch.cumsum(lens, 0) - lens
        sources = (starts[:, None] + torch.minimum(pos[None, :], lens[:, None] - 1)).flatten()
        mask = None
        if min(seq_lens) != max_len:
            mask = (pos[None, None, :] < lens[:, None, None]).expand(-1, max_len, -1)
            if causal:
                mask = mask & (pos[None, :, None] >= pos[None, None, :])
            mask = mask.unsqueeze(1)
        return cls(rows, sources, len(seq_lens), max_len, mask, causal)

    def attn_mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        """The mask as 0 / -inf in `dtype`, built once per step rather than converted by every layer."""
        if self.mask is None:
            return None
        if dtype not in self.additive_masks:
            zeros = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device)
            self.additive_masks[dtype] = zeros.masked_fill_(~self.mask, float("-inf"))
        return self.additive_masks[dtype]

    def pad(self, x: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
        """[T, heads * head_dim] -> [num_reqs, heads, max_len, head_dim]."""
        if self.mask is not None:  # else equal lengths: the flat batch is already [num_reqs, max_len] rows
            x = x.index_select(0, self.sources)
        return x.view(self.num_reqs, self.max_len, num_heads, head_dim).transpose(1, 2)

    def unpad(self, out: torch.Tensor) -> torch.Tensor:
        """[num_reqs, heads, max_len, head_dim] -> [T, heads * head_dim]."""
        flat = out.transpose(1, 2).reshape(self.num_reqs * self.max_len, -1)
        return flat if self.mask is None else flat.index_select(0, self.rows)


class DenseAttentionBackend(AttentionBackend[DenseAttentionMetadata]):
    """Reads no cache (the pooling runner binds none); its metadata comes from `DenseAttentionMetadata.build`."""

    name = "dense"

    def build_metadata(self, common: CommonAttentionMetadata) -> DenseAttentionMetadata:
        raise NotImplementedError("the pooling runner builds DenseAttentionMetadata itself")

    def forward(
        self,
        spec: AttentionLayerSpec,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: KVCache,
        metadata: DenseAttentionMetadata,
    ) -> torch.Tensor:
        out = F.scaled_dot_product_attention(
            metadata.pad(q, spec.num_heads, spec.head_dim),
            metadata.pad(k, spec.num_kv_heads, spec.head_dim),
            metadata.pad(v, spec.num_kv_heads, spec.head_dim),
            attn_mask=metadata.attn_mask(q.dtype),
            is_causal=metadata.causal and metadata.mask is None,
            scale=spec.scale,
            enable_gqa=spec.num_kv_heads != spec.num_heads,
        )
        return metadata.unpad(out)
