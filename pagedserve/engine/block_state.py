"""A compact picture of the KV block pool for the dashboard: one cell per block (or per group of blocks
when the pool is large), saying who holds it. Taken in the engine core between steps."""

from pagedserve.core.kv_cache_interface import CACHED, FREE, SHARED, BlockOwners
from pagedserve.protocol import BlockSnapshot
from pagedserve.utils import cdiv

MAX_CELLS = 4096  # larger pools are drawn a group of blocks per cell

__all__ = ["CACHED", "FREE", "MAX_CELLS", "SHARED", "snapshot_blocks"]


def snapshot_blocks(blocks: BlockOwners) -> BlockSnapshot:
    """Every usable block: free, free but holding a revivable cached prefix, shared by several requests,
    or held by one request. A cell of several blocks shows the most telling state among them
    (held > shared > cached > free). With the host blocks of the swap space counted."""
    owners = blocks.owners
    num_blocks = len(owners)
    per_cell = max(1, cdiv(num_blocks, MAX_CELLS))  # NOTE: the pooling runner has no blocks at all
    cells = (
        owners
        if per_cell == 1
        else [_dominant(owners[i : i + per_cell]) for i in range(0, num_blocks, per_cell)]
    )
    return BlockSnapshot(
        num_blocks,
        blocks.block_size,
        per_cell,
        cells,
        blocks.request_ids,
        sum(1 for value in owners if value in (FREE, CACHED)),
        owners.count(CACHED),
        owners.count(SHARED),
        blocks.num_host_blocks,
        blocks.num_free_host_blocks,
    )


def _dominant(values: list[int]) -> int:
    held = [v for v in values if v > 0]
    if held:
        return max(set(held), key=held.count)
    for state in (SHARED, CACHED):
        if state in values:
            return state
    return FREE
