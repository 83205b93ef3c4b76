"""The native fp8 weight matmul against dequantize-then-float32-matmul, on random fp8 weights with
per-row and per-block scales, every shape SmolLM2 uses and odd ones, batch 1 to 256."""

import pytest
import torch

from pagedserve.kernels.cpu import load_cpu_kernels
from pagedserve.kernels.cpu.fp8_ops import fp8_matmul
from pagedserve.quantization.fp8 import _FP8_VALUES

pytestmark = pytest.mark.skipif(
    load_cpu_kernels().module is None, reason=f"native CPU kernels unavailable: {load_cpu_kernels().error}"
)

# [N, K]: SmolLM2-135M's fused qkv, o, gate_up, down; a K that no vector width divides; a tiny one.
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (40, 77), (3, 5)]


def random_fp8(n: int, k: int, block_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fp8 bits [N, K] uint8, scales [N, ceil(K / block_k)], the dequantized float32 weight)."""
    bits = torch.randint(0, 256, (n, k), dtype=torch.uint8)
    bits[(bits & 0x7F) == 0x7F] = 0x3C  # no NaN patterns: a checkpoint holds finite weights
    scales = torch.rand(n, -(-k // block_k)) * 0.01 + 1e-4
    weight = _FP8_VALUES[bits.long()] * scales.repeat_interleave(block_k, dim=1)[:, :k]
    return bits, scales, weight


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("block_k", ["row", 16, 128])
@pytest.mark.parametrize("batch", [1, 7, 64, 256])
def test_fp8_matmul_matches_dequantized_matmul(n: int, k: int, block_k: int | str, batch: int) -> None:
    torch.manual_seed(n + k + batch)
    block = k if block_k == "row" else int(block_k)
    bits, scales, weight = random_fp8(n, k, block)
    x = torch.randn(batch, k)
    out = fp8_matmul(x, bits, scales, _FP8_VALUES, block)
    expected = x.double() @ weight.double().t()
    assert out.shape == (batch, n) and out.dtype == torch.float32
    # float32 sums of K products: relative to the sum of |terms|
    bound = (x.abs().double() @ weight.abs().double().t()) * 1e-5 + 1e-30
    assert ((out.double() - expected).abs() <= bound).all()


def test_fp8_matmul_rejects_wrong_shapes() -> None:
    bits, scales, _ = random_fp8(8, 32, 16)
    with pytest.raises(RuntimeError, match=r"scales must be \[N, ceil\(K / block_k\)\] = \[8, 2\]"):
        fp8_matmul(torch.randn(2, 32), bits, scales[:, :1], _FP8_VALUES, 16)
    with pytest.raises(RuntimeError, match="with x's K = 31"):
        fp8_matmul(torch.randn(2, 31), bits, scales, _FP8_VALUES, 16)
    with pytest.raises(RuntimeError, match="block_k must be > 0"):
        fp8_matmul(torch.randn(2, 32), bits, scales, _FP8_VALUES, 0)
