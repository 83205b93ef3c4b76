"""The KV manager's state, every request's block table, and what can be read from it without changing it:
the blocks a plan would need or a release would free, what each request holds, the counters and the
block owners picture. `KVCacheManager` (kv_cache_manager.py) is these tables plus the changes to them."""

from collections import Counter

from pagedserve.config.kv_layout import KVCacheGroups
from pagedserve.core.block_pool import BlockPool, KVCacheBlock
from pagedserve.core.kv_cache_interface import CACHED, FREE, SHARED, BlockOwners, KVCacheStats, Plan
from pagedserve.core.request import Request
from pagedserve.core.swap import SwapSpace


class KVCacheTables:
    """Every request's block table, and the arithmetic over them (never a change).

    KV cache groups (`groups`): a request's tables are kept as one flat list, entry-major: block
    `entry * num_groups + g` holds tokens [entry * block_size, (entry + 1) * block_size) of group g's
    layers, so a table grows by whole entries (one block per group) and the ids travel to the workers as
    one list (they take every num_groups-th id for a group's table). Blocks a window group no longer reads
    are freed as the request grows and their entries become the null block (positions keep their index):
    a window group of W holds at most ceil(W / block_size) + 1 blocks while the request decodes, a
    full-attention group every block."""

    def __init__(
        self, num_blocks: int, groups: KVCacheGroups, enable_caching: bool = True, num_host_blocks: int = 0
    ) -> None:
        self.groups = groups
        self.block_size = groups.block_size
        self.num_groups = self.groups.num_groups
        self.enable_caching = enable_caching
        # Per request and group: leading entries of the group's table already the null block.
        self.num_freed_leading: dict[str, list[int]] = {}
        self.block_pool = BlockPool(num_blocks)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_blocks: dict[
            str, int
        ] = {}  # leading entries of each table already offered to the cache
        self.prefix_cache_queries = 0  # tokens looked up (cumulative)
        self.prefix_cache_hits = 0  # tokens found
        # Swap preemption's host blocks (--swap-space), None without.
        self.swap_space = SwapSpace(num_host_blocks, self.block_pool.null_block) if num_host_blocks else None

    def grows_in_place(self, plan: Plan) -> bool:
        """Every (request, num_new_tokens) of `plan` fits in the blocks its request holds and writes none
        that others hold, frees none (no window) and fills none for the prefix cache: `allocate_slots`
        would change nothing and return an empty `SlotAllocation` (the common decode step, checked
        without building one)."""
        if self.groups.has_windows:
            return False
        size, cached = self.block_size, self.num_cached_blocks
        for request, num_new in plan:
            blocks = self.req_to_blocks.get(request.request_id)
            start = request.num_computed_tokens
            end = start + num_new
            if (
                not blocks
                or end > len(blocks) * size
                or blocks[start // size].ref_cnt > 1
                or (
                    self.enable_caching
                    and min(end, request.num_tokens) // size > cached.get(request.request_id, 0)
                )
            ):
                return False
        return True

    def num_blocks_needed(self, plan: Plan, tables: dict[str, list[KVCacheBlock]] | None = None) -> int:
        """Free blocks that `allocate_slots` needs to grow every (request, num_new_tokens) of `plan`,
        in order, copies on write included. For requests that already hold their blocks: in this
        manager, or in `tables` (swapped out: blocks of another pool with the same sharing)."""
        tables = self.req_to_blocks if tables is None else tables
        total, writers = 0, Counter[int]()
        shared: dict[int, KVCacheBlock] = {}
        for request, num_new in plan:
            blocks = tables.get(request.request_id, [])
            total += max(0, self._num_blocks(request.num_computed_tokens + num_new) - len(blocks))
            for index in self._shared_blocks_written(blocks, request.num_computed_tokens, num_new):
                writers[blocks[index].block_id] += 1
                shared[blocks[index].block_id] = blocks[index]
        # NOTE: of k writers into a block with ref_cnt c, each copies while others hold it; the last
        # one writes in place when c == k.
        return total + sum(k - (shared[bid].ref_cnt == k) for bid, k in writers.items())

    def num_blocks_to_grow(
        self, request: Request, num_tokens: int, hits: list[KVCacheBlock] | None = None
    ) -> int:
        """Free blocks `request` takes to hold its first `num_tokens` tokens: the table entries beyond those
        it holds and its prefix hits `hits`, and the hits that come off the free list (cached blocks
        nobody holds)."""
        held = self.num_table_entries(request.request_id) + len(hits or [])
        revived = sum(1 for block in hits or [] if block.ref_cnt == 0)
        return max(0, self.groups.table_entries(num_tokens) - held) + revived

    def num_blocks_released(self, requests: list[Request], hits: list[KVCacheBlock] | None) -> int:
        """Blocks that would be free once `requests` let go of theirs (swapped out or freed): those nobody
        else holds, less the prefix hits `hits` of a request to admit (freed, they come off the free list
        again for it)."""
        held = [block for r in requests for block in self._held(self.req_to_blocks.get(r.request_id, []))]
        refs = Counter(block.block_id for block in held)
        kept = {block.block_id for block in hits or []}
        distinct = {block.block_id: block for block in held}
        return sum(1 for bid, block in distinct.items() if block.ref_cnt == refs[bid] and bid not in kept)

    def get_block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.req_to_blocks.get(request_id, [])]

    @property
    def num_usable_blocks(self) -> int:
        """Blocks the requests can hold: every block but the reserved null block."""
        return self.block_pool.num_usable_blocks

    def num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    def usage(self) -> float:
        return self.block_pool.usage()

    def block_owners(self) -> BlockOwners:
        pool = self.block_pool
        owners = [FREE] * pool.num_usable_blocks
        request_ids = list(self.req_to_blocks)
        for index, request_id in enumerate(request_ids, start=1):
            for block in self.req_to_blocks[request_id]:
                if block.block_id > 0:
                    owners[block.block_id - 1] = SHARED if block.ref_cnt > 1 else index
        for block in pool.cached.values():
            if block.ref_cnt == 0:
                owners[block.block_id - 1] = CACHED
        swap = self.swap_space
        return BlockOwners(
            request_ids,
            owners,
            self.block_size,
            0 if swap is None else swap.num_blocks,
            0 if swap is None else swap.num_free_blocks(),
        )

    def stats(self) -> KVCacheStats:
        pool = self.block_pool
        return KVCacheStats(
            pool.usage(),
            pool.get_num_free_blocks(),
            self.num_allocated_slots(),
            pool.num_shared_blocks,
            pool.num_blocks_saved,
            self.prefix_cache_queries,
            self.prefix_cache_hits,
        )

    def num_allocated_slots(self) -> int:
        """Slots in the requests' tables; a shared block counts once per holder, a freed one not at all."""
        if not self.groups.has_windows:  # NOTE: only a window frees entries: every entry is held (per step)
            return self.block_size * sum(map(len, self.req_to_blocks.values()))
        return self.block_size * sum(len(self._held(blocks)) for blocks in self.req_to_blocks.values())

    def num_table_entries(self, request_id: str) -> int:
        """Blocks in the request's tables, every group's (those freed out of a window included)."""
        return len(self.req_to_blocks.get(request_id, ()))

    def num_held_blocks(self, request_id: str) -> int:
        """Blocks the request holds (its table less the entries freed out of every window)."""
        return len(self._held(self.req_to_blocks.get(request_id, [])))

    def num_held_blocks_per_group(self, request_id: str) -> list[int]:
        """Blocks the request holds in each KV cache group's table."""
        blocks = self.req_to_blocks.get(request_id, [])
        return [len(self._held(blocks[group :: self.num_groups])) for group in range(self.num_groups)]

    def _held(self, blocks: list[KVCacheBlock]) -> list[KVCacheBlock]:
        return [block for block in blocks if block is not self.block_pool.null_block]

    def _num_blocks(self, num_tokens: int) -> int:
        return self.groups.table_entries(num_tokens)

    def _shared_blocks_written(
        self, blocks: list[KVCacheBlock], start: int, num_new_tokens: int
    ) -> list[int]:
        """Indices of the blocks (one per group) that token `start` goes into that exist and others hold
        too."""
        first = start // self.block_size * self.num_groups
        if num_new_tokens <= 0:
            return []
        return [
            index
            for index in range(first, min(len(blocks), first + self.num_groups))
            if blocks[index].ref_cnt > 1 and blocks[index] is not self.block_pool.null_block
        ]
