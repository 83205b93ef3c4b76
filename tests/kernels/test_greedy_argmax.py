"""The greedy sampler's native argmax (kernels/cpu/greedy_argmax.cpp) against numpy's argmax, the reference
it replaces: the first index of each row's largest value, or of its first NaN; on random rows of odd widths
(the vector loops' tails), ties, infinities, signed zeros, strided rows, 1 to 300 rows."""

import numpy as np
import pytest
import torch

from pagedserve.kernels import cpu as cpu_kernels
from pagedserve.layers.sampler import greedy


@pytest.fixture(scope="module", autouse=True)
def kernels_built() -> None:
    error = cpu_kernels.load_cpu_kernels().error
    if error is not None:
        pytest.skip(f"native CPU kernels unavailable: {error}")


def native(logits: torch.Tensor) -> np.ndarray:
    return torch.ops.pagedserve.greedy_argmax(logits).numpy()


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("vocab", [1, 15, 63, 64, 65, 1000, 49152 + 7])
def test_random_rows(rows: int, vocab: int) -> None:
    generator = torch.Generator().manual_seed(rows * vocab)
    logits = torch.randn(rows, vocab, generator=generator)
    np.testing.assert_array_equal(native(logits), logits.numpy().argmax(axis=1))


@pytest.mark.parametrize("vocab", [5, 70, 4099])
def test_ties_infinities_nans_and_zeros(vocab: int) -> None:
    """Each row plants its case at places inside and past the vector loops (the tail)."""
    rows = []
    for place in sorted({0, 3, vocab // 2, vocab - 2, vocab - 1}):
        for case in range(6):
            row = np.random.default_rng(place * 10 + case).standard_normal(vocab).astype(np.float32)
            if case == 0:  # the largest value twice: the first wins
                row[place] = row[-1] = 50.0
            elif case == 1:
                row[place] = np.inf
            elif case == 2:  # a NaN wins over everything, even +inf before it
                row[0], row[place] = np.inf, np.nan
                row[-1] = np.nan
            elif case == 3:
                row[:] = -np.inf
                row[place] = -1e30
            elif case == 4:  # -0.0 and 0.0 are equal: the first of them
                row[:] = -1.0
                row[place], row[-1] = -0.0, 0.0
            else:
                row[:] = -np.inf
            rows.append(row)
    logits = torch.from_numpy(np.stack(rows))
    np.testing.assert_array_equal(native(logits), logits.numpy().argmax(axis=1))


def test_strided_rows_and_the_sampler_entry() -> None:
    """Rows that are views into wider rows (a vocabulary padded for tensor parallelism) read only their
    own values; the sampler's `greedy` takes the native path and returns int64 ids."""
    wide = torch.randn(9, 1100, generator=torch.Generator().manual_seed(1))
    wide[:, 1000:] = 100.0  # padding past the vocabulary must never win
    logits = wide[:, :1000]
    expected = logits.numpy().argmax(axis=1)
    np.testing.assert_array_equal(native(logits), expected)
    tokens = greedy(logits)
    assert tokens.dtype == torch.int64
    np.testing.assert_array_equal(tokens.numpy(), expected)


@pytest.mark.parametrize(
    "logits, message",
    [
        (torch.zeros(2, 3, dtype=torch.float64), "float32"),
        (torch.zeros(6), "rows, vocab"),
        (torch.zeros(2, 0), "rows, vocab"),
        (torch.zeros(3, 2).t(), "contiguous"),
    ],
)
def test_refuses_what_it_cannot_read(logits: torch.Tensor, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        torch.ops.pagedserve.greedy_argmax(logits)
