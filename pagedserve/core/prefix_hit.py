"""The longest cached prefix a request can reuse when its layers form several KV cache groups (vLLM v1's
hybrid KV cache coordinator), one full-attention or sliding-window rule per group.

Block hashes name token blocks and are the same in every group; each group caches its own block under
(hash, group). A prefix of `n` entries (n * block_size tokens) is a hit when every group can serve it:

- a full-attention group needs its blocks for all `n` entries (the longest cached run from the start);
- a window group of W needs only the entries the next query still reads, the last ceil((W - 1) /
  block_size) before entry n (the query at position p reads (p - W, p]); the earlier ones may have been
  freed out of the window and evicted. A run from the start shorter than that is a hit as well (nothing
  earlier exists to read).

The full groups' run caps the window groups' search. A window hit found under a cap is not a hit under a
smaller one (it needs the entries just before the new end), so the window groups are searched again
under the smallest length found until every group serves the same length."""

from collections.abc import Sequence

from pagedserve.config.kv_layout import KVCacheGroups
from pagedserve.core.block_pool import BlockPool, KVCacheBlock
from pagedserve.core.hashing import BlockHash
from pagedserve.utils import cdiv

Entry = tuple[KVCacheBlock, ...]  # one entry's cached blocks, one per group of an attention type


class _Lookup:
    """Cached blocks of one request's token blocks, verified by their tokens."""

    def __init__(
        self, pool: BlockPool, block_hashes: Sequence[BlockHash], token_ids: Sequence[int], block_size: int
    ) -> None:
        self.pool, self.block_hashes, self.token_ids, self.block_size = (
            pool,
            block_hashes,
            token_ids,
            block_size,
        )

    def entry(self, index: int, group_ids: Sequence[int]) -> Entry | None:
        """Entry `index`'s cached block in each of `group_ids`, or None unless every one is cached."""
        tokens = self.token_ids[index * self.block_size : (index + 1) * self.block_size]
        blocks = []
        for group in group_ids:
            block = self.pool.lookup((self.block_hashes[index], group), tokens)
            if block is None:
                return None
            blocks.append(block)
        return tuple(blocks)

    def full_hit(self, group_ids: Sequence[int], max_entries: int) -> list[Entry]:
        """The longest run of cached entries from the start."""
        hit: list[Entry] = []
        while len(hit) < max_entries and (entry := self.entry(len(hit), group_ids)) is not None:
            hit.append(entry)
        return hit

    def window_hit(self, group_ids: Sequence[int], window: int, max_entries: int) -> list[Entry | None]:
        """The longest prefix (at most `max_entries`) whose last ceil((window - 1) / block_size) entries
        are cached (None: an entry the next query no longer reads), searched from the end."""
        needed = cdiv(window - 1, self.block_size)
        hit: list[Entry | None] = [None] * max_entries
        end, run = max_entries, 0  # the candidate hit's length, and its cached entries found just before it
        for index in range(max_entries - 1, -1, -1):
            if run >= needed:
                break
            entry = self.entry(index, group_ids)
            if entry is None:
                end, run = index, 0
            else:
                hit[index], run = entry, run + 1
        # NOTE: when the search reaches the start with a short run, that run starts the request: end == run.
        return hit[:end]


def find_longest_cache_hit(
    pool: BlockPool,
    groups: KVCacheGroups,
    block_hashes: Sequence[BlockHash],
    token_ids: Sequence[int],
    max_entries: int,
) -> list[KVCacheBlock]:
    """The cached blocks of the longest prefix of at most `max_entries` entries that every group can
    serve, entry-major as the manager keeps tables (entry * num_groups + group), the null block where a
    window group needs none. `block_hashes` covers at least `max_entries` full blocks of `token_ids`."""
    null_block = pool.null_block
    assert null_block is not None, "prefix hits live in the device pool, which reserves the null block"
    lookup = _Lookup(pool, block_hashes, token_ids, groups.block_size)
    full_groups = [group for group, window in enumerate(groups.windows) if window is None]
    by_window: dict[int, list[int]] = {}
    for group, window in enumerate(groups.windows):
        if window is not None:
            by_window.setdefault(window, []).append(group)
    full_hit = lookup.full_hit(full_groups, max_entries) if full_groups else []
    length = len(full_hit) if full_groups else max_entries
    while True:
        window_hits = {window: lookup.window_hit(ids, window, length) for window, ids in by_window.items()}
        shortest = min((len(hit) for hit in window_hits.values()), default=length)
        if shortest == length:
            break
        length = shortest
    blocks: list[KVCacheBlock] = [null_block] * (length * groups.num_groups)
    for group_ids, hit in [(full_groups, full_hit[:length])] + [
        (by_window[window], window_hit) for window, window_hit in window_hits.items()
    ]:
        for index, entry in enumerate(hit):
            for group, block in zip(group_ids, entry or ()):
                blocks[index * groups.num_groups + group] = block
    return blocks
