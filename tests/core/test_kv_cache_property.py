"""Property test: random add / grow / finish / abort sequences through the real Scheduler and
KVCacheManager (no model: a fake token per step). Prompts share prefixes, so the prefix cache shares
blocks: every block's ref_cnt equals the number of tables holding it, nothing leaks, and the free
count returns to the total."""

import time
from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pagedserve.config import SchedulerConfig
from pagedserve.core.kv_cache_manager import KVCacheManager
from pagedserve.core.request import Request
from pagedserve.core.sched_output import ModelRunnerOutput
from pagedserve.core.scheduler import Scheduler
from pagedserve.protocol import EngineCoreRequest
from pagedserve.sampling_params import SamplingParams

NUM_BLOCKS, BLOCK_SIZE, MAX_MODEL_LEN = 24, 4, 64


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kv = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE)
        self.scheduler = Scheduler(
            SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=24, max_model_len=MAX_MODEL_LEN), self.kv
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
            blocks = self.kv.get_block_ids(rid)
            assert len(blocks) * BLOCK_SIZE >= request.num_computed_tokens, "slots for every token"
            assert (len(blocks) - 1) * BLOCK_SIZE < request.num_computed_tokens, "waste < one block"
        self.scheduler.update_from_output(out, ModelRunnerOutput(sampled))

    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        if self.scheduler.requests:
            rid = data.draw(st.sampled_from(sorted(self.scheduler.requests)))
            self.scheduler.abort_requests([rid])
            assert rid not in self.kv.req_to_blocks

    @invariant()
    def blocks_are_consistent(self) -> None:
        owned = [b for blocks in self.kv.req_to_blocks.values() for b in blocks]
        holders = Counter(b.block_id for b in owned)
        assert 0 not in holders, "the null block was handed out"
        assert all(b.ref_cnt == holders[b.block_id] for b in owned), "ref_cnt is not the number of holders"
        assert len(holders) + self.kv.num_free_blocks() == NUM_BLOCKS - 1, "a block leaked"
        for blocks in self.kv.req_to_blocks.values():
            assert len({b.block_id for b in blocks}) == len(blocks), "a table holds a block twice"
        assert set(self.kv.req_to_blocks) <= set(self.scheduler.requests)

    def teardown(self) -> None:
        for _ in range(5000):  # run everything to completion: every block returns
            if not self.scheduler.has_unfinished_requests():
                break
            self.step()
        assert not self.scheduler.has_unfinished_requests(), "no deadlock: all requests finish"
        assert self.kv.num_free_blocks() == NUM_BLOCKS - 1


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
