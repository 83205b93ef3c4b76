"""Property test of block sharing: random add (with prefix hits) / fork / append / free / swap-out /
swap-in sequences on the real KVCacheManager and SwapSpace, with a fake KV store that plays the worker
(writes each token into its slot, makes the copies and swaps the manager asks for). Every request always
reads back exactly its own tokens (copy-on-write never lets one see another's), every cached block holds
the tokens it is cached for, ref counts equal the holders in both pools, and nothing leaks. Again with two
KV cache groups on one pool: a window wider than any request (every group's table reads back all the
request's tokens), and a window of a few blocks (prefix hits cover each group apart; a window group's
table reads back every token its window still reads, its freed entries are the null block in both
pools, and nothing else is)."""

import time
from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagedserve.config.kv_layout import KVCacheGroups
from pagedserve.core.block_pool import BlockPool, KVCacheBlock
from pagedserve.core.kv_cache_interface import SlotAllocation
from pagedserve.core.kv_cache_manager import KVCacheManager
from pagedserve.core.request import Request
from pagedserve.protocol import EngineCoreRequest
from pagedserve.sampling_params import SamplingParams

NUM_BLOCKS, NUM_HOST_BLOCKS, BLOCK_SIZE, MAX_LEN = 20, 12, 4, 32
Store = dict[int, int | None]  # slot -> the token whose K/V it holds


def read(store: Store, table: list[KVCacheBlock], num_tokens: int) -> list[int | None]:
    return [
        store.get(table[p // BLOCK_SIZE].block_id * BLOCK_SIZE + p % BLOCK_SIZE) for p in range(num_tokens)
    ]


def move(source: Store, target: Store, pairs: list[tuple[int, int]]) -> None:
    blocks = {src: [source.get(src * BLOCK_SIZE + o) for o in range(BLOCK_SIZE)] for src, _ in pairs}
    for src, dst in pairs:  # all sources read first, as the worker does
        for offset, value in enumerate(blocks[src]):
            target[dst * BLOCK_SIZE + offset] = value


def check_pool(
    pool: BlockPool, tables: dict[str, list[KVCacheBlock]], total: int, null_block: KVCacheBlock | None
) -> None:
    """`null_block`: the device pool's, the entries freed out of a window in both pools' tables."""
    held = [[block for block in table if block is not null_block] for table in tables.values()]
    holders = Counter(block.block_id for table in held for block in table)
    assert null_block is None or null_block.ref_cnt == 1, "the null block was handed out"
    for table in held:
        for block in table:
            assert block.ref_cnt == holders[block.block_id], "ref_cnt is not the number of holders"
    assert len(holders) + pool.get_num_free_blocks() == total, "a block leaked"
    assert pool.num_blocks_saved == sum(holders.values()) - len(holders)
    assert pool.num_shared_blocks == sum(1 for count in holders.values() if count > 1)


def group_tables(table: list[KVCacheBlock], num_groups: int) -> list[list[KVCacheBlock]]:
    """The manager's flat, entry-major table split into each group's."""
    return [table[group::num_groups] for group in range(num_groups)]


class SharingMachine(RuleBasedStateMachine):
    num_blocks, num_host_blocks = NUM_BLOCKS, NUM_HOST_BLOCKS
    layer_windows: list[int | None] = [None]

    def __init__(self) -> None:
        super().__init__()
        groups = KVCacheGroups.from_layer_windows(self.layer_windows, BLOCK_SIZE)
        self.kv = KVCacheManager(self.num_blocks, groups, num_host_blocks=self.num_host_blocks)
        assert self.kv.swap_space is not None
        self.swap = self.kv.swap_space
        self.device: Store = {}
        self.host: Store = {}
        self.live: dict[str, Request] = {}
        self.swapped: dict[str, Request] = {}
        self.next_id = 0

    def _new_id(self) -> str:
        self.next_id += 1
        return str(self.next_id)

    def _write(self, request: Request, start: int, allocation: SlotAllocation) -> None:
        """Compute tokens [start, num_tokens): the query at `start` reads every entry in its windows."""
        move(self.device, self.device, allocation.copies)  # copies on write come first
        tables = group_tables(self.kv.req_to_blocks[request.request_id], self.kv.num_groups)
        self._check_tables(self.device, request, tables, start)
        for table in tables:
            for position in range(start, request.num_tokens):
                block = table[position // BLOCK_SIZE]
                assert block.ref_cnt == 1, "a write into a block someone else holds"
                slot = block.block_id * BLOCK_SIZE + position % BLOCK_SIZE
                self.device[slot] = request.all_token_ids[position]
        request.num_computed_tokens = request.num_tokens

    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=14))
    def add(self, tokens: list[int]) -> None:
        request = Request(EngineCoreRequest(self._new_id(), tokens, SamplingParams(), None, time.time()))
        hits = self.kv.get_computed_blocks(request)
        cached = self.kv.num_hit_tokens(hits)
        allocation = self.kv.allocate_slots(request, len(tokens) - cached, hits)
        if allocation is None:
            return
        self.live[request.request_id] = request
        self._write(request, cached, allocation)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        child = parent.fork(self._new_id())
        self.kv.fork(parent, child, parent.num_computed_tokens)
        self.live[child.request_id] = child

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=st.integers(0, 2))
    def append(self, data: st.DataObject, token: int) -> None:
        request = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        if request.num_tokens >= MAX_LEN:
            return
        request.append_token(token)
        # The scheduler skips allocate_slots when this holds: it must have nothing to do then.
        in_place = self.kv.grows_in_place([(request, 1)])
        table = list(self.kv.req_to_blocks.get(request.request_id, []))
        num_cached = self.kv.num_cached_blocks.get(request.request_id)
        allocation = self.kv.allocate_slots(request, 1)
        if allocation is None:
            request.all_token_ids.pop()
            return
        if in_place:
            assert allocation == SlotAllocation([], []), "a decode that grows in place allocated or copied"
            assert self.kv.req_to_blocks[request.request_id] == table
            assert self.kv.num_cached_blocks.get(request.request_id) == num_cached, "it filled a block"
        self._write(request, request.num_tokens - 1, allocation)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        self.kv.free(self.live.pop(data.draw(st.sampled_from(sorted(self.live)))))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.sampled_from(sorted(self.live)), min_size=1, max_size=3, unique=True))
        group = [self.live[request_id] for request_id in ids]
        pairs = self.kv.swap_out(group)
        if pairs is None:
            return
        assert all(0 <= host < self.num_host_blocks for _, host in pairs), "host ids are the workers' rows"
        move(self.device, self.host, pairs)
        for request in group:
            self.swapped[request.request_id] = self.live.pop(request.request_id)

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        request = self.swapped[data.draw(st.sampled_from(sorted(self.swapped)))]
        if self.kv.num_blocks_to_resume([request], []) > self.kv.num_free_blocks():
            return
        move(self.host, self.device, self.kv.swap_in([request]))
        self.live[request.request_id] = self.swapped.pop(request.request_id)

    def _check_tables(
        self, store: Store, request: Request, tables: list[list[KVCacheBlock]], num_computed: int
    ) -> None:
        """Each group's table (`tables`) holds every entry that the query at position `num_computed`
        reads (only entries out of its window's reach are the null block), and each block it holds reads
        back the request's tokens up to `num_computed`."""
        null, tokens = self.kv.block_pool.null_block, request.all_token_ids[:num_computed]
        for group, blocks in enumerate(tables):
            unreachable = self.kv.groups.num_unreachable_blocks(group, num_computed)
            assert all(block is not null for block in blocks[unreachable:]), "a block in reach is null"
            got = read(store, blocks, num_computed)
            for entry, block in enumerate(blocks):
                if block is not null:
                    span = slice(entry * BLOCK_SIZE, (entry + 1) * BLOCK_SIZE)
                    assert got[span] == tokens[span], f"group {group} reads another request's tokens"

    @invariant()
    def everyone_reads_its_own_tokens(self) -> None:
        num_groups = self.kv.num_groups
        for request in self.live.values():
            table = self.kv.req_to_blocks[request.request_id]
            self._check_tables(self.device, request, group_tables(table, num_groups), request.num_tokens)
        for request in self.swapped.values():
            table = self.swap.tables[request.request_id]
            self._check_tables(self.host, request, group_tables(table, num_groups), request.num_tokens)

    @invariant()
    def cached_blocks_hold_their_tokens(self) -> None:
        for block in self.kv.block_pool.cached.values():
            assert tuple(read(self.device, [block], BLOCK_SIZE)) == block.token_ids

    @invariant()
    def pools_are_consistent(self) -> None:
        null = self.kv.block_pool.null_block
        check_pool(self.kv.block_pool, self.kv.req_to_blocks, self.num_blocks - 1, null)
        check_pool(self.swap.pool, self.swap.tables, self.num_host_blocks, null)
        assert set(self.kv.req_to_blocks) == set(self.live)
        assert set(self.swap.tables) == set(self.swapped)

    def teardown(self) -> None:
        for request in self.live.values():
            self.kv.free(request)
        for request in self.swapped.values():
            self.kv.discard_swapped(request)
        assert self.kv.num_free_blocks() == self.num_blocks - 1 and self.kv.block_pool.num_blocks_saved == 0
        assert self.swap.num_free_blocks() == self.num_host_blocks


class GroupedSharingMachine(SharingMachine):
    """Two KV cache groups (a window wider than any request here: every token stays readable, so each
    group's table must read back all of them): forks, copies on write and swaps per group."""

    num_blocks, num_host_blocks = 2 * NUM_BLOCKS, 2 * NUM_HOST_BLOCKS
    layer_windows = [None, 4 * MAX_LEN]


class WindowedSharingMachine(SharingMachine):
    """A full-attention group and a window of 6 tokens (two blocks read, older ones freed): prefix hits
    whose window entries are the null block, freed window blocks revived or evicted, swaps that keep the
    freed entries null."""

    num_blocks, num_host_blocks = 2 * NUM_BLOCKS, 2 * NUM_HOST_BLOCKS
    layer_windows = [6, None]

    @rule(shared=st.integers(8, 24), tail=st.lists(st.integers(0, 2), max_size=6))
    def add_sharing(self, shared: int, tail: list[int]) -> None:
        """A long prompt starting like others: hits of several blocks, whose oldest the window skips."""
        self.add([1] * shared + tail)


TestSharing = SharingMachine.TestCase
TestSharing.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
TestGroupedSharing = GroupedSharingMachine.TestCase
TestGroupedSharing.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
TestWindowedSharing = WindowedSharingMachine.TestCase
TestWindowedSharing.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
