"""Gated activations; on CPU SiLU·mul and GELU-tanh·mul run as one native kernel each."""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.kernels.cpu import fused_ops


def _native_gated(kernel: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """A [rows, 2d] kernel over x [..., 2d] -> [..., d]."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    return kernel(rows).view(*x.shape[:-1], x.shape[-1] // 2)


class SiluAndMul(nn.Module):
    """[..., 2d] -> silu(x[..., :d]) * x[..., d:]"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused_ops.usable(x):
            return _native_gated(fused_ops.silu_and_mul, x)
        return self.forward_torch(x)

    def forward_torch(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class GeluAndMul(nn.Module):
    """[..., 2d] -> gelu(x[..., :d]) * x[..., d:] (GeGLU); approximate="tanh" is HF's gelu_pytorch_tanh."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.approximate == "tanh" and fused_ops.usable(x):
            return _native_gated(fused_ops.gelu_tanh_and_mul, x)
        return self.forward_torch(x)

    def forward_torch(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate=self.approximate) * up


# HF's `hidden_act` / `hidden_activation` names -> the gated activation of a gate_up projection.
_GATED: dict[str, Callable[[], nn.Module]] = {
    "silu": SiluAndMul,
    "swish": SiluAndMul,
    "gelu_pytorch_tanh": lambda: GeluAndMul("tanh"),
    "gelu_new": lambda: GeluAndMul("tanh"),
    "gelu": GeluAndMul,
}


def gated_activation(name: str) -> nn.Module:
    """The gated activation HF calls `name`. Raises ValueError for names it does not know."""
    if name not in _GATED:
        raise ValueError(f"hidden_act={name!r} is not supported; supported: {', '.join(_GATED)}.")
    return _GATED[name]()


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


# HF's names of the plain (ungated) activations of vision towers and projectors.
_PLAIN: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "quick_gelu": _quick_gelu,
    "silu": F.silu,
}


def plain_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation HF calls `name`, applied alone. Raises ValueError for names it does not know."""
    if name not in _PLAIN:
        raise ValueError(f"hidden_act={name!r} is not supported; supported: {', '.join(_PLAIN)}.")
    return _PLAIN[name]
