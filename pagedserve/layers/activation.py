"""Gated activations."""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """[..., 2d] -> silu(x[..., :d]) * x[..., d:]"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class GeluAndMul(nn.Module):
    """[..., 2d] -> gelu(x[..., :d]) * x[..., d:] (GeGLU); approximate="tanh" is HF's gelu_pytorch_tanh."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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
