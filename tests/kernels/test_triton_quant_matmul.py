"""Matmuls and dequantization on ggml rows: the Triton kernels (kernels/triton/quant_matmul.py) and the
torch dequantizer (quantization/ggml_torch.py) against the native `gguf_dequantize` on random valid blocks
of every type. Shapes are odd on purpose: N = 37 (no multiple of a tile), K two super-blocks for K-quants
and five blocks for the others (a K step of 32). Batches 1, 7, 16 take the GEMV, 17 and 300 the tiled
path; activations are transposed or sliced views. The Triton kernels run through Triton's interpreter on
CPU (float32 only: its bf16 arithmetic is broken), compiled on a GPU."""

import numpy as np
import pytest
import torch
from gguf_reference import random_rows
from interpreted_triton import DEVICE, import_triton_kernels

from pagedserve.kernels.cpu import load_cpu_kernels
from pagedserve.kernels.cpu.gguf_ops import GGML_BLOCK_FORMATS, NATIVE_GGML_TYPES, gguf_dequantize
from pagedserve.quantization.ggml_torch import dequantize_ggml_rows

triton_kernels = import_triton_kernels()

TYPES = sorted(triton_kernels.GGML_TRITON_TYPES)
OUT_FEATURES = 37


@pytest.fixture(scope="module", autouse=True)
def native() -> None:
    error = load_cpu_kernels().error
    if error is not None:
        pytest.skip(f"native CPU kernels unavailable: {error}")


def in_features(ggml_type: int) -> int:
    weights = GGML_BLOCK_FORMATS[ggml_type][0]
    return 2 * weights if weights == 256 else 5 * weights


@pytest.fixture(scope="module")
def weights() -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """ggml type -> (rows uint8 [37, row_bytes] on DEVICE, the native kernel's float32 weights on CPU)."""
    rng = np.random.default_rng(0)
    result = {}
    for ggml_type in {*NATIVE_GGML_TYPES.values(), *TYPES}:
        rows = torch.from_numpy(random_rows(ggml_type, OUT_FEATURES, in_features(ggml_type), rng))
        result[ggml_type] = (rows.to(DEVICE), gguf_dequantize(rows, ggml_type, in_features(ggml_type)))
    return result


def check_matmul(
    x: torch.Tensor, ggml_type: int, weights: dict[int, tuple[torch.Tensor, torch.Tensor]]
) -> None:
    """ggml_matmul against x W^T in float64 on the native weights, within float32's worst-case bound for
    sums of K products (K ulps of the sum of |products|; fp16/bf16 x: their own rounding of the output)."""
    rows, weight = weights[ggml_type]
    y = triton_kernels.ggml_matmul(x, rows, ggml_type, OUT_FEATURES)
    assert y.shape == (x.shape[0], OUT_FEATURES) and y.dtype == x.dtype and y.device == x.device
    x64, w64 = x.cpu().double(), weight.double()
    expected = x64 @ w64.T
    magnitude = x64.abs() @ w64.abs().T
    output_ulp = 0.0 if x.dtype == torch.float32 else torch.finfo(x.dtype).eps
    bound = x.shape[1] * torch.finfo(torch.float32).eps * magnitude + output_ulp * expected.abs()
    error = (y.cpu().double() - expected).abs()
    assert (error <= bound + 1e-30).all(), (
        f"worst error {error.max():.3g}, bound there {bound.flatten()[error.argmax()]:.3g}"
    )


def transposed(batch: int, ggml_type: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x [batch, K] as the transpose of a [K, batch] tensor: strides (1, batch)."""
    return torch.randn(in_features(ggml_type), batch, dtype=dtype, device=DEVICE).t()


def sliced(batch: int, ggml_type: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x [batch, K] as every other column of a [batch + 1, 2K] tensor, its first row dropped."""
    return torch.randn(batch + 1, 2 * in_features(ggml_type), dtype=dtype, device=DEVICE)[1:, ::2]


@pytest.mark.parametrize("ggml_type", NATIVE_GGML_TYPES.values())
def test_torch_dequantizer_equals_native(
    ggml_type: int, weights: dict[int, tuple[torch.Tensor, torch.Tensor]]
) -> None:
    rows, weight = weights[ggml_type]
    assert torch.equal(dequantize_ggml_rows(rows, ggml_type, in_features(ggml_type)).cpu(), weight)


@pytest.mark.parametrize("ggml_type", TYPES)
def test_triton_dequantize_equals_native(
    ggml_type: int, weights: dict[int, tuple[torch.Tensor, torch.Tensor]]
) -> None:
    rows, weight = weights[ggml_type]
    assert torch.equal(
        triton_kernels.ggml_dequantize(rows, ggml_type, in_features(ggml_type), torch.float32).cpu(), weight
    )


@pytest.mark.parametrize("ggml_type", TYPES)
def test_gemv_on_transposed_activations(
    ggml_type: int, weights: dict[int, tuple[torch.Tensor, torch.Tensor]]
) -> None:
    torch.manual_seed(ggml_type)
    check_matmul(transposed(7, ggml_type), ggml_type, weights)


@pytest.mark.parametrize("ggml_type", TYPES)
def test_tiles_on_sliced_activations(
    ggml_type: int, weights: dict[int, tuple[torch.Tensor, torch.Tensor]]
) -> None:
    """Batch 17: the smallest batch past the GEMV."""
    torch.manual_seed(ggml_type)
    check_matmul(sliced(17, ggml_type), ggml_type, weights)


@pytest.mark.sampled(by="ggml_type")  # the GEMV path of test_gemv_on_transposed_activations
@pytest.mark.parametrize("ggml_type", TYPES)
@pytest.mark.parametrize("batch", [1, 16])
def test_gemv_smallest_and_largest_batch(
    ggml_type: int, batch: int, weights: dict[int, tuple[torch.Tensor, torch.Tensor]]
) -> None:
    torch.manual_seed(batch)
    check_matmul(sliced(batch, ggml_type), ggml_type, weights)


@pytest.mark.sampled  # the tiled path of test_tiles_on_sliced_activations, over several row tiles
@pytest.mark.parametrize("ggml_type", TYPES)
def test_tiles_of_a_prefill(ggml_type: int, weights: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
    torch.manual_seed(300)
    check_matmul(transposed(300, ggml_type), ggml_type, weights)


@pytest.mark.gpu
def test_half_precision_activations(weights: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Compiled only: fp16/bf16 x through both paths (16-bit tl.dot tiles in the tiled one), every type."""
    torch.manual_seed(0)
    for ggml_type in TYPES:
        for dtype in (torch.float16, torch.bfloat16):
            for batch in (7, 300):
                check_matmul(transposed(batch, ggml_type, dtype), ggml_type, weights)


def test_bad_arguments_raise(weights: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
    rows, _ = weights[12]
    x = torch.randn(3, 512, device=DEVICE)
    f16_rows, _ = weights[NATIVE_GGML_TYPES["F16"]]
    with pytest.raises(ValueError, match="ggml type 1 has no Triton kernel"):
        triton_kernels.ggml_matmul(torch.randn(3, 512, device=DEVICE), f16_rows, 1, OUT_FEATURES)
    with pytest.raises(ValueError, match="not whole blocks of 256"):
        triton_kernels.ggml_matmul(x[:, :500], rows, 12, OUT_FEATURES)
    with pytest.raises(ValueError, match=r"uint8 \[rows, 288\]"):
        triton_kernels.ggml_matmul(x, rows[:, :144], 12, OUT_FEATURES)
    with pytest.raises(ValueError, match="out_features=36"):
        triton_kernels.ggml_matmul(x, rows, 12, 36)
    with pytest.raises(ValueError, match="float32/float16/bfloat16"):
        triton_kernels.ggml_matmul(x.long(), rows, 12, OUT_FEATURES)
    with pytest.raises(ValueError, match="cannot be dequantized"):
        dequantize_ggml_rows(rows, 6, 512)
    with pytest.raises(ValueError, match=r"uint8 \[rows, 144\]"):
        dequantize_ggml_rows(rows, 12, 256)
    assert triton_kernels.ggml_matmul(x[:0], rows, 12, OUT_FEATURES).shape == (0, OUT_FEATURES)
