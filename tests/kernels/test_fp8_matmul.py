"""The native fp8 weight matmul against dequantize-then-float32-matmul, on random fp8 weights (every bit
pattern but NaN) with per-tensor, per-row and per-block scales: every shape SmolLM2 uses and odd ones
(rows and columns no vector width divides), batch 1 to 9 (the register kernel's every batch, then the
GEMM path) and 64; NaN and infinities in x propagate as the float32 matmul propagates them."""

import pytest
import torch

from pagedserve.kernels.cpu import load_cpu_kernels
from pagedserve.kernels.cpu.fp8_ops import fp8_matmul, fp8_matmul_isa
from pagedserve.quantization.fp8 import _FP8_VALUES

pytestmark = pytest.mark.skipif(
    load_cpu_kernels().module is None, reason=f"native CPU kernels unavailable: {load_cpu_kernels().error}"
)

# [N, K]: SmolLM2-135M's fused qkv, o, gate_up, down; rows and a K that no vector width divides; tiny.
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (43, 77), (3, 5)]
SCALES = ["tensor", "row", 16, 128, 24]  # block_k 24: blocks that end inside a vector


def random_fp8(
    n: int, k: int, scales_kind: int | str
) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """(fp8 bits [N, K] uint8, scales [N, ceil(K / block_k)], block_k, the dequantized float32 weight)."""
    block_k = k if scales_kind in ("tensor", "row") else int(scales_kind)
    bits = torch.randint(0, 256, (n, k), dtype=torch.uint8)
    bits[(bits & 0x7F) == 0x7F] = 0x3C  # no NaN patterns: a checkpoint holds finite weights
    scales = torch.rand(n, -(-k // block_k)) * 0.01 + 1e-4
    if scales_kind == "tensor":  # one scale, as the layer stores it: repeated on every row
        scales = scales[:1].expand(n, 1).contiguous()
    weight = _FP8_VALUES[bits.long()] * scales.repeat_interleave(block_k, dim=1)[:, :k]
    return bits, scales, block_k, weight


def assert_close_to_float(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """Within float32 rounding of the exact sums: 1e-5 of the sum of |terms|."""
    expected = x.double() @ weight.double().t()
    bound = (x.abs().double() @ weight.abs().double().t()) * 1e-5 + 1e-30
    assert out.shape == expected.shape and out.dtype == torch.float32
    assert ((out.double() - expected).abs() <= bound).all()


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("scales_kind", SCALES, ids=str)
def test_fp8_matmul_matches_dequantized_matmul(n: int, k: int, scales_kind: int | str) -> None:
    torch.manual_seed(n + k)
    bits, scales, block_k, weight = random_fp8(n, k, scales_kind)
    for batch in [*range(1, 10), 64]:
        x = torch.randn(batch, k)
        assert_close_to_float(fp8_matmul(x, bits, scales, block_k), x, weight)


def test_every_fp8_value_widens_exactly() -> None:
    """Each of the 254 finite bit patterns (subnormals, zeros of both signs, the largest) times 1.0, in a
    position of each vector lane and in the tail: the output is the value itself."""
    finite = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    k = 37  # a tail after two 16-wide vectors (four 8-wide ones)
    bits = finite.reshape(-1, 1).expand(-1, k).contiguous()  # row j: pattern j everywhere
    for column in range(k):
        x = torch.zeros(1, k)
        x[0, column] = 1.0
        for batch_x in (x, x.expand(12, k)):  # the register kernel and the GEMM path
            out = fp8_matmul(batch_x, bits, torch.ones(len(finite), 1), k)
            assert torch.equal(out[0], _FP8_VALUES[finite.long()]), column


@pytest.mark.parametrize("batch", [1, 3, 8, 9, 64])
def test_nan_and_inf_in_x_propagate_as_in_float(batch: int) -> None:
    torch.manual_seed(batch)
    bits, scales, block_k, weight = random_fp8(50, 70, 16)
    bits[:5, 3] = 0  # zero weights against an infinity: NaN, as in float
    weight[:5, 3] = 0.0
    x = torch.randn(batch, 70)
    x[0, 3] = float("inf")
    if batch > 1:
        x[-1, 40] = float("nan")
    if batch > 2:
        x[1, 10], x[1, 11] = float("inf"), float("-inf")
    out = fp8_matmul(x, bits, scales, block_k)
    expected = torch.nn.functional.linear(x, weight)
    assert torch.equal(out.isnan(), expected.isnan()) and out.isnan().any()
    assert torch.equal(out.isinf(), expected.isinf()) and out.isinf().any()
    assert torch.equal(out[out.isinf()], expected[expected.isinf()])
    clean_rows = x.isfinite().all(dim=1)  # the other rows still match the float matmul
    assert_close_to_float(out[clean_rows], x[clean_rows], weight)


def test_nan_weights_give_nan() -> None:
    """e4m3fn's NaN patterns (0x7F, 0xFF) read as NaN, not as a number."""
    bits = torch.full((2, 40), 0x38, dtype=torch.uint8)  # 1.0
    bits[0, 33], bits[1, 5] = 0x7F, 0xFF
    for batch in (1, 12):
        out = fp8_matmul(torch.ones(batch, 40), bits, torch.ones(2, 1), 40)
        assert out.isnan().all()


def test_empty_shapes() -> None:
    assert (
        fp8_matmul(torch.randn(3, 0), torch.zeros(4, 0, dtype=torch.uint8), torch.zeros(4, 0), 1).eq(0).all()
    )
    assert fp8_matmul(torch.randn(0, 8), torch.zeros(4, 8, dtype=torch.uint8), torch.ones(4, 1), 8).shape == (
        0,
        4,
    )


def test_fp8_matmul_names_its_vector_code() -> None:
    capability = torch.backends.cpu.get_cpu_capability()
    assert fp8_matmul_isa() == {"AVX512": "avx512", "AVX2": "avx2"}.get(capability, "scalar")


def test_fp8_matmul_rejects_wrong_shapes() -> None:
    bits, scales, _, _ = random_fp8(8, 32, 16)
    with pytest.raises(RuntimeError, match=r"scales must be \[N, ceil\(K / block_k\)\] = \[8, 2\]"):
        fp8_matmul(torch.randn(2, 32), bits, scales[:, :1], 16)
    with pytest.raises(RuntimeError, match="with x's K = 31"):
        fp8_matmul(torch.randn(2, 31), bits, scales, 16)
    with pytest.raises(RuntimeError, match="block_k must be > 0"):
        fp8_matmul(torch.randn(2, 32), bits, scales, 0)
