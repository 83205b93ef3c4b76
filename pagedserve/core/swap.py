"""Swap preemption, the host side: a second block pool in host memory holding preempted requests' KV.

Pure bookkeeping, like the device pool: the KV manager (the only user) hands it tables to store and takes
them back; the scheduler lists the block moves in its output (`blocks_to_swap_out` / `blocks_to_swap_in`)
and the workers copy the K/V.
"""

from collections import Counter
from collections.abc import Iterable

from pagedserve.core.block_pool import BlockPool, KVCacheBlock

Tables = dict[str, list[KVCacheBlock]]


class SwapSpace:
    """Host blocks of swapped-out requests. The requests of a group swap out and in together, and a
    block several of them share is moved once, so the sharing survives the round trip. Entries a window
    group freed (the device pool's null block, `device_null_block`) stay that null block in the host
    tables: nothing to copy or hold, and they come back as they left."""

    def __init__(self, num_blocks: int, device_null_block: KVCacheBlock | None) -> None:
        # NOTE: host ids are the workers' host rows 0..num_blocks-1: no null block (nothing pads them).
        self.pool = BlockPool(num_blocks, reserve_null_block=False)
        self.tables: Tables = {}
        self.device_null_block = device_null_block

    @property
    def num_blocks(self) -> int:
        return self.pool.num_usable_blocks

    def store(self, tables: Tables) -> list[tuple[int, int]] | None:
        """Copy device `tables` into host blocks (the caller then drops the device references). Returns
        the (device, host) block pairs to copy, or None (nothing changed) when the host pool is short."""
        if num_distinct(tables, self.device_null_block) > self.pool.get_num_free_blocks():
            return None
        host_tables, pairs = _move(tables, self.pool, self.device_null_block)
        self.tables.update(host_tables)
        return pairs

    def held_tables(self, request_ids: Iterable[str]) -> Tables:
        """The host tables of swapped-out requests (they carry the reference counts the device blocks
        will have)."""
        return {request_id: self.tables[request_id] for request_id in request_ids}

    def load(
        self, request_ids: Iterable[str], device_pool: BlockPool
    ) -> tuple[Tables, list[tuple[int, int]]]:
        """Take the requests' tables out onto blocks of `device_pool`; returns the device tables and the
        (host, device) pairs to copy. The caller checks that the device pool has the blocks."""
        tables = {request_id: self.tables.pop(request_id) for request_id in request_ids}
        device_tables, pairs = _move(tables, device_pool, self.device_null_block)
        for table in tables.values():
            self.pool.free(self._held(table))
        return device_tables, pairs

    def discard(self, request_id: str) -> None:
        """Drop a swapped-out request's host blocks (it was aborted)."""
        self.pool.free(self._held(self.tables.pop(request_id, [])))

    def num_free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()

    def _held(self, table: list[KVCacheBlock]) -> list[KVCacheBlock]:
        return [block for block in table if block is not self.device_null_block]


def num_distinct(tables: Tables, null_block: KVCacheBlock | None) -> int:
    """Blocks the tables hold, each shared one once."""
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
