"""The pool of KV-cache blocks: ids, reference counts, a free queue and the prefix cache's hash table."""

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pagedserve.core.hashing import BlockHash

# A block's key in the prefix cache: the hash of its tokens (the same in every KV cache group) and its
# group, so that each group caches its own block for the same tokens (vLLM's BlockHashWithGroupId).
CacheKey = tuple[BlockHash, int]


@dataclass(slots=True)
class KVCacheBlock:
    """One block of `block_size` token slots in every layer's K and V tensors. `ref_cnt` counts the
    requests whose block table holds it (sharing: prefix hits, forks of parallel samples and beams)."""

    block_id: int
    ref_cnt: int = 0
    # Set while the block is full, computed and findable in the prefix cache.
    cache_key: CacheKey | None = None
    token_ids: tuple[int, ...] | None = None  # the block's tokens, to verify a hit


class BlockPool:
    """Hands out blocks from a fixed pool of ids 0..num_blocks-1. In the device pool block 0 is the
    reserved null block: it pads block tables and is never allocated, so a stray write through padding
    can never corrupt a live request. A pool without one (`reserve_null_block=False`: the host swap pool,
    whose rows nothing pads) hands out every id.

    Free blocks wait in one queue, first out first reused. A freed block that is in the prefix cache
    joins the back (it stays revivable, and the least recently used one is evicted first); a freed
    block without a hash joins the front (nothing is lost by reusing it at once). So the queue is three
    runs: freed blocks without a hash, the never-used blocks in id order, the freed cached ones; the
    never-used run is a counter, its blocks made on first use (a host swap pool for a small model holds
    hundreds of thousands: their objects took a second at every engine start)."""

    def __init__(self, num_blocks: int, reserve_null_block: bool = True) -> None:
        self.num_reserved = int(reserve_null_block)
        assert num_blocks > self.num_reserved, "at least one usable block"
        self.num_blocks = num_blocks
        self.null_block = KVCacheBlock(0, ref_cnt=1) if reserve_null_block else None
        self._front: list[KVCacheBlock] = []  # freed without a hash; its end is the queue's front
        self._next_unused = self.num_reserved  # ids from here on were never handed out
        self._back: OrderedDict[int, KVCacheBlock] = OrderedDict()  # freed cached blocks, LRU first
        self.cached: dict[CacheKey, KVCacheBlock] = {}
        # Counters for the sharing metrics, kept up to date on every reference change (O(1) reads).
        self._num_refs = 0  # sum of ref_cnt over usable blocks
        self._num_used = 0  # usable blocks with ref_cnt > 0
        self.num_shared_blocks = 0  # usable blocks with ref_cnt > 1

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - self.num_reserved

    def get_num_free_blocks(self) -> int:
        """Blocks no request holds, revivable cached ones included (they are evicted on demand)."""
        return len(self._front) + self.num_blocks - self._next_unused + len(self._back)

    def allocate(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take `num_blocks` blocks from the front of the free queue (ref_cnt 1), evicting their hashes.
        The caller checks availability first."""
        free = self.get_num_free_blocks()
        assert num_blocks <= free, f"asked {num_blocks} blocks, {free} free"
        blocks = [self._pop_front() for _ in range(num_blocks)]
        for block in blocks:
            self._evict(block)
            self._incref(block)
        return blocks

    def _pop_front(self) -> KVCacheBlock:
        if self._front:
            return self._front.pop()
        if self._next_unused < self.num_blocks:
            self._next_unused += 1
            return KVCacheBlock(self._next_unused - 1)
        return self._back.popitem(last=False)[1]

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Add one reference to each block (a prefix hit, a fork); a free cached block is revived."""
        for block in blocks:
            if block.ref_cnt == 0:  # a free cached block (only those are found to be touched)
                del self._back[block.block_id]
            self._incref(block)

    def free(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference to each block; a block whose count reaches zero is free again."""
        for block in blocks:
            assert block.ref_cnt > 0 and block is not self.null_block, f"double free of {block.block_id}"
            block.ref_cnt -= 1
            self._num_refs -= 1
            if block.ref_cnt == 1:
                self.num_shared_blocks -= 1
            elif block.ref_cnt == 0:
                self._num_used -= 1
                if block.cache_key is None:
                    self._front.append(block)
                else:
                    self._back[block.block_id] = block

    def lookup(self, key: CacheKey, token_ids: Sequence[int]) -> KVCacheBlock | None:
        """The cached block with this key whose tokens are exactly `token_ids`, else None."""
        block = self.cached.get(key)
        if block is None or block.token_ids != tuple(token_ids):
            return None
        return block

    def cache(self, block: KVCacheBlock, key: CacheKey, token_ids: Sequence[int]) -> None:
        """Make a full, computed block findable. A block whose content is already cached (computed
        twice, e.g. by two requests admitted before either finished it) stays private."""
        if block.cache_key is None and key not in self.cached:
            block.cache_key, block.token_ids = key, tuple(token_ids)
            self.cached[key] = block

    def uncache(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Forget these blocks' hashes (they stay allocated to their holders)."""
        for block in blocks:
            self._evict(block)

    def reset_prefix_cache(self) -> int:
        """Forget every hash (blocks in use stay allocated, just no longer findable). Returns how many
        blocks were in the cache."""
        num_cached = len(self.cached)
        for block in self.cached.values():
            block.cache_key = block.token_ids = None
        self.cached.clear()
        return num_cached

    def usage(self) -> float:
        """Fraction of usable blocks in use."""
        return self._num_used / self.num_usable_blocks

    @property
    def num_blocks_saved(self) -> int:
        """Blocks that the current owners would need on top of the used ones if nothing were shared."""
        return self._num_refs - self._num_used

    def _incref(self, block: KVCacheBlock) -> None:
        if block.ref_cnt == 0:
            self._num_used += 1
        elif block.ref_cnt == 1:
            self.num_shared_blocks += 1
        block.ref_cnt += 1
        self._num_refs += 1

    def _evict(self, block: KVCacheBlock) -> None:
        if block.cache_key is not None:
            del self.cached[block.cache_key]
            block.cache_key = block.token_ids = None
