"""Swap preemption, the host side: a second block pool in host memory holding preempted requests' KV.

Pure bookkeeping, like the device pool: the scheduler lists the block moves in its output
(`blocks_to_swap_out` / `blocks_to_swap_in`) and the workers copy the K/V.
"""

from collections import Counter

from pagedserve.core.block_pool import BlockPool, KVCacheBlock
from pagedserve.core.kv_cache_manager import KVCacheManager, Plan
from pagedserve.core.request import Request

Tables = dict[str, list[KVCacheBlock]]


class SwapSpace:
    """Host blocks of swapped-out requests. The requests of a group swap out and in together, and a
    block several of them share is moved once, so the sharing survives the round trip. Entries a window
    group freed (the device pool's null block) stay that null block in the host tables: nothing to copy
    or hold, and they come back as they left."""

    def __init__(self, num_blocks: int) -> None:
        # NOTE: host ids are the workers' host rows 0..num_blocks-1: no null block (nothing pads them).
        self.pool = BlockPool(num_blocks, reserve_null_block=False)
        self.tables: Tables = {}
        self.device_null_block: KVCacheBlock | None = None  # the placeholder of freed entries

    @property
    def num_blocks(self) -> int:
        return self.pool.num_usable_blocks

    def swap_out(self, requests: list[Request], kv: KVCacheManager) -> list[tuple[int, int]] | None:
        """Move the requests' blocks to host blocks and drop their device references. Returns the
        (device, host) block pairs to copy, or None (nothing changed) when the host pool is short."""
        self.device_null_block = kv.block_pool.null_block
        tables = {r.request_id: kv.req_to_blocks.get(r.request_id, []) for r in requests}
        if _num_distinct(tables, self.device_null_block) > self.pool.get_num_free_blocks():
            return None
        host_tables, pairs = _move(tables, self.pool, self.device_null_block)
        self.tables.update(host_tables)
        for request in requests:
            kv.free(request)
        return pairs

    def num_blocks_to_resume(self, requests: list[Request], plan: Plan, kv: KVCacheManager) -> int:
        """Device blocks that swapping `requests` in and then growing them by `plan` needs."""
        tables = {request.request_id: self.tables[request.request_id] for request in requests}
        # NOTE: the host blocks carry the same reference counts the device blocks will have.
        return _num_distinct(tables, self.device_null_block) + kv.num_blocks_needed(plan, tables)

    def swap_in(self, requests: list[Request], kv: KVCacheManager) -> list[tuple[int, int]]:
        """Give the requests device blocks again; returns the (host, device) pairs to copy. The caller
        checks that the device pool has the blocks (`num_blocks_to_resume`)."""
        tables = {r.request_id: self.tables.pop(r.request_id) for r in requests}
        device_tables, pairs = _move(tables, kv.block_pool, self.device_null_block)
        kv.req_to_blocks.update(device_tables)
        for table in tables.values():
            self.pool.free(self._held(table))
        return pairs

    def discard(self, request: Request) -> None:
        """Drop a swapped-out request's host blocks (it was aborted)."""
        self.pool.free(self._held(self.tables.pop(request.request_id, [])))

    def num_free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()

    def _held(self, table: list[KVCacheBlock]) -> list[KVCacheBlock]:
        return [block for block in table if block is not self.device_null_block]


def _num_distinct(tables: Tables, null_block: KVCacheBlock | None) -> int:
    return len({block.block_id for table in tables.values() for block in table if block is not null_block})


def _move(
    tables: Tables, pool: BlockPool, null_block: KVCacheBlock | None
) -> tuple[Tables, list[tuple[int, int]]]:
    """Allocate one block of `pool` per distinct block of `tables` (`null_block` entries stay), with as
    many references as the tables hold; returns the tables over the new blocks and the (old id, new id)
    pairs."""
    holders = Counter(
        block.block_id for table in tables.values() for block in table if block is not null_block
    )
    targets = dict(zip(holders, pool.allocate(len(holders))))
    for block_id, count in holders.items():
        pool.touch([targets[block_id]] * (count - 1))
    moved = {
        request_id: [block if block is null_block else targets[block.block_id] for block in table]
        for request_id, table in tables.items()
    }
    return moved, [(block_id, target.block_id) for block_id, target in targets.items()]
