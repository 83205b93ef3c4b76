"""The native steady-decode helpers (kernels/cpu/decode_inputs.cpp) against their numpy implementation
(worker/decode_inputs.py) on random rows, positions and multi-group block tables, and their refusals of
indices outside the arrays, mismatched lengths and arrays of another dtype."""

import numpy as np
import pytest
import torch

from pagedserve.kernels.cpu import load_cpu_kernels
from pagedserve.worker.decode_inputs import DecodeInputs, decode_inputs_for

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
    got = native().decode_inputs(table, num_blocks, rows, starts, tokens, block_size)
    want = DecodeInputs().decode_inputs(table, num_blocks, rows, starts, tokens, block_size)
    for name, a, b in zip(["input_ids", "positions", "seq_lens", "tables", "slots"], got, want):
        assert a.dtype == np.int64 and a.shape == b.shape, name
        np.testing.assert_array_equal(a, b, err_msg=name)


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
    with pytest.raises(TypeError):
        helpers.decode_inputs(
            np.ones((1, 4, 2), np.int32), np.full(4, 2, np.int64), np.array([0]), [0], [5], 16
        )
    with pytest.raises(TypeError):  # 2**64 is no int64
        helpers.write_next_tokens(*arrays, [0], [0], [2**64], [0])
    assert not token_ids.any() and not num_tokens.any() and not num_computed.any()
    table, num_blocks = np.ones((1, 4, 2), np.int64), np.full(4, 2, np.int64)
    with pytest.raises(IndexError, match="block index"):  # position 32 lies past two blocks of 16
        helpers.decode_inputs(table, num_blocks, np.array([0]), [32], [5], 16)
    with pytest.raises(IndexError, match="row"):
        helpers.decode_inputs(table, num_blocks, np.array([4]), [0], [5], 16)
    with pytest.raises(ValueError, match="block_size"):
        helpers.decode_inputs(table, num_blocks, np.array([0]), [0], [5], 0)
    empty = [np.array([], np.int64), [], []]
    native_empty = helpers.decode_inputs(table, num_blocks, *empty, 16)
    for got, want in zip(native_empty, DecodeInputs().decode_inputs(table, num_blocks, *empty, 16)):
        assert got.shape == want.shape and got.dtype == want.dtype == np.int64
    with pytest.raises(IndexError, match="table width"):  # a row claiming more blocks than the table holds
        helpers.decode_inputs(table, np.full(4, 3, np.int64), np.array([0]), [0], [5], 16)
