"""The linear + bias + activation / residual epilogues (oneDNN on CPU) against the plain PyTorch math on
random inputs: float32 to float32's rounding, bfloat16 to bfloat16's."""

import pytest
import torch
import torch.nn.functional as F

from pagedserve.layers.fused_linear import check_activation, linear_activation, linear_residual
from pagedserve.layers.linear import ColumnParallelLinear, RowParallelLinear

# relative to the output's largest value: float32 GEMMs differ in summation order, bfloat16 rounds its
# output to 8 bits of mantissa
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
REFERENCE = {
    "gelu": lambda y: F.gelu(y),
    "gelu_new": lambda y: F.gelu(y, approximate="tanh"),
    "gelu_pytorch_tanh": lambda y: F.gelu(y, approximate="tanh"),
    "relu": F.relu,
    None: lambda y: y,
}


def _random_layer(layer: torch.nn.Module, dtype: torch.dtype, bias: bool) -> torch.nn.Module:
    layer.weight.data.normal_()
    if bias:
        layer.bias.data.normal_()
    return layer.to(dtype)


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.dtype == dtype and got.shape == want.shape
    err = (got.float() - want).abs().max().item()
    assert err <= TOLERANCE[dtype] * want.abs().max().item(), err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("act", list(REFERENCE))
@pytest.mark.parametrize("bias", [True, False])
def test_linear_activation_equals_unfused(dtype: torch.dtype, act: str | None, bias: bool) -> None:
    torch.manual_seed(0)
    layer = _random_layer(ColumnParallelLinear(37, 53, bias=bias), dtype, bias)
    x = torch.randn(29, 74, dtype=dtype)[:, ::2]  # odd sizes, not contiguous
    want = F.linear(x.float(), layer.weight.float(), layer.bias.float() if bias else None)
    _close(linear_activation(layer, x, act), REFERENCE[act](want), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_residual_equals_unfused(dtype: torch.dtype, bias: bool) -> None:
    torch.manual_seed(1)
    layer = _random_layer(RowParallelLinear(61, 19, bias=bias), dtype, bias)
    x, residual = torch.randn(33, 61, dtype=dtype), torch.randn(33, 19, dtype=dtype)
    want = F.linear(x.float(), layer.weight.float(), layer.bias.float() if bias else None) + residual.float()
    _close(linear_residual(layer, x, residual), want, dtype)


def test_an_unknown_activation_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="hidden_act='quick_gelu'"):
        check_activation("quick_gelu")
