"""Prefix caching over several KV cache groups (no torch): the hit search on chosen cache contents (full
runs, windows shorter and longer than the prefix, hits capped by the full group, the search repeated
until every group serves one length, tokens verified), then the manager end to end: freed window blocks
revived, evicted ones that the window no longer reads not missed, evicted ones it reads ending the hit,
never the last token, statistics and reset."""

from core.utils import make_request

from pagedserve.config.kv_layout import KVCacheGroups
from pagedserve.core.block_pool import BlockPool, KVCacheBlock
from pagedserve.core.hashing import extend_block_hashes
from pagedserve.core.kv_cache_manager import KVCacheManager
from pagedserve.core.prefix_hit import find_longest_cache_hit
from pagedserve.core.request import Request

BLOCK_SIZE = 4
TOKENS = list(range(100, 128))  # 7 full blocks


def hit_pattern(
    layer_windows: list[int | None], cached: dict[int | None, set[int]], max_entries: int = 6
) -> list[str]:
    """Cache TOKENS' entries `cached[window]` in the group of each window, search, and draw each
    group's hit: '#' a cached block, '.' the null block."""
    groups = KVCacheGroups.from_layer_windows(layer_windows, BLOCK_SIZE)
    pool = BlockPool(64)
    hashes: list[bytes] = []
    extend_block_hashes(hashes, TOKENS, BLOCK_SIZE, len(TOKENS) // BLOCK_SIZE, None)
    for group, window in enumerate(groups.windows):
        for entry in cached[window]:
            tokens = TOKENS[entry * BLOCK_SIZE : (entry + 1) * BLOCK_SIZE]
            pool.cache(pool.allocate(1)[0], (hashes[entry], group), tokens)
    hits = find_longest_cache_hit(pool, groups, hashes, TOKENS, max_entries)
    assert len(hits) % groups.num_groups == 0
    return [
        "".join("." if block is pool.null_block else "#" for block in hits[group :: groups.num_groups])
        for group in range(groups.num_groups)
    ]


ALL = set(range(7))


def test_a_window_shorter_than_the_prefix_needs_only_the_blocks_it_reads() -> None:
    # Window 6, blocks of 4: the query at 24 reads 19..24, entries 4 and 5.
    assert hit_pattern([6, None], {None: ALL, 6: ALL}) == ["######", "....##"]
    assert hit_pattern([6, None], {None: ALL, 6: {4, 5}}) == ["######", "....##"]
    # The last entry missing: the hit ends before it, where the two entries before are cached.
    assert hit_pattern([6, None], {None: ALL, 6: {3, 4}}) == ["#####", "...##"]
    # One entry in reach is not enough; a run from the start shorter than the window is a hit.
    assert hit_pattern([6, None], {None: ALL, 6: {0, 5}}) == ["#", "#"]
    assert hit_pattern([6, None], {None: ALL, 6: {2, 5}}) == ["", ""]


def test_a_window_longer_than_the_prefix_needs_every_block() -> None:
    assert hit_pattern([100, None], {None: ALL, 100: ALL}) == ["######", "######"]
    assert hit_pattern([100, None], {None: ALL, 100: ALL - {0}}) == ["", ""]
    assert hit_pattern([100, None], {None: ALL, 100: ALL - {3}}) == ["###", "###"]


def test_the_full_group_caps_the_window_search() -> None:
    # The full group's run ends at entry 3; the window then needs entries 1 and 2, not 4 and 5.
    assert hit_pattern([6, None], {None: {0, 1, 2, 4, 5}, 6: ALL}) == ["###", ".##"]
    assert hit_pattern([6, None], {None: {0, 1, 2, 4, 5}, 6: {4, 5}}) == ["", ""]
    assert hit_pattern([6, None], {None: set(), 6: ALL}) == ["", ""]


def test_several_windows_are_searched_again_until_every_group_serves_one_length() -> None:
    # Window 6 serves 5 entries (entries 3, 4); window 12 serves 6 but not 5 (entry 2 is missing), only
    # 2 (a run from the start); window 6 must then serve 2 (entries 0, 1).
    layers = [6, 12, None]
    assert hit_pattern(layers, {None: ALL, 6: {0, 1, 3, 4}, 12: ALL - {2}}) == ["##", "##", "##"]
    assert hit_pattern(layers, {None: ALL, 6: {3, 4}, 12: ALL - {2}}) == ["", "", ""]
    assert hit_pattern(layers, {None: ALL, 6: {3, 4}, 12: ALL}) == ["#####", "...##", "..###"]


def test_window_only_models_and_hits_verified_by_tokens() -> None:
    # One window group (Mistral): no full group caps the search.
    assert hit_pattern([6, 6], {6: {4, 5}}) == ["....##"]
    groups = KVCacheGroups.from_layer_windows([6, None], BLOCK_SIZE)
    pool = BlockPool(8)
    hashes: list[bytes] = []
    extend_block_hashes(hashes, TOKENS, BLOCK_SIZE, 2, None)
    for group in (0, 1):
        pool.cache(pool.allocate(1)[0], (hashes[0], group), (0, 0, 0, 0))  # a forged collision
    assert find_longest_cache_hit(pool, groups, hashes, TOKENS, 1) == []


def gemma(num_blocks: int = 64) -> KVCacheManager:
    """Gemma 2's layout: a full-attention group and a window of 6 tokens (it reads two blocks of 4)."""
    return KVCacheManager(num_blocks, KVCacheGroups.from_layer_windows([6, None], 4))


def admit(kv: KVCacheManager, request: Request) -> list[KVCacheBlock]:
    """Admit like the scheduler (prefix hits, then slots for the rest); returns the hits."""
    hits = kv.get_computed_blocks(request) or []
    num_cached = kv.num_hit_tokens(hits)
    request.num_computed_tokens = 0
    assert kv.allocate_slots(request, request.num_tokens - num_cached, hits) is not None
    request.num_computed_tokens = request.num_tokens
    return hits


def run_and_free(kv: KVCacheManager, tokens: list[int], request_id: str) -> Request:
    """A request that computes `tokens`, decodes one more (its window frees its oldest blocks), ends."""
    request = make_request(request_id, tokens)
    admit(kv, request)
    request.append_token(1)
    assert kv.allocate_slots(request, 1) is not None
    kv.free(request)
    return request


def window_blocks(kv: KVCacheManager, hits: list[KVCacheBlock]) -> str:
    """The window group's (group 1: full attention comes first) hits: '#' a block, '.' the null block."""
    return "".join("." if block is kv.block_pool.null_block else "#" for block in hits[1::2])


def cached_entries(kv: KVCacheManager, request: Request) -> list[set[int]]:
    """Per group, which of the request's entries are in the prefix cache."""
    entry_of = {block_hash: entry for entry, block_hash in enumerate(request.block_hashes)}
    found: list[set[int]] = [set() for _ in range(kv.num_groups)]
    for block_hash, group in kv.block_pool.cached:
        if block_hash in entry_of:
            found[group].add(entry_of[block_hash])
    return found


def test_freed_window_blocks_are_revived_and_the_full_group_caps_the_hit() -> None:
    kv = gemma()
    first = make_request("first", TOKENS[:24])
    admit(kv, first)
    first.append_token(1)
    kv.allocate_slots(first, 1)  # window entries 0..3 leave its table (freed, still cached)
    assert kv.num_held_blocks_per_group("first") == [7, 3]
    free_before = kv.num_free_blocks()
    # Shares 3 blocks and differs in the 4th: the full group caps the hit at 12 tokens; the window
    # group takes its freed (cached) entries 1 and 2 back.
    second = make_request("second", TOKENS[:14] + [0] * 6)
    hits = admit(kv, second)
    assert kv.num_hit_tokens(hits) == 12 and window_blocks(kv, hits) == ".##"
    assert all(block.ref_cnt == 1 for block in hits[3::2]), "revived window blocks held by one"
    assert kv.num_free_blocks() == free_before - 2 - (len(kv.get_block_ids("second")) - len(hits))
    assert kv.prefix_cache_hits == 12 and kv.prefix_cache_queries == 24 + 20


def test_evicted_window_blocks_out_of_reach_do_not_end_the_hit() -> None:
    kv = gemma(num_blocks=15)  # 14 usable: the first request holds all of them until it ends
    first = run_and_free(kv, TOKENS[:24], "first")
    # Free queue now: the last entry's two unhashed blocks, window entries 0..3 (freed first), then the
    # rest (the table's tail first). Four new blocks evict the unhashed two and window entries 0 and 1.
    admit(kv, make_request("other", list(range(500, 508))))
    assert cached_entries(kv, first) == [set(range(6)), {2, 3, 4, 5}]
    hits = admit(kv, make_request("second", TOKENS[:24] + [1, 9]))
    assert kv.num_hit_tokens(hits) == 24 and window_blocks(kv, hits) == "....##"


def test_evicted_window_blocks_in_reach_end_the_hit() -> None:
    kv = gemma(num_blocks=15)
    first = run_and_free(kv, TOKENS[:24], "first")
    admit(kv, make_request("other", list(range(500, 513))))  # 8 blocks: window entry 5 and full 5 too
    assert cached_entries(kv, first) == [set(range(5)), {4}]
    # The full group serves 5 entries; the window then needs entries 3 and 4, and 3 is gone; no run of
    # window blocks starts the prompt either.
    assert kv.get_computed_blocks(make_request("second", TOKENS[:24] + [1, 9])) == []


def test_at_least_one_token_is_recomputed_and_reset_forgets_every_group() -> None:
    kv = gemma()
    admit(kv, make_request("first", TOKENS[:24]))
    hits = admit(kv, make_request("same", TOKENS[:24]))
    assert kv.num_hit_tokens(hits) == 20 and window_blocks(kv, hits) == "...##"
    assert kv.reset_prefix_cache() == 12, "6 full blocks in each of the two groups"
    assert admit(kv, make_request("after-reset", TOKENS[:24])) == []
