"""Per-request block tables over the block pool: allocation, prefix caching, forks and copy-on-write, one
table per KV cache group (`config/kv_layout.py`)."""

from collections import Counter
from dataclasses import dataclass, field

from pagedserve.config.kv_layout import KVCacheGroups
from pagedserve.core.block_pool import BlockPool, KVCacheBlock
from pagedserve.core.hashing import extend_block_hashes
from pagedserve.core.prefix_hit import find_longest_cache_hit
from pagedserve.core.request import Request
from pagedserve.core.swap import SwapSpace, num_distinct

Plan = list[tuple[Request, int]]  # (request, number of new tokens to compute this step)


@dataclass(slots=True)
class SlotAllocation:
    """What one `allocate_slots` changed in a request's block table: the interface between the scheduler
    and the manager, so the scheduler never reads the manager's tables."""

    new_block_ids: list[int]  # appended to the table (prefix hits first)
    # Copies on write, (src, dst) block ids, the workers must make before the step's forward.
    copies: list[tuple[int, int]] = field(default_factory=list)

    @property
    def table_rewritten(self) -> bool:
        """A copy on write replaced a block mid-table: the workers need the whole table again."""
        return bool(self.copies)


# Block states in a BlockOwners picture, besides k >= 1 (held by request_ids[k - 1] alone).
FREE, CACHED, SHARED = 0, -1, -2


@dataclass(frozen=True, slots=True)
class BlockOwners:
    """Who holds each usable block (the null block left out), for the dashboard."""

    request_ids: list[str]
    # Per usable block: k >= 1 (request_ids[k - 1] alone), SHARED (several requests), CACHED (free but
    # holding a revivable cached prefix) or FREE.
    owners: list[int]
    block_size: int
    num_host_blocks: int = 0  # swap space
    num_free_host_blocks: int = 0


@dataclass(frozen=True, slots=True)
class KVCacheStats:
    """The manager's counters, as the scheduler reports them."""

    usage: float  # fraction of usable blocks held
    num_free_blocks: int
    num_allocated_slots: int  # slots in the tables; a shared block counts once per holder
    num_shared_blocks: int  # blocks held by more than one request
    num_blocks_saved: int  # blocks the holders would need on top if nothing were shared
    prefix_cache_queries: int  # tokens looked up (cumulative)
    prefix_cache_hits: int  # tokens found (cumulative)


class KVCacheManager:
    """Owns every request's block table. Blocks are allocated only as a request grows, so waste is at
    most one partly filled block per request, and all of them return to the pool when it ends.

    Sharing: a block may sit in several tables (`ref_cnt`). Full blocks are shared through the prefix
    cache (content hashes, `enable_caching`) and through forks; they are never written again. A partly
    filled block is shared only by a fork; whoever writes into it while others still hold it gets a
    copy first (copy-on-write): the `SlotAllocation` that `allocate_slots` returns lists the (src, dst)
    copies the workers must make before the step's forward.

    KV cache groups (`groups`): a request's tables are kept as one flat list, entry-major: block
    `entry * num_groups + g` holds tokens [entry * block_size, (entry + 1) * block_size) of group g's
    layers, so a table grows by whole entries (one block per group) and the ids travel to the workers as
    one list (they take every num_groups-th id for a group's table). Blocks a window group no longer reads
    are freed as the request grows and their entries become the null block (positions keep their index):
    a window group of W holds at most ceil(W / block_size) + 1 blocks while the request decodes, a
    full-attention group every block. The prefix cache keeps each group's blocks apart (keyed by the
    block's hash and its group); a hit is the longest prefix every group can serve (`core/prefix_hit.py`:
    a window group needs only the blocks its window still reads, the rest of its entries are the null
    block)."""

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

    def get_computed_blocks(self, request: Request) -> list[KVCacheBlock] | None:
        """The cached blocks of the longest prefix of the request's tokens that every KV cache group can
        serve (`core/prefix_hit.py`), verified token by token, entry-major like the tables (the null
        block where a window group needs none); `num_hit_tokens` says how many tokens they hold. It never
        covers the last token, so at least one is computed (its logits are sampled). None (no lookup)
        when caching is off, or for a request that wants prompt logprobs (every position must be
        computed)."""
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return None
        size, tokens = self.block_size, request.all_token_ids
        max_entries = (request.num_tokens - 1) // size
        extend_block_hashes(
            request.block_hashes,
            tokens,
            size,
            max_entries,
            request.cache_salt,
            request.lora_key,
            request.images,
        )
        return find_longest_cache_hit(self.block_pool, self.groups, request.block_hashes, tokens, max_entries)

    def num_hit_tokens(self, hits: list[KVCacheBlock] | None) -> int:
        """Tokens that the prefix hits `hits` (from `get_computed_blocks`) hold."""
        return len(hits or []) // self.num_groups * self.block_size

    def allocate_slots(
        self, request: Request, num_new_tokens: int, new_computed_blocks: list[KVCacheBlock] | None = None
    ) -> SlotAllocation | None:
        """Make room for `num_new_tokens` more tokens of `request` after its computed ones (and after
        `new_computed_blocks`, the prefix hits of a request being admitted, which the caller then counts
        as computed). Copies a shared, partly filled block before it is written. Returns what changed
        (the blocks appended, maybe none, and the copies to make), or None when the pool is short:
        nothing changed then, and the caller preempts someone or waits."""
        hits = new_computed_blocks or []
        blocks = self.req_to_blocks.get(request.request_id, [])
        # NOTE: blocks out of every window's reach go back first (a valid change whatever follows).
        self._free_unreachable(request.request_id, blocks, request.num_computed_tokens)
        start = request.num_computed_tokens + self.num_hit_tokens(hits)
        num_new_blocks = max(0, self._num_blocks(start + num_new_tokens) - len(blocks) - len(hits))
        shared = self._shared_blocks_written(blocks, start, num_new_tokens)
        revived = sum(1 for block in hits if block.ref_cnt == 0)
        if num_new_blocks + len(shared) + revived > self.block_pool.get_num_free_blocks():
            return None
        self.block_pool.touch(self._held(hits))
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        blocks.extend(hits)
        self._free_unreachable(request.request_id, blocks, start)
        copies = [self._copy_on_write(blocks, index) for index in shared]
        new_blocks = self.block_pool.allocate(num_new_blocks)
        blocks.extend(new_blocks)
        if new_computed_blocks is not None:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += self.num_hit_tokens(hits)
        # NOTE: draft tokens (past num_tokens) are not known to be the request's: never cached.
        self._cache_full_blocks(request, blocks, min(start + num_new_tokens, request.num_tokens))
        return SlotAllocation([block.block_id for block in hits + new_blocks], copies)

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

    @property
    def can_swap(self) -> bool:
        return self.swap_space is not None

    def swap_out(self, requests: list[Request]) -> list[tuple[int, int]] | None:
        """Move the requests' blocks (a group: blocks they share move once) to host blocks and free their
        device blocks. Returns the (device, host) pairs to copy, or None (nothing changed) without swap
        space or when it is short."""
        if self.swap_space is None:
            return None
        pairs = self.swap_space.store(
            {r.request_id: self.req_to_blocks.get(r.request_id, []) for r in requests}
        )
        if pairs is not None:
            for request in requests:
                self.free(request)
        return pairs

    def num_blocks_to_resume(self, requests: list[Request], plan: Plan) -> int:
        """Device blocks that swapping `requests` in and then growing them by `plan` needs."""
        assert self.swap_space is not None, "only a swap space holds swapped-out requests"
        tables = self.swap_space.held_tables(request.request_id for request in requests)
        return num_distinct(tables, self.block_pool.null_block) + self.num_blocks_needed(plan, tables)

    def swap_in(self, requests: list[Request]) -> list[tuple[int, int]]:
        """Give swapped-out requests device blocks again; returns the (host, device) pairs to copy. The
        caller checks the free blocks first (`num_blocks_to_resume`)."""
        assert self.swap_space is not None, "only a swap space holds swapped-out requests"
        tables, pairs = self.swap_space.load((request.request_id for request in requests), self.block_pool)
        self.req_to_blocks.update(tables)
        return pairs

    def discard_swapped(self, request: Request) -> None:
        """Drop a swapped-out request's host blocks (it ended while swapped out)."""
        assert self.swap_space is not None, "only a swap space holds swapped-out requests"
        self.swap_space.discard(request.request_id)

    def fork(self, parent: Request, child: Request, num_tokens: int) -> None:
        """Let `child` (holding no blocks) share the blocks of `parent` that hold its first
        `num_tokens` tokens: one more reference each, no copy until someone writes."""
        blocks = self.req_to_blocks.get(parent.request_id, [])[: self._num_blocks(num_tokens)]
        self.block_pool.touch(self._held(blocks))
        self.req_to_blocks[child.request_id] = list(blocks)
        self.num_cached_blocks[child.request_id] = min(
            self.num_cached_blocks.get(parent.request_id, 0), num_tokens // self.block_size
        )

    def free(self, request: Request) -> None:
        """Drop the request's references (finished, aborted, preempted or swapped out). Blocks nobody
        else holds return to the pool; hashed ones stay revivable."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        self.num_freed_leading.pop(request.request_id, None)
        # NOTE: tail blocks first, so the most request-specific blocks are evicted first.
        self.block_pool.free(reversed(self._held(blocks)))

    def uncache(self, request: Request) -> None:
        """Make the request's blocks unfindable (their K/V are not what their hashes say: its step failed).
        The request and whoever shares them keep them."""
        self.block_pool.uncache(self.req_to_blocks.get(request.request_id, []))

    def trim(self, request: Request) -> int:
        """Release the blocks past those holding the request's tokens (they held only rejected draft
        tokens). Returns how many were released."""
        blocks = self.req_to_blocks.get(request.request_id, [])
        keep = self._num_blocks(request.num_tokens)
        released = blocks[keep:]
        del blocks[keep:]
        self.block_pool.free(reversed(released))
        return len(released)

    def reset_prefix_cache(self) -> int:
        """Make every cached block unfindable (running requests keep theirs). Returns how many were."""
        return self.block_pool.reset_prefix_cache()

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

    def _free_unreachable(
        self, request_id: str, blocks: list[KVCacheBlock], num_computed_tokens: int
    ) -> None:
        """Free the leading blocks each window group no longer reads and put the null block in their place."""
        if not blocks:
            return
        num_groups, null_block = self.num_groups, self.block_pool.null_block
        freed = self.num_freed_leading.setdefault(request_id, [0] * num_groups)
        unreachable: list[KVCacheBlock] = []
        for group in range(num_groups):
            end = min(
                len(blocks) // num_groups, self.groups.num_unreachable_blocks(group, num_computed_tokens)
            )
            if end <= freed[group]:
                continue
            assert null_block is not None, "the device pool reserves the null block"
            for index in range(freed[group] * num_groups + group, end * num_groups, num_groups):
                if blocks[index] is not null_block:
                    unreachable.append(blocks[index])
                    blocks[index] = null_block
            freed[group] = end
        # NOTE: the oldest first, so the prefix cache evicts them before the request's recent blocks. The
        # workers are not told: no backend reads a position out of its layer's window, so their stale ids
        # for these entries are never read (resending whole tables would cost O(tokens) each time).
        self.block_pool.free(unreachable)

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

    def _copy_on_write(self, blocks: list[KVCacheBlock], index: int) -> tuple[int, int]:
        """Give the table its own copy of block `index`; returns the (src, dst) copy to make."""
        shared, copy = blocks[index], self.block_pool.allocate(1)[0]
        blocks[index] = copy
        self.block_pool.free([shared])
        return shared.block_id, copy.block_id

    def _cache_full_blocks(self, request: Request, blocks: list[KVCacheBlock], num_tokens: int) -> None:
        """Offer the blocks that `num_tokens` fill to the prefix cache. NOTE: done at schedule time: the
        step computes them before any later step can read them, and within the step every layer writes
        all new K/V before attending."""
        if not self.enable_caching:
            return
        size, start = self.block_size, self.num_cached_blocks.get(request.request_id, 0)
        num_full = num_tokens // size
        if num_full <= start:
            return
        extend_block_hashes(
            request.block_hashes,
            request.all_token_ids,
            size,
            num_full,
            request.cache_salt,
            request.lora_key,
            request.images,
        )
        for entry in range(start, num_full):
            tokens = request.all_token_ids[entry * size : (entry + 1) * size]
            for group in range(self.num_groups):
                block = blocks[entry * self.num_groups + group]
                if block is not self.block_pool.null_block:  # else freed out of the window (prefix hits)
                    self.block_pool.cache(block, (request.block_hashes[entry], group), tokens)
        self.num_cached_blocks[request.request_id] = num_full
