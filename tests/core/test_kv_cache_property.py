"""Property test: random add / grow / finish / abort sequences through the real Scheduler and
KVCacheManager (no model: a fake token per step). Prompts share prefixes, so the prefix cache shares
blocks: every block's ref_cnt equals the number of tables holding it, nothing leaks, and the free
count returns to the total. The same with several KV cache groups (a full-attention and a window group
drawing on one pool, prefix hits served by both): the full group holds a block for every token, the window
group at most its window's blocks, and its freed entries are the null block."""

import time
from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pagedserve.config import SchedulerConfig
from pagedserve.config.kv_layout import KVCacheGroups
from pagedserve.core.kv_cache_manager import KVCacheManager
from pagedserve.core.request import Request
from pagedserve.core.sched_output import ModelRunnerOutput
from pagedserve.core.scheduler import Scheduler
from pagedserve.protocol import EngineCoreRequest
from pagedserve.sampling_params import SamplingParams
from pagedserve.utils import cdiv

BLOCK_SIZE, MAX_MODEL_LEN, CHUNK = 4, 64, 24


class SchedulerMachine(RuleBasedStateMachine):
    num_blocks = 24
    layer_windows: list[int | None] = [None]

    def __init__(self) -> None:
        super().__init__()
        groups = KVCacheGroups.from_layer_windows(self.layer_windows, BLOCK_SIZE)
        self.kv = KVCacheManager(self.num_blocks, groups)
        self.scheduler = Scheduler(
            SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=CHUNK, max_model_len=MAX_MODEL_LEN),
            self.kv,
        )
        self.next_id = 0

    @rule(prompt_len=st.integers(1, 40), max_tokens=st.integers(1, 20), token=st.sampled_from([5, 6]))
    def add(self, prompt_len: int, max_tokens: int, token: int) -> None:
        max_tokens = min(max_tokens, MAX_MODEL_LEN - prompt_len)
        request = EngineCoreRequest(
            str(self.next_id), [token] * prompt_len, SamplingParams(max_tokens=max_tokens), None, time.time()
        )
        self.next_id += 1
        self.scheduler.add_request(Request(request))

    @rule()
    def step(self) -> None:
        """Grow: schedule, then sample a token for every request whose tokens were all computed."""
        out = self.scheduler.schedule()
        sampled = {
            rid: 7
            for rid in out.num_scheduled_tokens
            if self.scheduler.requests[rid].num_computed_tokens == self.scheduler.requests[rid].num_tokens
        }
        for rid in out.num_scheduled_tokens:
            request = self.scheduler.requests[rid]
            assert request.num_computed_tokens <= request.num_tokens
            num_groups = self.kv.num_groups
            entries = len(self.kv.get_block_ids(rid)) // num_groups
            assert entries * BLOCK_SIZE >= request.num_computed_tokens, "slots for every token"
            assert (entries - 1) * BLOCK_SIZE < request.num_computed_tokens, "waste < one block"
            for group, held in enumerate(self.kv.num_held_blocks_per_group(rid)):
                window = self.kv.groups.windows[group]
                if window is None:
                    assert held == entries, "a full-attention group holds every block"
                else:
                    assert held <= cdiv(window - 1 + CHUNK, BLOCK_SIZE) + 1, "a window group outgrew it"
        self.scheduler.update_from_output(out, ModelRunnerOutput(sampled))

    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        if self.scheduler.requests:
            rid = data.draw(st.sampled_from(sorted(self.scheduler.requests)))
            self.scheduler.abort_requests([rid])
            assert rid not in self.kv.req_to_blocks

    @invariant()
    def blocks_are_consistent(self) -> None:
        null = self.kv.block_pool.null_block
        owned = [b for blocks in self.kv.req_to_blocks.values() for b in blocks if b is not null]
        holders = Counter(b.block_id for b in owned)
        assert 0 not in holders, "the null block was handed out"
        for blocks in self.kv.req_to_blocks.values():
            assert len(blocks) % self.kv.num_groups == 0, "tables grow by one block per group"
            for group, window in enumerate(self.kv.groups.windows):
                if window is None:
                    assert null not in blocks[group :: self.kv.num_groups], "a full group lost a block"
        assert all(b.ref_cnt == holders[b.block_id] for b in owned), "ref_cnt is not the number of holders"
        assert len(holders) + self.kv.num_free_blocks() == self.num_blocks - 1, "a block leaked"
        for blocks in self.kv.req_to_blocks.values():
            held = [b.block_id for b in blocks if b is not null]
            assert len(set(held)) == len(held), "a table holds a block twice"
        assert set(self.kv.req_to_blocks) <= set(self.scheduler.requests)

    def teardown(self) -> None:
        for _ in range(5000):  # run everything to completion: every block returns
            if not self.scheduler.has_unfinished_requests():
                break
            self.step()
        assert not self.scheduler.has_unfinished_requests(), "no deadlock: all requests finish"
        assert self.kv.num_free_blocks() == self.num_blocks - 1


class HybridSchedulerMachine(SchedulerMachine):
    """Gemma 2's layout: alternating full and window (8 tokens) layers, two groups on one pool."""

    num_blocks = 48
    layer_windows = [8, None, 8, None]


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestHybridScheduler = HybridSchedulerMachine.TestCase
TestHybridScheduler.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
