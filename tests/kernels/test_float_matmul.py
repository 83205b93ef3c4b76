"""The row-invariant float matmul (kernels/cpu/float_matmul.cpp) against a float64 reference, on odd shapes
(rows, columns and K that no vector width or tile divides), 1 to 300 rows, strided activations, each weight
dtype; and its promise, bit for bit: a row's output is the same whatever the number of rows in the call,
the row's position among them, its neighbours' values and the thread count."""

import argparse

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.config import EngineArgs
from pagedserve.config.cli import add_dataclass_cli_args, dataclass_from_cli_args
from pagedserve.kernels.cpu import load_cpu_kernels
from pagedserve.kernels.cpu.float_ops import float_matmul
from pagedserve.layers.embedding import VocabParallelEmbedding
from pagedserve.layers.linear import ColumnParallelLinear, RowParallelLinear
from pagedserve.quantization.base import UnquantizedMethod, set_quantization_config

pytestmark = pytest.mark.skipif(
    load_cpu_kernels().module is None, reason=f"native CPU kernels unavailable: {load_cpu_kernels().error}"
)

WEIGHT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# [N, K]: SmolLM2-135M's gate_up and down; odd ones (K shorter than a vector, between vectors, no tile
# dividing N); a K of 1.
SHAPES = [(3072, 576), (576, 1536), (43, 77), (7, 5), (13, 33), (5, 1)]


def assert_close_to_exact(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """Within float32 rounding of the exact sums: 1e-6 of the sum of |terms| (K <= 1536 products)."""
    expected = x.double() @ weight.double().t()
    bound = (x.double().abs() @ weight.double().abs().t()) * 1e-6 + 1e-30
    assert out.shape == expected.shape and out.dtype == torch.float32
    assert ((out.double() - expected).abs() <= bound).all()


@pytest.mark.parametrize("dtype", WEIGHT_DTYPES, ids=str)
@pytest.mark.parametrize("n,k", SHAPES)
def test_matches_float64_reference(n: int, k: int, dtype: torch.dtype) -> None:
    torch.manual_seed(n + k)
    weight = torch.randn(n, k).to(dtype)
    for rows in [1, 2, 3, 4, 5, 7, 9, 17, 64, 300]:
        x = torch.randn(rows, k)
        assert_close_to_exact(float_matmul(x, weight), x, weight)


def test_strided_activations() -> None:
    """Rows apart in memory (a slice of wider rows) and a transposed (column-major) x give the contiguous
    copy's result."""
    torch.manual_seed(0)
    weight = torch.randn(37, 70)
    wide = torch.randn(9, 100)
    x = wide[:, 5:75]
    assert torch.equal(float_matmul(x, weight), float_matmul(x.contiguous(), weight))
    column_major = torch.randn(70, 9).t()
    assert torch.equal(float_matmul(column_major, weight), float_matmul(column_major.contiguous(), weight))
    assert_close_to_exact(float_matmul(x, weight), x, weight)


@pytest.mark.parametrize("dtype", WEIGHT_DTYPES, ids=str)
def test_a_rows_bits_do_not_depend_on_its_batch(dtype: torch.dtype) -> None:
    """Row `probe` alone, at every position of batches of 2..300 rows with random neighbours, and with 1 or
    2 threads: one result, bit for bit (oneDNN's F.linear gives a row other bits at other batch sizes)."""
    torch.manual_seed(1)
    n, k = 200, 129
    weight = torch.randn(n, k).to(dtype)
    probe = torch.randn(1, k)
    alone = float_matmul(probe, weight)
    threads = torch.get_num_threads()
    try:
        for thread_count in (1, 2):
            torch.set_num_threads(thread_count)
            assert torch.equal(float_matmul(probe, weight), alone)
            for rows in [2, 3, 4, 5, 8, 15, 16, 17, 33, 300]:
                for position in {0, rows // 2, rows - 1}:
                    x = torch.randn(rows, k)
                    x[position] = probe[0]
                    assert torch.equal(float_matmul(x, weight)[position], alone[0]), (
                        thread_count,
                        rows,
                        position,
                    )
    finally:
        torch.set_num_threads(threads)


def test_bad_inputs_raise() -> None:
    with pytest.raises(RuntimeError, match="float32"):
        float_matmul(torch.randn(2, 4).double(), torch.randn(3, 4))
    with pytest.raises(RuntimeError, match="K = 4"):
        float_matmul(torch.randn(2, 4), torch.randn(3, 5))
    with pytest.raises(RuntimeError, match="bfloat16 weights"):
        float_matmul(torch.randn(2, 4), torch.randn(3, 4).double())


def test_empty_shapes() -> None:
    assert float_matmul(torch.randn(0, 8), torch.randn(3, 8)).shape == (0, 3)
    assert float_matmul(torch.randn(2, 8), torch.randn(0, 8)).shape == (2, 0)
    assert torch.equal(float_matmul(torch.randn(2, 0), torch.randn(3, 0)), torch.zeros(2, 3))


def test_float32_layers_take_the_kernel_unless_built_not_to() -> None:
    """`UnquantizedMethod` (every float linear layer and LM head) multiplies a float32 x of any leading
    shape through the kernel; `row_invariant=False` keeps F.linear (oneDNN), bit for bit."""
    layer = nn.Module()
    layer.weight = nn.Parameter(torch.randn(50, 64), requires_grad=False)
    x = torch.randn(3, 7, 64)
    expected = float_matmul(x.reshape(21, 64), layer.weight).view(3, 7, 50)
    assert torch.equal(UnquantizedMethod().apply(layer, x), expected)
    assert torch.equal(UnquantizedMethod(row_invariant=False).apply(layer, x), F.linear(x, layer.weight))


@pytest.mark.parametrize(
    "flags, invariant", [([], True), (["--batch-invariant"], True), (["--no-batch-invariant"], False)]
)
def test_the_batch_invariant_flag_reaches_every_float_layer(flags: list[str], invariant: bool) -> None:
    """--no-batch-invariant (LLM(batch_invariant=False)): the float layers of a model built under it keep
    oneDNN's GEMM; the default builds them row-invariant."""
    parser = argparse.ArgumentParser()
    add_dataclass_cli_args(EngineArgs, parser)
    args = dataclass_from_cli_args(EngineArgs, parser.parse_args(flags))
    assert args.batch_invariant is invariant
    with set_quantization_config(None, args.batch_invariant):
        layers = [ColumnParallelLinear(8, 8), RowParallelLinear(8, 8), VocabParallelEmbedding(32, 8)]
    assert {layer.quant_method.row_invariant for layer in layers} == {invariant}
