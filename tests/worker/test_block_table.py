"""The persistent block tables against a plain model (each request's list of block ids, entry-major over
the KV cache groups), through random adds, appends, drops and removes that outgrow the initial rows and
width."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedserve.worker.block_table import BlockTables

OPS = st.lists(
    st.tuples(st.sampled_from(["add", "append", "drop", "remove"]), st.integers(0, 9), st.integers(0, 5)),
    max_size=80,
)


def expected_tables(lists: dict[str, list[int]], order: list[str], groups: int) -> np.ndarray:
    width = max((len(lists[r]) // groups for r in order), default=0)
    tables = np.zeros((groups, len(order), width), dtype=np.int64)
    for row, request_id in enumerate(order):
        for group in range(groups):
            entries = lists[request_id][group::groups]
            tables[group, row, : len(entries)] = entries
    return tables


@settings(max_examples=60, deadline=None)
@given(ops=OPS, groups=st.sampled_from([1, 2, 3]))
def test_tables_follow_the_lists(ops: list[tuple[str, int, int]], groups: int) -> None:
    tables = BlockTables(groups, rows=2, width=1)
    lists: dict[str, list[int]] = {}
    next_block = 1
    for op, key, count in ops:
        request_id = f"r{key}"
        new = list(range(next_block, next_block + count * groups))
        if op == "add" and request_id not in lists:
            tables.add(request_id, new)
            lists[request_id] = new
        elif op == "append" and request_id in lists:
            tables.append(request_id, new)
            lists[request_id] += new
        elif op == "drop" and request_id in lists:
            num = min(count, len(lists[request_id]) // groups) * groups
            tables.drop_last(request_id, num)
            del lists[request_id][len(lists[request_id]) - num :]
        elif op == "remove":
            tables.remove(request_id)
            lists.pop(request_id, None)
        next_block += count * groups
        order = sorted(lists, reverse=key % 2 == 0)
        np.testing.assert_array_equal(tables.gather(order), expected_tables(lists, order, groups))
        assert tables.lengths(order).tolist() == [len(lists[r]) // groups for r in order]
