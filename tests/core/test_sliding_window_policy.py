"""The sliding-window policy: which leading blocks no layer group reads again."""

from pagedserve.core.sliding_window import SlidingWindowPolicy


def reads(window: int, position: int, token: int) -> bool:
    """The definition: the query at `position` reads `token` iff position - window < token <= position."""
    return position - window < token <= position


def test_every_layer_windowed_frees_exactly_the_blocks_no_future_query_reads() -> None:
    for block_size in (8, 16, 32):
        for window in (1, 7, 16, 24, 100):
            policy = SlidingWindowPolicy.from_layer_windows([window, window], block_size)
            for computed in range(0, 300, 3):
                skipped = policy.num_unreachable_blocks(computed)
                # no future query (position >= computed) reads a token of a skipped block ...
                assert not any(reads(window, computed, t) for t in range(skipped * block_size))
                # ... and the next block holds a token the next query reads (nothing freed too late)
                first_read = max(0, computed - window + 1)
                assert skipped == first_read // block_size


def test_a_full_attention_group_keeps_every_block() -> None:
    policy = SlidingWindowPolicy.from_layer_windows([24, None, 24, None], 16)
    assert policy.group_windows == (24, None) and policy.reach is None
    assert policy.num_unreachable_blocks(10_000) == 0


def test_the_widest_window_decides() -> None:
    policy = SlidingWindowPolicy.from_layer_windows([8, 64, 8], 16)
    assert policy.reach == 64
    assert policy.num_unreachable_blocks(100) == (100 - 64 + 1) // 16
