"""KV cache groups: how layers are grouped (vLLM's rule), and which leading blocks a group no longer reads."""

from pagedserve.config.kv_layout import KVCacheGroups
from pagedserve.utils import cdiv


def reads(window: int, position: int, token: int) -> bool:
    """The definition: the query at `position` reads `token` iff position - window < token <= position."""
    return position - window < token <= position


def test_a_window_group_frees_exactly_the_blocks_no_future_query_reads() -> None:
    for block_size in (8, 16, 32):
        for window in (1, 7, 16, 24, 100):
            groups = KVCacheGroups.from_layer_windows([window, window], block_size)
            assert groups.num_groups == 1 and groups.group_size == 2
            for computed in range(0, 300, 3):
                skipped = groups.num_unreachable_blocks(0, computed)
                # no future query (position >= computed) reads a token of a skipped block ...
                assert not any(reads(window, computed, t) for t in range(skipped * block_size))
                # ... and the next block holds a token the next query reads (nothing freed too late)
                first_read = max(0, computed - window + 1)
                assert skipped == first_read // block_size


def test_layers_without_windows_are_one_group() -> None:
    groups = KVCacheGroups.from_layer_windows([None] * 5, 16)
    assert groups.layers == ((0, 1, 2, 3, 4),) and groups.group_size == 5
    assert groups.num_unreachable_blocks(0, 10_000) == 0


def test_mixed_layers_split_into_groups_of_equal_size_full_attention_first() -> None:
    # Gemma 2: alternating. One layer of each type per group; the full group keeps every block.
    gemma2 = KVCacheGroups.from_layer_windows([24, None, 24, None], 16)
    assert gemma2.layers == ((1, 3), (0, 2)) and gemma2.windows == (None, 24)
    assert gemma2.num_unreachable_blocks(0, 10_000) == 0
    assert gemma2.num_unreachable_blocks(1, 100) == (100 - 24 + 1) // 16
    # Gemma 3: 5 local : 1 global -> groups of one layer (the global one's count).
    gemma3 = KVCacheGroups.from_layer_windows([8, 8, 8, 8, 8, None] * 2, 16)
    assert gemma3.group_size == 2 and gemma3.num_groups == 6
    assert gemma3.layers[0] == (5, 11) and gemma3.windows == (None, 8, 8, 8, 8, 8)
    places = gemma3.tensor_of_layer()
    assert sorted(places) == list(range(12))
    # every tensor index is used by at most one layer per group
    assert len(set(places.values())) == 12
    # Counts within 25% of each other are not cut: 5 and 6 layers -> groups of 6, the smaller padded.
    close = KVCacheGroups.from_layer_windows([None] * 5 + [8] * 6, 16)
    assert close.layers == ((0, 1, 2, 3, 4), (5, 6, 7, 8, 9, 10)) and close.group_size == 6
    # ... but 4 and 5 are not (5 >= 1.25 * 4): groups of 4.
    assert KVCacheGroups.from_layer_windows([None] * 4 + [8] * 5, 16).group_size == 4


def test_max_blocks_counts_every_group() -> None:
    groups = KVCacheGroups.from_layer_windows([24, None], 16)
    for num_tokens in (1, 16, 40, 1000):
        entries = cdiv(num_tokens, 16)
        assert groups.max_blocks(num_tokens, 1) == entries + min(entries, cdiv(24, 16) + 1)
