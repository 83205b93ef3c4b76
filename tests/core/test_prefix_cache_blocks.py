"""Prefix caching in the KV-cache manager (no torch): the hash chain, tenants, hits verified by tokens,
never the last token, revivable blocks evicted least recently used, reset, statistics."""

from core.utils import make_request
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedserve.config.kv_layout import KVCacheGroups
from pagedserve.core.hashing import extend_block_hashes, hash_block_tokens
from pagedserve.core.kv_cache_manager import KVCacheManager
from pagedserve.core.request import Request

BLOCK_SIZE = 4


def admit(kv: KVCacheManager, request: Request) -> int:
    """Admit like the scheduler: prefix hits, then slots for the rest. Returns the cached token count."""
    hits = kv.get_computed_blocks(request)
    cached = len(hits or []) * kv.block_size
    assert kv.allocate_slots(request, request.num_tokens - cached, hits) is not None
    request.num_computed_tokens = request.num_tokens
    return cached


def chain(tokens: list[int], salt: str | None = None) -> list[bytes]:
    hashes: list[bytes] = []
    extend_block_hashes(hashes, tokens, BLOCK_SIZE, len(tokens) // BLOCK_SIZE, salt)
    return hashes


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=8, max_size=24), st.lists(st.integers(0, 3), min_size=8, max_size=24)
)
def test_chain_hashes_equal_exactly_when_whole_prefixes_are_equal(a: list[int], b: list[int]) -> None:
    for index, (hash_a, hash_b) in enumerate(zip(chain(a), chain(b))):
        end = (index + 1) * BLOCK_SIZE
        assert (hash_a == hash_b) == (a[:end] == b[:end])


def test_same_block_after_different_prefixes_differs() -> None:
    block = [7, 7, 7, 7]
    assert chain([1, 2, 3, 4] + block)[1] != chain([1, 2, 3, 5] + block)[1]
    assert hash_block_tokens(None, block) != hash_block_tokens(hash_block_tokens(None, block), block)


def test_cache_salt_separates_tenants() -> None:
    tokens = list(range(10, 22))
    assert chain(tokens, "tenant-a")[0] != chain(tokens, "tenant-b")[0] != chain(tokens)[0]
    kv = KVCacheManager(32, KVCacheGroups.uniform(BLOCK_SIZE))
    admit(kv, make_request("a", tokens, cache_salt="tenant-a"))
    assert admit(kv, make_request("b", tokens, cache_salt="tenant-b")) == 0
    assert admit(kv, make_request("no-salt", tokens)) == 0
    assert (
        admit(kv, make_request("a2", tokens, cache_salt="tenant-a")) == 8
    )  # 12 tokens: never the last block


def test_longest_prefix_hit_never_covers_the_last_token() -> None:
    kv = KVCacheManager(32, KVCacheGroups.uniform(BLOCK_SIZE))
    tokens = list(range(100, 112))  # three full blocks
    admit(kv, make_request("first", tokens))
    assert admit(kv, make_request("same", tokens)) == 8  # the last token is computed again
    assert admit(kv, make_request("longer", tokens + [5])) == 12
    assert admit(kv, make_request("mid-block", tokens[:10])) == 8
    assert admit(kv, make_request("at-block-end", tokens[:8])) == 4
    assert admit(kv, make_request("second-block-differs", tokens[:4] + [0] * 8)) == 4
    assert admit(kv, make_request("one-token", tokens[:1])) == 0
    # Shared blocks are referenced once per holder.
    first = kv.req_to_blocks["first"][0]
    assert first.ref_cnt == 6 and kv.block_pool.num_shared_blocks >= 1


def test_prompt_logprobs_skip_the_lookup() -> None:
    kv = KVCacheManager(32, KVCacheGroups.uniform(BLOCK_SIZE))
    tokens = list(range(100, 112))
    admit(kv, make_request("first", tokens))
    assert kv.get_computed_blocks(make_request("logprobs", tokens, prompt_logprobs=1)) is None
    assert (
        KVCacheManager(32, KVCacheGroups.uniform(BLOCK_SIZE), enable_caching=False).get_computed_blocks(
            make_request("off", tokens)
        )
        is None
    )


def test_a_hit_is_verified_by_token_ids() -> None:
    kv = KVCacheManager(32, KVCacheGroups.uniform(BLOCK_SIZE))
    tokens = list(range(100, 109))
    admit(kv, make_request("first", tokens))
    block = kv.req_to_blocks["first"][0]
    block.token_ids = (0, 0, 0, 0)  # a forged collision: same hash, other tokens
    assert admit(kv, make_request("second", tokens)) == 0


def test_freed_blocks_stay_revivable_until_evicted_least_recently_used() -> None:
    kv = KVCacheManager(7, KVCacheGroups.uniform(BLOCK_SIZE))  # 6 usable blocks
    old_tokens, new_tokens = list(range(100, 109)), list(range(200, 209))
    for request_id, tokens in (("old", old_tokens), ("new", new_tokens)):
        request = make_request(request_id, tokens)  # 3 blocks: two full (cached), one partial
        admit(kv, request)
        kv.free(request)
    assert kv.num_free_blocks() == 6 and kv.usage() == 0.0
    assert [
        len(kv.get_computed_blocks(make_request(rid, t)) or [])
        for rid, t in (("old?", old_tokens), ("new?", new_tokens))
    ] == [2, 2]
    # 4 blocks: the two partial ones (nothing to lose) first, then the least recently freed cached ones.
    admit(kv, make_request("big", list(range(300, 316))))
    assert [
        len(kv.get_computed_blocks(make_request(rid, t)) or [])
        for rid, t in (("old?", old_tokens), ("new?", new_tokens))
    ] == [0, 2]


def test_reset_prefix_cache_and_statistics() -> None:
    kv = KVCacheManager(32, KVCacheGroups.uniform(BLOCK_SIZE))
    tokens = list(range(100, 112))
    admit(kv, make_request("first", tokens))
    admit(kv, make_request("second", tokens))
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (24, 8)
    assert kv.reset_prefix_cache() == 3
    assert admit(kv, make_request("third", tokens)) == 0
    assert kv.req_to_blocks["first"][0].ref_cnt == 2, "blocks in use keep their holders"
