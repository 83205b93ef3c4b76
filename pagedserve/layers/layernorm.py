"""RMSNorm (Llama's, and Gemma's (1 + w) variant) with an optional fused residual add, and LayerNorm."""

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without `residual`: norm(x). With it: (norm(x + residual), x + residual)."""
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
