"""Attention with no KV cache, for the pooling runner: each prompt of the batch attends over its own
tokens in one call (bidirectional for encoders, causal for decoder embedders), padded into a
[requests, heads, longest, head_dim] batch for torch's scaled_dot_product_attention. Nothing is stored:
a pooling request is computed once and never decodes. (Measured on CPU at batch 64, mixed lengths: one
call per prompt, or per group of similar lengths, was no faster: the calls and gathers cost what the
padding saved.)"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagedserve.attention.backends.base import (
    AttentionBackend,
    AttentionLayerSpec,
    AttentionMetadata,
    CommonAttentionMetadata,
)


@dataclass
class DenseAttentionMetadata(AttentionMetadata):
    """`rows[t]`: flattened token t's row in the padded [num_reqs * max_len] batch; `mask`
    [num_reqs, 1, max_len, max_len] (True: attend), None when every prompt has the same length."""

    rows: torch.Tensor
    num_reqs: int
    max_len: int
    mask: torch.Tensor | None
    causal: bool

    @classmethod
    def build(cls, seq_lens: list[int], causal: bool, device: torch.device) -> "DenseAttentionMetadata":
        max_len = max(seq_lens)
        lens = torch.tensor(seq_lens, device=device)
        rows = torch.cat([i * max_len + torch.arange(n, device=device) for i, n in enumerate(seq_lens)])
        mask = None
        if min(seq_lens) != max_len:
            pos = torch.arange(max_len, device=device)
            mask = (pos[None, None, :] < lens[:, None, None]).expand(-1, max_len, -1)
            if causal:
                mask = mask & (pos[None, :, None] >= pos[None, None, :])
            mask = mask.unsqueeze(1)
        return cls(rows, len(seq_lens), max_len, mask, causal)

    def pad(self, x: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
        """[T, heads * head_dim] -> [num_reqs, heads, max_len, head_dim] (padding rows are zero)."""
        if self.mask is None:  # equal lengths: the flat batch is already [num_reqs, max_len] rows
            return x.view(self.num_reqs, self.max_len, num_heads, head_dim).transpose(1, 2)
        padded = x.new_zeros(self.num_reqs * self.max_len, num_heads * head_dim)
        padded[self.rows] = x
        return padded.view(self.num_reqs, self.max_len, num_heads, head_dim).transpose(1, 2)

    def unpad(self, out: torch.Tensor) -> torch.Tensor:
        """[num_reqs, heads, max_len, head_dim] -> [T, heads * head_dim]."""
        flat = out.transpose(1, 2).reshape(self.num_reqs * self.max_len, -1)
        return flat if self.mask is None else flat[self.rows]


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
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: DenseAttentionMetadata,
    ) -> torch.Tensor:
        out = F.scaled_dot_product_attention(
            metadata.pad(q, spec.num_heads, spec.head_dim),
            metadata.pad(k, spec.num_kv_heads, spec.head_dim),
            metadata.pad(v, spec.num_kv_heads, spec.head_dim),
            attn_mask=metadata.mask,
            is_causal=metadata.causal and metadata.mask is None,
            scale=spec.scale,
            enable_gqa=spec.num_kv_heads != spec.num_heads,
        )
        return metadata.unpad(out)
