"""A compact picture of the KV block pool for the dashboard: one cell per block (or per group of blocks
when the pool is large), saying who holds it. Read in the engine core between steps."""
from typing import Any

from pagedserve.core.kv_cache_manager import KVCacheManager
from pagedserve.protocol import BlockSnapshot
from pagedserve.utils import cdiv

# Cell values besides k >= 1 (held by request_ids[k - 1] alone).
FREE, CACHED, SHARED = 0, -1, -2
MAX_CELLS = 4096  # larger pools are drawn a group of blocks per cell


def snapshot_blocks(kv: KVCacheManager) -> BlockSnapshot:
    """Every usable block (the null block 0 left out): free, free but holding a revivable cached prefix,
    shared by several requests, or held by one request. A cell of several blocks shows the most
    telling state among them (held > shared > cached > free)."""
    pool = kv.block_pool
    num_blocks = pool.num_blocks - 1
    owner = [FREE] * num_blocks
    request_ids = list(kv.req_to_blocks)
    for index, request_id in enumerate(request_ids, start=1):
        for block in kv.req_to_blocks[request_id]:
            if block.block_id > 0:
                owner[block.block_id - 1] = SHARED if block.ref_cnt > 1 else index
    num_cached = 0
    for block in pool.blocks[1:]:
        if block.ref_cnt == 0 and _cached(block):
            owner[block.block_id - 1] = CACHED
            num_cached += 1
    per_cell = cdiv(num_blocks, MAX_CELLS)
    cells = owner if per_cell == 1 else [_dominant(owner[i:i + per_cell]) for i in range(0, num_blocks, per_cell)]
    num_free = sum(1 for value in owner if value in (FREE, CACHED))
    return BlockSnapshot(num_blocks, kv.block_size, per_cell, cells, request_ids, num_free, num_cached,
                         sum(1 for value in owner if value == SHARED))


def _cached(block: Any) -> bool:
    # NOTE: getattr: the prefix-cache hash exists only where prefix caching is built in.
    return getattr(block, "block_hash", None) is not None


def _dominant(values: list[int]) -> int:
    held = [v for v in values if v > 0]
    if held:
        return max(set(held), key=held.count)
    for state in (SHARED, CACHED):
        if state in values:
            return state
    return FREE
