"""RMSNorm (Llama's, and Gemma's (1 + w) variant) with an optional fused residual add, and LayerNorm.
On CPU the RMSNorms run as one native kernel (`kernels/cpu/fused_ops.py`), the torch ops otherwise."""

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.kernels.cpu import fused_ops


class RMSNorm(nn.Module):
    # Gemma's scale (1 + w) instead of w, in the native kernel.
    weight_offset = False

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without `residual`: norm(x). With it: (norm(x + residual), x + residual), computed in place
        into x and residual when the native kernel runs (vLLM's contract: callers hand both over)."""
        if not fused_ops.usable(x) or x.dtype != self.weight.dtype:
            return self.forward_torch(x, residual)
        if residual is None:
            rows = x.reshape(-1, x.shape[-1]).contiguous()
            return fused_ops.rms_norm(rows, self.weight, self.eps, self.weight_offset).view(x.shape)
        if not (x.is_contiguous() and residual.is_contiguous() and residual.dtype == x.dtype):
            return self.forward_torch(x, residual)
        flat = x.view(-1, x.shape[-1])
        fused_ops.fused_add_rms_norm(flat, residual.view_as(flat), self.weight, self.eps, self.weight_offset)
        return x, residual

    def forward_torch(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """`forward` in torch ops (the reference the kernel is tested against), leaving its inputs as
        they are."""
        if residual is not None:
            x = x + residual
            residual = x
        # NOTE: the variance is computed in float32, as HF does, so low-precision runs match it.
        x32 = x.float()
        out = self._scale(x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps), x.dtype)
        return out if residual is None else (out, residual)

    def _scale(self, normed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return self.weight * normed.to(dtype)


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: the checkpoint stores w - 1 (zero-initialized), and the product is taken in
    float32 before the cast, as HF Gemma does."""

    weight_offset = True

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__(hidden_size, eps)
        self.weight.data.zero_()

    def _scale(self, normed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return (normed * (1.0 + self.weight.float())).to(dtype)


class LayerNorm(nn.LayerNorm):
    """torch's LayerNorm, frozen (inference only)."""

    def __init__(self, hidden_size: int, eps: float, bias: bool = True) -> None:
        super().__init__(hidden_size, eps=eps, bias=bias)
        for param in self.parameters():
            param.requires_grad_(False)

    def forward(  # type: ignore[override]  # RMSNorm's contract: the residual add too
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without `residual`: norm(x). With it: (norm(x + residual), x + residual), as RMSNorm."""
        if residual is None:
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        x = x + residual
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps), x
