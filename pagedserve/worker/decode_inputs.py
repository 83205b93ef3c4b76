"""A steady decode step's host arrays (input_batch.py's fast path): each row's one new token written into
the persistent arrays, then the step's inputs gathered for one token per row. Two implementations of one
interface: numpy's (the reference, and what runs without the native CPU kernels) and the native one
(kernels/cpu/decode_inputs.cpp), one call each where numpy makes about a dozen. Beside a CPU forward each
numpy call costs several microseconds, its code and data back from memory."""

from typing import cast

import numpy as np
import torch

from pagedserve.kernels.cpu import load_cpu_kernels
from pagedserve.worker.block_table import gather_rows, slot_mapping


class DecodeInputs:
    """The numpy implementation, and the interface: the native module's functions take and return the
    same (its arrays must be int64 and C-ordered: it writes them in place)."""

    def write_next_tokens(
        self,
        token_ids: np.ndarray,
        num_tokens: np.ndarray,
        num_computed: np.ndarray,
        rows: list[int],
        starts: list[int],
        tokens: list[int],
        computed: list[int],
    ) -> None:
        """Row rows[i] knows one more token, tokens[i], at position starts[i], and has computed[i] of its
        tokens computed."""
        row_array, start_array = np.array(rows, dtype=np.int64), np.array(starts, dtype=np.int64)
        token_ids[row_array, start_array] = tokens
        num_tokens[row_array] = start_array + 1
        num_computed[row_array] = computed

    def decode_inputs(
        self,
        table: np.ndarray,
        num_blocks: np.ndarray,
        rows: np.ndarray,
        starts: list[int],
        tokens: list[int],
        block_size: int,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(input_ids, positions, seq_lens, block_tables [groups, rows, width], slot_mapping [groups, rows])
        of one token per row of `rows`, tokens[i] at position starts[i] (`table` and `num_blocks`: a
        BlockTables' arrays)."""
        positions = np.array(starts, dtype=np.int64)
        tables = gather_rows(table, num_blocks, rows)
        slots = slot_mapping(table, rows, positions, block_size)
        return np.array(tokens, dtype=np.int64), positions, positions + 1, tables, slots


def decode_inputs_for(device: torch.device) -> DecodeInputs:
    """The native helpers on a CPU device whose native kernels are loaded (the CPU platform loads them),
    else numpy's. NOTE: never loaded for another device: a first use may compile the library."""
    module = load_cpu_kernels().module if device.type == "cpu" else None
    return DecodeInputs() if module is None else cast(DecodeInputs, module)
