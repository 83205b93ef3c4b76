"""The Attention layer models use: q/k/v in, attention over the paged cache out."""

import torch
from torch import nn

from pagedserve.attention.backends.base import AnyAttentionBackend, AttentionLayerSpec, KVCache
from pagedserve.attention.forward_context import get_attention_metadata
from pagedserve.attention.mla import MLAProjections

# The pooling runner's dense backend reads no cache; its layers get this empty pair (never read).
NO_KV_CACHE = (torch.empty(0), torch.empty(0))


class Attention(nn.Module):
    """Delegates to the engine's backend; `kv_cache` (and `kv_cache_group`, whose block tables the layer
    reads) are bound by the model runner."""

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scale: float,
        num_kv_heads: int,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
        sinks: torch.Tensor | None = None,
        latent_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.spec = AttentionLayerSpec(
            num_heads,
            num_kv_heads,
            head_dim,
            scale,
            sliding_window,
            logits_soft_cap,
            sinks,
            latent_dim=latent_dim,
        )
        self.backend: AnyAttentionBackend | None = None
        self.kv_cache: KVCache | None = None
        self.kv_cache_group = 0
        # (k_scale, v_scale) shipped in an fp8 checkpoint (model_loader/kv_scales.py), else None
        self.checkpoint_kv_scales: tuple[float, float] | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        assert self.backend is not None and self.kv_cache is not None, "KV cache not bound"
        spec, quant = self.spec, self.spec.kv_quant
        if quant is not None:  # fp8 cache: keys rotated (attention/kv_quant.py says why)
            if quant.scales_pending:  # --calculate-kv-scales: from the first batch
                quant.calculate_scales(k, v, spec.num_kv_heads, spec.head_dim, spec.logits_soft_cap is None)
            q, k = quant.transform(q, k, spec.num_kv_heads, spec.head_dim)
        return self.backend.forward(spec, q, k, v, self.kv_cache, get_attention_metadata(self.kv_cache_group))

    def forward_latent(
        self, q: torch.Tensor, latent: torch.Tensor, projections: MLAProjections
    ) -> torch.Tensor:
        """MLA (`latent_dim` set; attention/mla.py): q [T, heads, nope + rope] and the step's latents
        [T, head_dim] -> [T, heads * v_head_dim]. An fp8 cache stores latents unrotated, with one scale."""
        assert self.backend is not None and self.kv_cache is not None, "KV cache not bound"
        quant = self.spec.kv_quant
        if quant is not None and quant.scales_pending:  # --calculate-kv-scales: one scale, K = V = latent
            quant.calculate_scales(latent, latent, 1, self.spec.head_dim, shift_invariant=False)
        metadata = get_attention_metadata(self.kv_cache_group)
        out = self.backend.forward_mla(self.spec, q, latent, self.kv_cache, metadata, projections)
        return out.reshape(q.shape[0], -1)
