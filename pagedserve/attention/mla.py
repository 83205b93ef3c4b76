"""Multi-head latent attention (MLA, DeepSeek V2/V3): the cache holds, per token, one latent c of
kv_lora_rank values and one rotary key k_pe shared by every head; each head's key is (c W_UK_h, k_pe) and
its value c W_UV_h, with W_UK and W_UV the two parts of the layer's kv_b_proj.

Two ways to attend, with equal results in exact arithmetic:
- absorbed (vLLM's MLA decode): q_h . k_h = (q_nope_h W_UK_h) . c + q_pe_h . k_pe, so a query absorbed
  into the latent space attends over the cached latents directly, as multi-query attention with one KV
  head of kv_lora_rank + qk_rope_head_dim values whose value is its first kv_lora_rank; W_UV is applied to
  the output after. Nothing is expanded: the cost per cached token is one dot product per head.
- expanded (prefill): the latents of a chunk's context are expanded into every head's K and V, bounded by
  the chunk's length, and attended as plain multi-head attention.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

# x [T, K], weight [N, K] -> x weight^T [T, N]: the model's matmul (row-invariant on CPU in float32).
Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class MLAProjections:
    """This rank's heads' halves of kv_b_proj: w_uk [heads, qk_nope_head_dim, kv_lora_rank], its transpose
    w_uk_t, and w_uv [heads, v_head_dim, kv_lora_rank]; `linear` multiplies each head's rows, so that a
    token's absorbed query and output do not depend on the rows beside it (a batched matmul's do)."""

    w_uk: torch.Tensor
    w_uk_t: torch.Tensor
    w_uv: torch.Tensor
    linear: Linear

    @classmethod
    def of(cls, kv_b: torch.Tensor, qk_nope_head_dim: int, linear: Linear) -> "MLAProjections":
        """From kv_b_proj's matrix per head [heads, qk_nope_head_dim + v_head_dim, kv_lora_rank]."""
        w_uk = kv_b[:, :qk_nope_head_dim].contiguous()
        return cls(w_uk, w_uk.transpose(1, 2).contiguous(), kv_b[:, qk_nope_head_dim:].contiguous(), linear)

    @property
    def kv_lora_rank(self) -> int:
        return self.w_uk.shape[-1]

    def absorb(self, q: torch.Tensor) -> torch.Tensor:
        """q [T, heads, nope + rope] -> [T, heads, kv_lora_rank + rope]: (q_nope W_UK, q_pe)."""
        nope = self.w_uk.shape[1]
        return torch.cat((self._per_head(q[..., :nope], self.w_uk_t), q[..., nope:]), dim=-1)

    def project_out(self, out: torch.Tensor) -> torch.Tensor:
        """Attention over latents [T, heads, kv_lora_rank] -> each head's value space [T, heads, v]."""
        return self._per_head(out, self.w_uv)

    def expand(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached latents [S, kv_lora_rank + rope] -> every head's keys [S, heads, nope + rope] and values
        [S, heads, v]."""
        c, k_pe = latents[:, : self.kv_lora_rank], latents[:, self.kv_lora_rank :]
        heads = self.w_uk.shape[0]
        k_nope = torch.einsum("sl,hnl->shn", c, self.w_uk)
        keys = torch.cat((k_nope, k_pe[:, None, :].expand(-1, heads, -1)), dim=-1)
        return keys, torch.einsum("sl,hvl->shv", c, self.w_uv)

    def _per_head(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [T, heads, K], weights [heads, N, K] -> [T, heads, N]."""
        return torch.stack([self.linear(x[:, h], weights[h]) for h in range(weights.shape[0])], dim=1)
