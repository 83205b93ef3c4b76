"""Per-request block tables over the block pool: allocation, prefix caching, forks and copy-on-write, one
table per KV cache group (`config/kv_layout.py`); the tables themselves and what is read from them are
`KVCacheTables` (kv_cache_tables.py)."""

from pagedserve.core.block_pool import KVCacheBlock
from pagedserve.core.hashing import extend_block_hashes
from pagedserve.core.kv_cache_interface import Plan, SlotAllocation
from pagedserve.core.kv_cache_tables import KVCacheTables
from pagedserve.core.prefix_hit import find_longest_cache_hit
from pagedserve.core.request import Request
from pagedserve.core.swap import num_distinct


class KVCacheManager(KVCacheTables):
    """Owns every request's block table. Blocks are allocated only as a request grows, so waste is at
    most one partly filled block per request, and all of them return to the pool when it ends.

    Sharing: a block may sit in several tables (`ref_cnt`). Full blocks are shared through the prefix
    cache (content hashes, `enable_caching`) and through forks; they are never written again. A partly
    filled block is shared only by a fork; whoever writes into it while others still hold it gets a
    copy first (copy-on-write): the `SlotAllocation` that `allocate_slots` returns lists the (src, dst)
    copies the workers must make before the step's forward.

    KV cache groups: the tables' layout is `KVCacheTables`'. The prefix cache keeps each group's blocks
    apart (keyed by the block's hash and its group); a hit is the longest prefix every group can serve
    (`core/prefix_hit.py`: a window group needs only the blocks its window still reads, the rest of its
    entries are the null block)."""

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
