"""The block tables of every request the worker holds, kept across steps and updated by the scheduler's
diff (new blocks appended, freed ones dropped), so a step's tables are one gather of its rows rather than
a rebuild from each request's Python list."""

import numpy as np


class BlockTables:
    """block ids [groups, rows, width]: row r holds one request's table in each KV cache group, padded with
    the null block 0. The KV manager lists a request's blocks entry-major (group g's table is every
    `num_groups`-th id from g); rows and width grow by doubling when a step needs more."""

    def __init__(self, num_groups: int, rows: int = 64, width: int = 16) -> None:
        self.num_groups = num_groups
        self.table = np.zeros((num_groups, rows, width), dtype=np.int64)
        self.num_blocks = np.zeros(rows, dtype=np.int64)  # entries per group, per row
        self.row_of: dict[str, int] = {}
        self._free_rows = list(range(rows - 1, -1, -1))

    def add(self, request_id: str, block_ids: list[int]) -> None:
        if not self._free_rows:
            self._grow(rows=2 * self.table.shape[1])
        row = self._free_rows.pop()
        self.row_of[request_id] = row
        self.num_blocks[row] = 0
        self.append(request_id, block_ids)

    def append(self, request_id: str, block_ids: list[int]) -> None:
        if not block_ids:
            return
        row = self.row_of[request_id]
        entries = np.asarray(block_ids, dtype=np.int64).reshape(-1, self.num_groups).T  # [groups, n]
        start = int(self.num_blocks[row])
        end = start + entries.shape[1]
        if end > self.table.shape[2]:
            self._grow(width=max(end, 2 * self.table.shape[2]))
        self.table[:, row, start:end] = entries
        self.num_blocks[row] = end

    def drop_last(self, request_id: str, num_block_ids: int) -> None:
        """Forget the last `num_block_ids` ids of the request's list (the scheduler freed them)."""
        row = self.row_of[request_id]
        end = int(self.num_blocks[row])
        start = end - num_block_ids // self.num_groups
        self.table[:, row, start:end] = 0
        self.num_blocks[row] = start

    def remove(self, request_id: str) -> None:
        row = self.row_of.pop(request_id, None)
        if row is not None:
            self.table[:, row, : self.num_blocks[row]] = 0
            self.num_blocks[row] = 0
            self._free_rows.append(row)

    def gather(self, request_ids: list[str]) -> np.ndarray:
        """The tables of `request_ids`, in that order: [groups, len(request_ids), their longest table]."""
        return self.gather_rows(
            np.fromiter((self.row_of[r] for r in request_ids), dtype=np.int64, count=len(request_ids))
        )

    def gather_rows(self, rows: np.ndarray) -> np.ndarray:
        """The tables of `rows`, in that order: [groups, len(rows), their longest table]."""
        return gather_rows(self.table, self.num_blocks, rows)

    def lengths(self, request_ids: list[str]) -> np.ndarray:
        """The number of blocks of each request's table (per group), in that order."""
        return self.num_blocks[[self.row_of[r] for r in request_ids]]

    def _grow(self, rows: int | None = None, width: int | None = None) -> None:
        groups, old_rows, old_width = self.table.shape
        rows, width = rows or old_rows, width or old_width
        table = np.zeros((groups, rows, width), dtype=np.int64)
        table[:, :old_rows, :old_width] = self.table
        self.table = table
        self.num_blocks = np.concatenate([self.num_blocks, np.zeros(rows - old_rows, dtype=np.int64)])
        self._free_rows = list(range(rows - 1, old_rows - 1, -1)) + self._free_rows


def gather_rows(table: np.ndarray, num_blocks: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The tables of `rows` in a BlockTables' `table` and `num_blocks`, in that order: [groups, len(rows),
    their longest table]."""
    width = int(num_blocks[rows].max()) if len(rows) else 0
    return table[:, rows, :width]


def slot_mapping(
    table: np.ndarray, token_rows: np.ndarray, positions: np.ndarray, block_size: int
) -> np.ndarray:
    """Each token's KV slot in each group [groups, tokens]: token i is at positions[i] of the request in row
    token_rows[i] of a BlockTables' `table`."""
    blocks, offsets = np.divmod(positions, block_size)
    slots: np.ndarray = table[:, token_rows, blocks] * block_size + offsets
    return slots
