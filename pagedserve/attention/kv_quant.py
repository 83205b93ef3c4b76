"""fp8 KV cache (--kv-cache-dtype fp8|fp8_e4m3|fp8_e5m2): K and V stored in one byte per value with a
per-layer, per-tensor scale (stored = value / scale), read back as scale * stored in the model's dtype.

Keys are stored rotated: the Attention layer multiplies every query and key head by one orthonormal
Walsh-Hadamard matrix R after the rotary embedding (q R . k R = q . k, so attention is unchanged in exact
arithmetic). Why: a float format rounds each value to ~3 significant bits (e4m3), and a logit q . k of a
real model is dominated by a few outlier channels, so its error is that of one or two rounded values; R
spreads every channel over all of them, and the logit's error becomes the average of head_dim independent
roundings (SmolLM2's perplexity: +1.3% -> see docs/benchmarks.md, Accuracy). With --calculate-kv-scales the
keys' per-channel mean over the first batch is also subtracted: q . (k - m) shifts a query's logits by the
same q . m, which the softmax ignores, and the rounded values shrink to the keys' spread around it (not
with a logit soft cap, which is not shift-invariant). Values are stored as they are: their rounding errors
average out in the softmax-weighted sum (measured: no perplexity change). Scales shipped in a checkpoint
were calibrated on unrotated keys, so keys stay unrotated with them.

NOTE: the cache tensors hold the fp8 bits as uint8, because torch's CPU index_copy_/index_select (the K/V
writes, swaps and copies on write) are not implemented for float8 dtypes; every reader views them back.
"""

import functools
from dataclasses import dataclass

import torch

FP8_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@dataclass
class KVQuantization:
    """One layer's fp8 format and scales, read by every attention backend (the AttentionLayerSpec's
    `kv_quant`; None there means the cache holds the model's dtype). Mutable: --calculate-kv-scales sets
    the scales from the first batch."""

    fp8_dtype: torch.dtype  # torch.float8_e4m3fn | torch.float8_e5m2
    k_scale: float = 1.0
    v_scale: float = 1.0
    scales_pending: bool = False  # True until the first batch sets the scales (--calculate-kv-scales)
    rotate_keys: bool = False  # q and k multiplied by key_rotation (the module's note)
    # [num_kv_heads, head_dim], rotated: the first batch's mean key, subtracted (--calculate-kv-scales)
    key_offset: torch.Tensor | None = None

    def quantize(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        """Values -> uint8 fp8 bits, saturating at the format's largest finite value (no inf/NaN)."""
        limit = torch.finfo(self.fp8_dtype).max
        return (x.float() / scale).clamp(-limit, limit).to(self.fp8_dtype).view(torch.uint8)

    def dequantize(self, stored: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
        """uint8 fp8 bits -> values in `dtype`."""
        return (stored.view(self.fp8_dtype).float() * scale).to(dtype)

    def transform(
        self, q: torch.Tensor, k: torch.Tensor, num_kv_heads: int, head_dim: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, heads * head_dim] and k [T, num_kv_heads * head_dim] as attention sees them: rotated
        (and k shifted by the offset) when `rotate_keys`, else unchanged."""
        if not self.rotate_keys:
            return q, k
        rotated_q = (q.reshape(-1, head_dim) @ key_rotation(head_dim, q.dtype, q.device)).view(q.shape)
        return rotated_q, self._stored_keys(k, num_kv_heads, head_dim)

    def _stored_keys(self, k: torch.Tensor, num_kv_heads: int, head_dim: int) -> torch.Tensor:
        rotated = k.reshape(-1, num_kv_heads, head_dim) @ key_rotation(head_dim, k.dtype, k.device)
        if self.key_offset is not None:
            rotated = rotated - self.key_offset
        return rotated.view(k.shape)

    def calculate_scales(
        self, k: torch.Tensor, v: torch.Tensor, num_kv_heads: int, head_dim: int, shift_invariant: bool
    ) -> None:
        """From the first batch's raw k/v: the key offset (its mean key, when keys are rotated and the
        logits `shift_invariant`), then scales that map the largest |K| as stored and |V| to half the
        format's range (headroom for later tokens; beyond it values saturate)."""
        if self.rotate_keys:
            if shift_invariant:
                mean = k.reshape(-1, num_kv_heads, head_dim).float().mean(dim=0)
                self.key_offset = (mean @ key_rotation(head_dim, torch.float32, k.device)).to(k.dtype)
            k = self._stored_keys(k, num_kv_heads, head_dim)
        half_range = torch.finfo(self.fp8_dtype).max / 2
        self.k_scale = max(k.abs().max().item(), 1e-6) / half_range
        self.v_scale = max(v.abs().max().item(), 1e-6) / half_range
        self.scales_pending = False


@functools.cache
def key_rotation(head_dim: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[head_dim, head_dim] orthonormal: Sylvester's Walsh-Hadamard matrix of the largest power of two
    dividing head_dim (64 -> one 64 x 64 block; 80 -> five 16 x 16 blocks on the diagonal), / sqrt(size)."""
    size = head_dim & -head_dim
    block = torch.ones(1, 1, dtype=torch.float64)
    while block.shape[0] < size:
        block = torch.cat([torch.cat([block, block], 1), torch.cat([block, -block], 1)])
    rotation: torch.Tensor = torch.block_diag(*[block / size**0.5] * (head_dim // size))
    return rotation.to(dtype=dtype, device=device)


def kv_cache_storage_dtype(cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the cache tensors for --kv-cache-dtype `cache_dtype`."""
    if cache_dtype == "auto":
        return model_dtype
    return torch.bfloat16 if cache_dtype == "bfloat16" else torch.uint8


def kv_quantization(
    cache_dtype: str,
    calculate_scales: bool,
    checkpoint_scales: tuple[float, float] | None = None,
    latent: bool = False,
) -> KVQuantization | None:
    """A layer's fp8 cache: scales from the first batch (--calculate-kv-scales), else the checkpoint's
    (`checkpoint_scales`, on unrotated keys), else 1.0. An MLA layer's (`latent`) stores its latents
    unrotated (they are its values too) under one scale."""
    if cache_dtype not in FP8_DTYPES:  # the model's dtype, or bfloat16: values stored as they are cast
        return None
    if calculate_scales or checkpoint_scales is None:
        return KVQuantization(
            FP8_DTYPES[cache_dtype], scales_pending=calculate_scales, rotate_keys=not latent
        )
    if latent:
        return KVQuantization(FP8_DTYPES[cache_dtype], checkpoint_scales[0], checkpoint_scales[0])
    return KVQuantization(FP8_DTYPES[cache_dtype], *checkpoint_scales)
