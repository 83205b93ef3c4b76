"""fp8 KV cache (--kv-cache-dtype fp8|fp8_e4m3|fp8_e5m2): K and V stored in one byte per value with a
per-layer, per-tensor scale (stored = value / scale), read back as scale * stored in the model's dtype.

NOTE: the cache tensors hold the fp8 bits as uint8, because torch's CPU index_copy_/index_select (the K/V
writes, swaps and copies on write) are not implemented for float8 dtypes; every reader views them back.
"""

from dataclasses import dataclass, field

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
    _tables: dict[float, torch.Tensor] = field(default_factory=dict, repr=False)

    def value_table(self, scale: float = 1.0) -> torch.Tensor:
        """[256] float32: the value of each fp8 bit pattern times `scale`, as `dequantize` computes it
        (the native CPU kernels read and write fp8 through it)."""
        if scale not in self._tables:
            bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
            self._tables[scale] = bits.view(self.fp8_dtype).float() * scale
        return self._tables[scale]

    def quantize(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        """Values -> uint8 fp8 bits, saturating at the format's largest finite value (no inf/NaN)."""
        limit = torch.finfo(self.fp8_dtype).max
        return (x.float() / scale).clamp(-limit, limit).to(self.fp8_dtype).view(torch.uint8)

    def dequantize(self, stored: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
        """uint8 fp8 bits -> values in `dtype`."""
        return (stored.view(self.fp8_dtype).float() * scale).to(dtype)

    def calculate_scales(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Scales that map the largest |K| and |V| of this batch to half the format's range (headroom for
        later tokens; beyond it values saturate)."""
        half_range = torch.finfo(self.fp8_dtype).max / 2
        self.k_scale = max(k.abs().max().item(), 1e-6) / half_range
        self.v_scale = max(v.abs().max().item(), 1e-6) / half_range
        self.scales_pending = False


def kv_cache_storage_dtype(cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the cache tensors for --kv-cache-dtype `cache_dtype`."""
    if cache_dtype == "auto":
        return model_dtype
    return torch.bfloat16 if cache_dtype == "bfloat16" else torch.uint8


def kv_quantization(
    cache_dtype: str, calculate_scales: bool, checkpoint_scales: tuple[float, float] | None = None
) -> KVQuantization | None:
    """A layer's fp8 cache: scales from the first batch (--calculate-kv-scales), else the checkpoint's
    (`checkpoint_scales`), else 1.0."""
    if cache_dtype not in FP8_DTYPES:  # the model's dtype, or bfloat16: values stored as they are cast
        return None
    if calculate_scales or checkpoint_scales is None:
        return KVQuantization(FP8_DTYPES[cache_dtype], scales_pending=calculate_scales)
    return KVQuantization(FP8_DTYPES[cache_dtype], *checkpoint_scales)
