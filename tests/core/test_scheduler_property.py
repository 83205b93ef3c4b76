"""Property test of the whole scheduler over tiny pools (no torch): random arrivals of single requests,
parallel-sample groups (n) and beam searches, aborts and steps, with or without prefix caching and swap
space, in every preemption mode. A fake runner samples tokens and reports beam logprobs (EOS among
them). Invariants: waiting requests hold no KV block, forks never exceed --max-num-seqs, both pools'
reference counts are consistent, and progress: while work exists, no more than K steps in a row
advance nobody; at the end everything finishes within a bounded number of steps and nothing leaks."""

import time

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from test_kv_sharing_property import check_pool

from pagedserve.config import SchedulerConfig
from pagedserve.config.kv_layout import KVCacheGroups
from pagedserve.core.kv_cache_manager import KVCacheManager
from pagedserve.core.request import Request
from pagedserve.core.sched_output import ModelRunnerOutput
from pagedserve.core.scheduler import Scheduler
from pagedserve.protocol import EngineCoreRequest, PositionLogprobs, child_request_id
from pagedserve.sampling_params import BeamSearchParams, SamplingParams

BLOCK_SIZE, MAX_NUM_SEQS, MAX_MODEL_LEN, EOS = 4, 4, 32, 2
MAX_IDLE_STEPS = 2  # a step that only preempts, then one that admits
Progress = tuple[int, int]  # (tokens computed in all, requests ended)


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        num_blocks=st.integers(9, 20),
        num_host_blocks=st.sampled_from([0, 3, 8]),
        caching=st.booleans(),
        mode=st.sampled_from([None, "recompute", "swap"]),
    )
    def setup(self, num_blocks: int, num_host_blocks: int, caching: bool, mode: str | None) -> None:
        if mode == "swap" and not num_host_blocks:
            mode = None
        self.num_usable = num_blocks - 1
        self.scheduler = Scheduler(
            SchedulerConfig(MAX_NUM_SEQS, 16, MAX_MODEL_LEN, mode),
            KVCacheManager(num_blocks, KVCacheGroups.uniform(BLOCK_SIZE), caching, num_host_blocks),
        )
        self.next_id = 0
        self.ended: set[str] = set()  # frontend ids whose every output finished
        self.expected: dict[str, set[str]] = {}  # frontend id -> output ids not finished yet
        self.idle_steps = 0

    def _add(self, prompt: list[int], max_tokens: int, n: int, beam: BeamSearchParams | None) -> None:
        self.next_id += 1
        request_id = str(self.next_id)
        params = SamplingParams(n=n, temperature=0.0 if beam else 1.0, seed=1, max_tokens=max_tokens)
        self.expected[request_id] = {child_request_id(request_id, i, n) for i in range(n)}
        if beam is not None or n == 1:
            self.scheduler.add_request(
                Request(EngineCoreRequest(request_id, prompt, params, EOS, time.time(), beam_search=beam))
            )
            return
        for index in range(n):  # as the frontend splits a group: one request per sample, one group id
            sample = SamplingParams(n=1, temperature=1.0, seed=index, max_tokens=max_tokens)
            self.scheduler.add_request(
                Request(
                    EngineCoreRequest(
                        child_request_id(request_id, index, n),
                        prompt,
                        sample,
                        EOS,
                        time.time(),
                        group_id=request_id,
                    )
                )
            )

    @rule(
        prompt=st.lists(st.integers(3, 5), min_size=1, max_size=20),
        max_tokens=st.integers(1, 12),
        n=st.integers(1, 3),
    )
    def add_requests(self, prompt: list[int], max_tokens: int, n: int) -> None:
        self._add(prompt, max_tokens, n, None)

    @rule(
        prompt=st.lists(st.integers(3, 5), min_size=1, max_size=12),
        max_tokens=st.integers(1, 8),
        width=st.integers(1, 3),
        early_stopping=st.sampled_from([True, False, "never"]),
    )
    def add_beam_search(
        self, prompt: list[int], max_tokens: int, width: int, early_stopping: bool | str
    ) -> None:
        # NOTE: the frontend admits only searches whose beams fit the pool unshared (input_processor.py).
        if width * -(-(len(prompt) + max_tokens) // BLOCK_SIZE) > self.num_usable:
            return
        self._add(
            prompt, max_tokens, width, BeamSearchParams(width, max_tokens, early_stopping=early_stopping)
        )

    @precondition(lambda self: self.expected)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.expected)))
        self.scheduler.abort_requests(sorted(self.expected.pop(request_id)))

    @rule()
    def step(self) -> None:
        before = self._progress()
        scheduler = self.scheduler
        has_work = scheduler.has_unfinished_requests()
        out = scheduler.schedule()
        assert len(scheduler.running) <= MAX_NUM_SEQS, "forks exceeded --max-num-seqs"
        sampled, logprobs = {}, {}
        for request_id in out.num_scheduled_tokens:
            request = scheduler.requests[request_id]
            if request.num_computed_tokens == request.num_tokens:
                sampled[request_id] = 3 + (request.num_tokens + len(request_id)) % 3
                # a beam ranks 2 * width candidates; EOS competes
                tokens = [EOS, 3, 4, 5, 6, 7]
                values = [-0.1 * ((token * 7 + request.num_tokens) % 11) - 0.01 * token for token in tokens]
                logprobs[request_id] = PositionLogprobs(tokens, values, rank=1)
        for output in scheduler.update_from_output(out, ModelRunnerOutput(sampled, logprobs=logprobs)):
            if output.finished:
                for pending in self.expected.values():
                    pending.discard(output.request_id)
        self.expected = {rid: pending for rid, pending in self.expected.items() if pending}
        advanced = self._progress() != before or bool(out.finished_req_ids)
        self.idle_steps = 0 if advanced or not has_work else self.idle_steps + 1

    def _progress(self) -> Progress:
        requests = self.scheduler.requests.values()
        return sum(r.num_computed_tokens + r.num_tokens for r in requests), len(requests)

    @invariant()
    def progress_within_k_steps(self) -> None:
        assert self.idle_steps <= MAX_IDLE_STEPS, f"{self.idle_steps} steps in a row advanced nobody"

    @invariant()
    def waiting_requests_hold_no_blocks(self) -> None:
        kv = self.scheduler.kv_cache_manager
        for request in self.scheduler.waiting:
            assert not kv.req_to_blocks.get(request.request_id), f"{request.request_id} waits holding blocks"

    @invariant()
    def pools_are_consistent(self) -> None:
        kv, swap = self.scheduler.kv_cache_manager, self.scheduler.kv_cache_manager.swap_space
        null = kv.block_pool.null_block
        check_pool(kv.block_pool, kv.req_to_blocks, self.num_usable, null)
        if swap is not None:
            check_pool(swap.pool, swap.tables, swap.num_blocks, null)

    def teardown(self) -> None:
        for _ in range(2000):
            if not self.scheduler.has_unfinished_requests():
                break
            self.step()
            self.progress_within_k_steps()
        assert not self.scheduler.has_unfinished_requests(), "work left after 2000 steps"
        assert not self.expected, f"requests never answered: {sorted(self.expected)}"
        kv, swap = self.scheduler.kv_cache_manager, self.scheduler.kv_cache_manager.swap_space
        assert kv.num_free_blocks() == self.num_usable and not kv.req_to_blocks
        assert swap is None or (swap.num_free_blocks() == swap.num_blocks and not swap.tables)


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(max_examples=50, stateful_step_count=40, deadline=None)
