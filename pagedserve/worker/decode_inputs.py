"""A steady decode step's inputs (input_batch.py's fast path): each row's one new token written into the
persistent arrays, then the step's inputs for one token per row written into a buffer that the decode
layout keeps (`DecodeInputBuffer`), whose tensors are made once. Two implementations of the helpers, one
interface: numpy's (the reference, and what runs without the native CPU kernels) and the native one
(kernels/cpu/decode_inputs.cpp), one call each where numpy makes about a dozen. Beside a CPU forward each
numpy or torch call costs several microseconds, its code and data back from memory."""

from typing import cast

import numpy as np
import torch

from pagedserve.kernels.cpu import load_cpu_kernels
from pagedserve.worker.block_table import BlockTables, gather_rows, slot_mapping
from pagedserve.worker.mrope_positions import MRopePositions


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
        out: np.ndarray,
    ) -> int:
        """Write into `out` one after the other: input_ids [n], positions [n], seq_lens [n], slot_mapping
        [groups, n] and block_tables [groups, n, width] of one token per row of `rows`, tokens[i] at
        position starts[i] (`table` and `num_blocks`: a BlockTables' arrays); returns width. `out` holds
        `decode_buffer_size(n, table)` values."""
        n, groups, needed = len(rows), table.shape[0], decode_buffer_size(len(rows), table)
        if out.ndim != 1 or out.size < needed:
            raise ValueError(f"out holds {out.size} values; the inputs of {n} rows need {needed}")
        positions = np.array(starts, dtype=np.int64)
        tables = gather_rows(table, num_blocks, rows)
        width: int = tables.shape[2]
        out[:n], out[n : 2 * n], out[2 * n : 3 * n] = tokens, positions, positions + 1
        out[3 * n : (3 + groups) * n] = slot_mapping(table, rows, positions, block_size).reshape(-1)
        out[(3 + groups) * n : (3 + groups) * n + tables.size] = tables.reshape(-1)
        return width


def decode_buffer_size(num_rows: int, table: np.ndarray) -> int:
    """The values a decode step's inputs of `num_rows` rows take at most, for a BlockTables' `table`."""
    groups, _, max_width = table.shape
    return int((3 + groups) * num_rows + groups * num_rows * max_width)


class DecodeInputBuffer:
    """A repeated decode layout's inputs: one int64 host buffer that each step rewrites in place (one call
    of the helpers), and the step's tensors, views made once (again only when the number of rows or the
    tables' width changes). `pack`: off the CPU the host buffer is pinned and each step copies what it
    wrote to a device buffer the views show, in one copy; on the CPU the model reads the host buffer
    itself. `mrope`: an M-RoPE family's positions, [3, rows] after the tables, from the helpers'
    positions. NOTE: the tensors are the same objects every step, rewritten: what a step hands on must be
    used within the step. The buffers grow, never shrink, and are never cleared: each step writes every
    value it reads."""

    def __init__(
        self,
        num_groups: int,
        block_size: int,
        device: torch.device,
        pack: bool,
        mrope: MRopePositions | None = None,
    ) -> None:
        self.num_groups, self.block_size, self.device, self.pack = num_groups, block_size, device, pack
        self.mrope = mrope
        self.pinned = device.type == "cuda"
        self.host = np.zeros(0, dtype=np.int64)
        self._allocate(0)  # the host buffer (and off the CPU its device copy), grown at the first step
        self.tensors: dict[str, torch.Tensor] = {}
        self.seq_lens = self.host  # the host view of the lengths (the attention metadata's list)
        self._copy: tuple[torch.Tensor, torch.Tensor] | None = None  # (device, host) prefix the step wrote
        self._copied: torch.cuda.Event | None = None  # the last copy (the host buffer is reused after it)

    def fill(
        self,
        helpers: DecodeInputs,
        tables: BlockTables,
        rows: np.ndarray,
        next_tokens: tuple[list[int], list[int]],
    ) -> dict[str, torch.Tensor]:
        """The step's "input_ids", "positions", "seq_lens", "block_tables{g}" and "slot_mapping{g}": one
        token per row of `rows`, `next_tokens` (positions, token ids), with `helpers`."""
        needed = decode_buffer_size(len(rows), tables.table) + (3 * len(rows) if self.mrope else 0)
        if self.host.size < needed:
            self._allocate(needed)
        if self._copied is not None:
            self._copied.synchronize()
        starts, tokens = next_tokens
        width = helpers.decode_inputs(
            tables.table, tables.num_blocks, rows, starts, tokens, self.block_size, self.host
        )
        if (len(rows), width) != self._shape:
            self._view(len(rows), width)
        if self.mrope is not None:
            self._mrope_host[...] = self.mrope.positions(rows, self.host[len(rows) : 2 * len(rows)])
        if self._copy is not None:
            device_prefix, host_prefix = self._copy
            device_prefix.copy_(host_prefix, non_blocking=self.pinned)
            if self.pinned:
                self._copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
                self._copied.record()
        return self.tensors

    def _allocate(self, size: int) -> None:
        host = torch.empty(max(size, 2 * self.host.size), dtype=torch.int64, pin_memory=self.pinned)
        self.host, self._host_tensor = host.numpy(), host
        self._device_buffer = torch.empty_like(host, device=self.device) if self.pack else host
        self._shape = (-1, -1)

    def _view(self, n: int, width: int) -> None:
        """The tensors over the buffer (the device copy when packing) for `n` rows and tables of `width`."""
        groups = self.num_groups
        buffer = self._device_buffer
        slots, tables = 3 * n, (3 + groups) * n
        used = tables + groups * n * width
        positions = buffer[n : 2 * n]
        if self.mrope is not None:
            self._mrope_host = self.host[used : used + 3 * n].reshape(3, n)
            positions, used = buffer[used : used + 3 * n].view(3, n), used + 3 * n
        self.tensors = {
            "input_ids": buffer[:n],
            "positions": positions,
            "seq_lens": buffer[2 * n : 3 * n],
            **{f"slot_mapping{g}": buffer[slots + g * n : slots + (g + 1) * n] for g in range(groups)},
            **{
                f"block_tables{g}": buffer[tables : tables + groups * n * width].view(groups, n, width)[g]
                for g in range(groups)
            },
        }
        self.seq_lens = self.host[2 * n : 3 * n]
        self._copy = (buffer[:used], self._host_tensor[:used]) if self.pack else None
        self._shape = (n, width)


def decode_inputs_for(device: torch.device) -> DecodeInputs:
    """The native helpers on a CPU device whose native kernels are loaded (the CPU platform loads them),
    else numpy's. NOTE: never loaded for another device: a first use may compile the library."""
    module = load_cpu_kernels().module if device.type == "cpu" else None
    return DecodeInputs() if module is None else cast(DecodeInputs, module)
