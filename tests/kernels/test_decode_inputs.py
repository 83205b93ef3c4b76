"""The native steady-decode helpers (kernels/cpu/decode_inputs.cpp) against their numpy implementation
(worker/decode_inputs.py) on random rows, positions and multi-group block tables, and their refusals of
indices outside the arrays, mismatched lengths and arrays of another dtype."""

import numpy as np
import pytest
import torch

from pagedserve.kernels.cpu import load_cpu_kernels
from pagedserve.worker.decode_inputs import DecodeInputs, decode_buffer_size, decode_inputs_for

pytestmark = pytest.mark.skipif(
    load_cpu_kernels().module is None, reason=f"native CPU kernels unavailable: {load_cpu_kernels().error}"
)


def native() -> DecodeInputs:
    helpers = decode_inputs_for(torch.device("cpu"))
    assert not isinstance(helpers, DecodeInputs)
    return helpers


def token_arrays(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return rng.integers(0, 1000, (9, 40)), rng.integers(0, 40, 9), rng.integers(0, 40, 9)


@pytest.mark.parametrize("seed", range(5))
def test_write_next_tokens_equals_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    arrays = token_arrays(rng)
    expected = [a.copy() for a in arrays]
    n = int(rng.integers(0, 9))
    rows = rng.permutation(9)[:n].tolist()
    starts = rng.integers(0, 40, n).tolist()
    tokens = rng.integers(0, 2**40, n).tolist()
    computed = rng.integers(0, 40, n).tolist()
    native().write_next_tokens(*arrays, rows, starts, tokens, computed)
    DecodeInputs().write_next_tokens(*expected, rows, starts, tokens, computed)
    for got, want in zip(arrays, expected):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("seed", range(5))
def test_decode_inputs_equal_numpy(groups: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    block_size = int(rng.choice([1, 16, 32]))
    num_blocks = rng.integers(1, 7, 11)
    table = np.zeros((groups, 11, 8), dtype=np.int64)
    for row, count in enumerate(num_blocks):
        table[:, row, :count] = rng.integers(1, 500, (groups, count))
    rows = rng.permutation(11)[: int(rng.integers(1, 12))]
    # Each row's next position lies in its last block, as a decode's does.
    starts = [int((num_blocks[r] - 1) * block_size + rng.integers(0, block_size)) for r in rows]
    tokens = rng.integers(0, 2**40, len(rows)).tolist()
    # NOTE: buffers of leftover values: every value a step reads must be written
    got, want = (np.full(decode_buffer_size(len(rows), table) + 3, -7, np.int64) for _ in range(2))
    width = native().decode_inputs(table, num_blocks, rows, starts, tokens, block_size, got)
    assert width == DecodeInputs().decode_inputs(table, num_blocks, rows, starts, tokens, block_size, want)
    assert width == num_blocks[rows].max()
    np.testing.assert_array_equal(got, want)
    n = len(rows)
    assert got[:n].tolist() == tokens and got[n : 2 * n].tolist() == starts
    assert got[2 * n : 3 * n].tolist() == [s + 1 for s in starts]
    tables = got[(3 + groups) * n : (3 + groups) * n + groups * n * width].reshape(groups, n, width)
    np.testing.assert_array_equal(tables, table[:, rows, :width])
    assert (got[(3 + groups) * n + groups * n * width :] == -7).all()


def test_bad_inputs_are_refused() -> None:
    helpers = native()
    token_ids, num_tokens, num_computed = (
        np.zeros((4, 8), np.int64),
        np.zeros(4, np.int64),
        np.zeros(4, np.int64),
    )
    arrays = (token_ids, num_tokens, num_computed)
    for rows, starts in (([4], [0]), ([-1], [0]), ([0], [8]), ([0], [-1]), ([2**63 - 1], [0])):
        with pytest.raises(IndexError, match="outside"):
            helpers.write_next_tokens(*arrays, rows, starts, [1], [0])
    with pytest.raises(ValueError, match="1 values for 2 rows"):
        helpers.write_next_tokens(*arrays, [0, 1], [0], [1, 2], [0, 0])
    for wrong in (
        token_ids.astype(np.int32),
        np.zeros((4, 16), np.int64)[:, ::2],
        token_ids.tolist(),
    ):
        with pytest.raises(TypeError):  # never a converted copy, whose writes would be lost
            helpers.write_next_tokens(wrong, num_tokens, num_computed, [0], [0], [1], [0])
    out = np.zeros(64, np.int64)
    with pytest.raises(TypeError):
        helpers.decode_inputs(
            np.ones((1, 4, 2), np.int32), np.full(4, 2, np.int64), np.array([0]), [0], [5], 16, out
        )
    for wrong_out in (out.astype(np.int32), np.zeros(128, np.int64)[::2]):
        with pytest.raises(TypeError):  # never a converted copy, whose writes would be lost
            helpers.decode_inputs(
                np.ones((1, 4, 2), np.int64), np.full(4, 2, np.int64), np.array([0]), [0], [5], 16, wrong_out
            )
    with pytest.raises(TypeError):  # 2**64 is no int64
        helpers.write_next_tokens(*arrays, [0], [0], [2**64], [0])
    assert not token_ids.any() and not num_tokens.any() and not num_computed.any()
    table, num_blocks = np.ones((1, 4, 2), np.int64), np.full(4, 2, np.int64)
    with pytest.raises(IndexError, match="block index"):  # position 32 lies past two blocks of 16
        helpers.decode_inputs(table, num_blocks, np.array([0]), [32], [5], 16, out)
    with pytest.raises(IndexError, match="row"):
        helpers.decode_inputs(table, num_blocks, np.array([4]), [0], [5], 16, out)
    with pytest.raises(ValueError, match="block_size"):
        helpers.decode_inputs(table, num_blocks, np.array([0]), [0], [5], 0, out)
    for implementation in (helpers, DecodeInputs()):
        with pytest.raises(ValueError, match="out holds 5 values"):  # 1 row: 4 + 2 values
            implementation.decode_inputs(table, num_blocks, np.array([0]), [0], [5], 16, out[:5])
        assert implementation.decode_inputs(table, num_blocks, np.array([], np.int64), [], [], 16, out) == 0
    with pytest.raises(IndexError, match="table width"):  # a row claiming more blocks than the table holds
        helpers.decode_inputs(table, np.full(4, 3, np.int64), np.array([0]), [0], [5], 16, out)
