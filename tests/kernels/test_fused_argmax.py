"""The LM head's argmax folded into the packed GGUF matmul (gguf_packed_matmul_greedy, its FusedArgmax):
the logits are gguf_packed_matmul's, bit for bit, and the tokens torch.argmax's of them, for every packed
type, on the integer paths that fold it in and the float and AMX paths that read the logits after; rows
spread over two threads; ties across the threads' ranges, a NaN logit, a NaN activation row."""

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from gguf_reference import random_rows

from pagedserve.kernels.cpu import load_cpu_kernels
from pagedserve.kernels.cpu.gguf_ops import (
    NATIVE_GGML_TYPES,
    gguf_pack,
    gguf_packable,
    gguf_packed_matmul,
    gguf_packed_matmul_greedy,
    gguf_set_amx,
)

TYPES = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]


@pytest.fixture(scope="module", autouse=True)
def two_threads() -> Iterator[None]:
    """Native kernels built, and two threads (the test runner's workers run one), so each thread folds its own
    range of rows and the merge between them is exercised."""
    error = load_cpu_kernels().error
    if error is not None:
        pytest.skip(f"native CPU kernels unavailable: {error}")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _packed(type_name: str, n: int, k: int, seed: int) -> tuple[int, np.ndarray, torch.Tensor]:
    ggml_type = NATIVE_GGML_TYPES[type_name]
    rows = random_rows(ggml_type, n, k, np.random.default_rng(seed))
    return ggml_type, rows, gguf_pack(torch.from_numpy(rows), ggml_type)


def _check(x: torch.Tensor, packed: torch.Tensor, ggml_type: int, n: int, bits: int) -> torch.Tensor:
    logits, tokens = gguf_packed_matmul_greedy(x, packed, ggml_type, n, bits)
    expected = gguf_packed_matmul(x, packed, ggml_type, n, bits)
    torch.testing.assert_close(logits, expected, rtol=0, atol=0, equal_nan=True)  # the same bits
    assert tokens.dtype == torch.int64
    assert torch.equal(tokens, logits.argmax(dim=1)), (tokens, logits.argmax(dim=1))
    return tokens


@pytest.mark.sampled(by="type_name")
@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("shape", [(1, 256), (37, 512), (1000, 256)])
def test_tokens_are_the_argmax_of_the_same_logits(type_name: str, shape: tuple[int, int]) -> None:
    n, k = shape
    ggml_type, _, packed = _packed(type_name, n, k, n + k)
    assert gguf_packable(ggml_type, 8)
    for bits in (8, 16, 32):
        for batch in (1, 9, 33):
            x = torch.randn(batch, k, generator=torch.Generator().manual_seed(batch)) * 3
            _check(x, packed, ggml_type, n, bits)
            if bits == 8 and batch == 33:  # the AMX tiles off, where they were on: the folding path
                gguf_set_amx(False)
                try:
                    _check(x, packed, ggml_type, n, bits)
                finally:
                    gguf_set_amx(True)


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_K"])
def test_equal_largest_logits_give_the_first(type_name: str) -> None:
    """The weight row with the largest logit copied to rows 499 (the end of the first thread's range) and 900
    (the second's): the three logits are equal and the largest; the first of them wins."""
    n, k = 1000, 256
    ggml_type, rows, packed = _packed(type_name, n, k, 7)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(5))
    top = gguf_packed_matmul(x, packed, ggml_type, n, 8).argmax(dim=1)
    assert top[0] not in (499, 900)
    rows[499] = rows[900] = rows[top[0]]
    packed = gguf_pack(torch.from_numpy(rows), ggml_type)
    tokens = _check(x, packed, ggml_type, n, 8)
    logits = gguf_packed_matmul(x, packed, ggml_type, n, 8)
    assert tokens[0] == min(top[0].item(), 499)
    assert logits[0, top[0]] == logits[0, 499] == logits[0, 900] == logits[0].max()


def test_a_nan_logit_wins_and_a_nan_activation_row_gives_zero() -> None:
    """A weight row whose block scale is NaN makes that logit NaN in every row: the first NaN is the answer
    (torch's); an activation row with a NaN makes its whole row NaN: token 0; the other rows keep theirs."""
    n, k = 1000, 256
    ggml_type, rows, _ = _packed("Q8_0", n, k, 11)
    for nan_row in (700, 720):
        rows[nan_row, :2] = np.array([np.nan], dtype=np.float16).view(np.uint8)  # the first block's d
    packed = gguf_pack(torch.from_numpy(rows), ggml_type)
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(3))
    x[2, 17] = float("nan")
    tokens = _check(x, packed, ggml_type, n, 8)
    assert tokens.tolist() == [700, 700, 0, 700]


def test_an_empty_batch_and_bad_inputs() -> None:
    ggml_type, _, packed = _packed("Q8_0", 37, 256, 1)
    logits, tokens = gguf_packed_matmul_greedy(torch.zeros(0, 256), packed, ggml_type, 37, 8)
    assert logits.shape == (0, 37) and tokens.shape == (0,)
    with pytest.raises(RuntimeError, match="activation_bits must be 8, 16 or 32"):
        gguf_packed_matmul_greedy(torch.zeros(1, 256), packed, ggml_type, 37, 4)
    with pytest.raises(RuntimeError, match="contiguous uint8 output of gguf_pack for 49 rows"):
        gguf_packed_matmul_greedy(torch.zeros(1, 256), packed, ggml_type, 49, 8)
    with pytest.raises(RuntimeError, match="float32"):
        gguf_packed_matmul_greedy(torch.zeros(1, 256, dtype=torch.float64), packed, ggml_type, 37, 8)
