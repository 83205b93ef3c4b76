"""Continuous batching: every step hands one token budget to running requests first, then to swapped-out
ones coming back, then to waiting ones.

There are no prefill/decode phases: a request has `num_computed_tokens` and `num_tokens`, and a step
computes some of the difference (a decode is a request with one new token; a long prompt is chunked).
Requests of one group (the samples of a prompt, the beams of a search) share KV blocks and are preempted
together.
"""

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pagedserve.config import SchedulerConfig, SpeculativeConfig
from pagedserve.core.beam_search import BeamSearchManager
from pagedserve.core.groups import groups_of, plan_group
from pagedserve.core.kv_admission import KVAdmissionPolicy
from pagedserve.core.kv_cache_manager import BlockOwners, KVCacheManager, SlotAllocation
from pagedserve.core.parallel_sampling import ParallelSampling
from pagedserve.core.request import Request, RequestStatus
from pagedserve.core.sched_output import CachedRequestData, ModelRunnerOutput, NewRequestData, SchedulerOutput
from pagedserve.core.spec_decode import NgramProposer, adapt_num_spec_tokens, num_drafts_allowed
from pagedserve.core.structured import StructuredOutputs
from pagedserve.core.swap import SwapSpace
from pagedserve.logger import init_logger
from pagedserve.protocol import EngineCoreOutput, FinishReason, SchedulerStats
from pagedserve.structured_output.manager import StructuredOutputManager

logger = init_logger(__name__)


@dataclass
class _Step:
    """What one schedule() call has decided so far."""

    budget: int
    new_reqs: list[NewRequestData] = field(default_factory=list)
    cached_reqs: list[CachedRequestData] = field(default_factory=list)
    num_scheduled: dict[str, int] = field(default_factory=dict)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    spec_tokens: dict[str, list[int]] = field(default_factory=dict)
    preempted: bool = False


class Scheduler:
    """Decides, each step, which requests compute how many tokens, within `max_num_seqs`,
    `max_num_batched_tokens` and the free KV blocks. When running requests need blocks and none are
    free, the newest group is preempted: swapped out to host memory (`swap_space`) or recomputed later
    (`config.preemption_mode`; by default groups that share blocks swap, single requests recompute).
    Waiting requests are admitted only as far as `admission` allows (KV-aware: preemptions stay rare)."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache_manager: KVCacheManager,
        swap_space: SwapSpace | None = None,
        admission: KVAdmissionPolicy | None = None,
        structured_output: StructuredOutputManager | None = None,
        speculative: SpeculativeConfig | None = None,
    ) -> None:
        self.config = config
        self.structured = StructuredOutputs(structured_output)
        self.admission = admission or KVAdmissionPolicy()
        self.kv_cache_manager = kv_cache_manager
        self.swap_space = swap_space
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[list[Request]] = deque()  # groups, oldest first
        self.parallel_sampling = ParallelSampling()
        self.beam_search = BeamSearchManager()
        self.num_preemptions_total = 0
        self.num_recomputed_tokens_total = 0  # computed tokens whose KV a preemption dropped
        self._forget_req_ids: set[str] = set()  # the workers must drop these next step
        self._num_tokens_sent: dict[str, int] = {}  # how many tokens each worker copy holds
        self._cut_outputs: list[EngineCoreOutput] = []  # final outputs of requests that can never fit
        self._num_dropped_blocks: dict[str, int] = {}  # blocks trimmed since the workers last heard
        self.speculative = speculative
        self.ngram = NgramProposer(speculative) if speculative and speculative.method == "ngram" else None
        # Speculative decoding, cumulative: steps with drafts, draft tokens verified, drafts accepted.
        self.spec_num_drafts = self.spec_num_draft_tokens = self.spec_num_accepted_tokens = 0

    def add_request(self, request: Request) -> None:
        if request.beam_search is not None:
            self.beam_search.add(request)  # renames it: the search's first beam
        self.requests[request.request_id] = request
        self.structured.add(request)
        if not self.parallel_sampling.hold(request):
            self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def schedule(self) -> SchedulerOutput:
        step = _Step(self.config.max_num_batched_tokens)
        self._fork_ready_samples()
        self._schedule_running(step)
        # NOTE: nobody comes back or is admitted in a step that had to preempt: memory is short already.
        if not step.preempted:
            self._swap_in(step)
            if not self.swapped:
                self._admit_waiting(step)
        for request_id, num_new in step.num_scheduled.items():
            self.requests[request_id].num_computed_tokens += num_new
        output = SchedulerOutput(
            step.new_reqs,
            step.cached_reqs,
            step.num_scheduled,
            self.config.max_num_batched_tokens - step.budget,
            self._forget_req_ids,
            step.swap_out,
            step.swap_in,
            step.copies,
            step.spec_tokens,
        )
        output.first_scheduled_req_ids = self._started_request_ids(output)
        self._forget_req_ids = set()
        output.grammar_bitmask = self.structured.bitmask(self.requests[rid] for rid in step.num_scheduled)
        return output

    def _started_request_ids(self, output: SchedulerOutput) -> list[str]:
        """The frontend's ids (output ids) of the requests `output` starts for the first time. A request
        resumed after preemption is "new" to the workers again, but it left the queue before; a beam
        search is started by its first beam, under its first output id (its forks map to that id too)."""
        started: dict[str, None] = {}
        for new in output.scheduled_new_reqs:
            request = self.requests[new.request_id]
            if request.num_preemptions == 0:
                started[self.beam_search.output_id_of(request) or request.request_id] = None
        return list(started)

    def _fork_ready_samples(self) -> None:
        """Samples whose leader computed the prompt share its blocks and join it in `running` (one group,
        preempted together), each to compute the last prompt token itself. NOTE: never in `waiting`: a
        waiting request holds no blocks, so that the queue's head can always be admitted once the running
        requests are gone."""
        for leader, samples in self.parallel_sampling.ready():
            for sample in samples:
                self.kv_cache_manager.fork(leader, sample, sample.num_prompt_tokens - 1)
                sample.num_computed_tokens = sample.num_prompt_tokens - 1
                sample.status = RequestStatus.RUNNING
                self.running.append(sample)

    def _schedule_running(self, step: _Step) -> None:
        """Grow the running groups in order; when the blocks run out, preempt the newest group."""
        kv = self.kv_cache_manager
        groups = groups_of(self.running)  # oldest first
        index = 0
        while index < len(groups) and step.budget > 0:
            group = groups[index]
            plan = plan_group(group, step.budget)
            while kv.num_blocks_needed(plan) > kv.num_free_blocks():
                victim = groups.pop()
                if (
                    victim is group
                    and not groups
                    and len(group) == 1
                    and not self.beam_search.width_of(group[0])
                ):
                    self._cut_short(group[0])  # alone, it has the whole pool and still cannot grow
                    return
                self._preempt(victim, step, alone=not groups)
                if victim is group:
                    return
            for request, num_new in plan:
                self._record(step, request, num_new, kv.allocate_slots(request, num_new))
            index += 1

    def _swap_in(self, step: _Step) -> None:
        """Bring swapped-out groups back, oldest first, while blocks and seats suffice."""
        swap, kv = self.swap_space, self.kv_cache_manager
        while self.swapped and step.budget > 0:
            assert swap is not None, "only a swap space holds swapped-out requests"
            group = self.swapped[0]
            plan = plan_group(group, step.budget)
            if (
                self._num_seats_taken() + self._num_seats(group) > self.config.max_num_seqs
                or swap.num_blocks_to_resume(group, plan, kv) > kv.num_free_blocks()
            ):
                if not self.running:  # it will never fit whole: recompute it request by request
                    self.swapped.popleft()
                    self._requeue(group, swap.discard)
                return
            step.swap_in += swap.swap_in(group, kv)
            self.swapped.popleft()
            for request in group:
                request.status = RequestStatus.RUNNING
            self.running += group
            for request, num_new in plan:
                self._record(step, request, num_new, kv.allocate_slots(request, num_new))

    def _admit_waiting(self, step: _Step) -> None:
        """Admit waiting requests FCFS, reusing their longest cached prefix, while the seats
        (--max-num-seqs, counting the forks each group will make) and the KV admission policy allow."""
        kv = self.kv_cache_manager
        seats = self._num_seats_taken()
        while self.waiting and step.budget > 0:
            # NOTE: a request whose grammar is still compiling keeps its place; the ones behind it go on.
            request = next((r for r in self.waiting if self.structured.is_ready(r)), None)
            if request is None:
                return
            mates = [
                r for r in self.running if request.group_id is not None and r.group_id == request.group_id
            ]
            more_seats = self._num_seats(mates + [request]) - (self._num_seats(mates) if mates else 0)
            if seats + more_seats > self.config.max_num_seqs:
                return
            hits = kv.get_computed_blocks(request)
            num_cached = len(hits or []) * kv.block_size
            num_new = min(request.num_tokens - num_cached, step.budget)
            if not self.admission.admits(request, num_cached + num_new, hits, self.running, kv):
                return
            allocation = kv.allocate_slots(request, num_new, hits)
            if allocation is None:
                if self.running:
                    return
                self._cut_short(request)  # the pool is all free (nothing runs or is swapped) and too small
                continue
            self.waiting.remove(request)
            seats += more_seats
            request.num_computed_tokens = num_cached
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self._record(step, request, num_new, allocation)

    def _num_seats(self, group: list[Request]) -> int:
        """Seats of --max-num-seqs that a group takes: its members, or as many as it will fork into
        (a leader's held samples; a beam search's width), so that forks never exceed the limit."""
        first = group[0]
        return max(
            len(group), 1 + self.parallel_sampling.num_held_by(first), self.beam_search.width_of(first)
        )

    def _num_seats_taken(self) -> int:
        return sum(self._num_seats(group) for group in groups_of(self.running))

    def _cut_short(self, request: Request) -> None:
        """End a request that can never be computed: its tokens need more KV blocks than the whole pool
        (it grew past it, or was preempted just before). Like vLLM, it ends with finish reason 'length'."""
        kv = self.kv_cache_manager
        logger.warning(
            "Request %s ends early (finish_reason 'length'): its %d tokens need more KV blocks than "
            "the whole cache holds, %d blocks of %d tokens. Lower max_tokens or --max-model-len, or "
            "raise --kv-cache-memory (--gpu-memory-utilization on a GPU, or --num-gpu-blocks-override).",
            request.request_id,
            request.num_tokens,
            kv.num_usable_blocks,
            kv.block_size,
        )
        request.finish_reason = FinishReason.LENGTH
        self._cut_outputs.append(EngineCoreOutput(request.request_id, [], finish_reason=FinishReason.LENGTH))
        self._finish([request])

    def _record(self, step: _Step, request: Request, num_new: int, allocation: SlotAllocation | None) -> None:
        assert allocation is not None, "the caller checked the free blocks"
        request_id = request.request_id
        step.copies += allocation.copies
        # NOTE: a copy on write replaced a block mid-table: the workers get the whole request again.
        if request_id in self._num_tokens_sent and not allocation.table_rewritten:
            num_sent = self._num_tokens_sent[request_id]
            step.cached_reqs.append(
                CachedRequestData(
                    request_id,
                    request.all_token_ids[num_sent:],
                    allocation.new_block_ids,
                    request.num_computed_tokens,
                    self._num_dropped_blocks.pop(request_id, 0),
                )
            )
        else:
            self._num_dropped_blocks.pop(request_id, None)
            step.new_reqs.append(
                NewRequestData(
                    request_id,
                    list(request.all_token_ids),
                    request.num_prompt_tokens,
                    request.sampling_params,
                    request.eos_token_id,
                    self.kv_cache_manager.get_block_ids(request_id),
                    request.num_computed_tokens,
                )
            )
        self._num_tokens_sent[request_id] = request.num_tokens
        num_drafts = request.num_computed_tokens + num_new - request.num_tokens
        if num_drafts > 0:
            step.spec_tokens[request_id] = request.spec_token_ids[:num_drafts]
        step.num_scheduled[request_id] = num_new
        step.budget -= num_new

    def _preempt(self, group: list[Request], step: _Step, alone: bool) -> None:
        """Swap the group out (its KV to host blocks) when the mode says so and the host blocks
        suffice; else drop its KV and queue it first for recompute. A group that cannot grow even
        `alone` (nothing else running) is recomputed; parallel samples then go on as independent
        requests (each fits the pool alone), else they would be admitted and preempted together forever.
        (A beam search always fits alone: the frontend checks its worst case.)"""
        step.preempted = True
        swap_allowed = not alone
        if alone and self.beam_search.width_of(group[0]) == 0:
            for request in group:
                request.group_id = None
        ids = {request.request_id for request in group}
        self.running = [r for r in self.running if r.request_id not in ids]
        for request in group:
            self._forget(request.request_id)
            request.num_preemptions += 1
            request.spec_token_ids = []
        self.num_preemptions_total += 1
        mode = self.config.preemption_mode or ("swap" if len(group) > 1 else "recompute")
        pairs = None
        if mode == "swap" and swap_allowed and self.swap_space is not None:
            pairs = self.swap_space.swap_out(group, self.kv_cache_manager)
        if pairs is not None:
            step.swap_out += pairs
            for request in group:
                request.status = RequestStatus.SWAPPED
            self.swapped.appendleft(group)
        else:
            self._requeue(group, self.kv_cache_manager.free)
        how = "swap" if pairs is not None else "recompute"
        if mode == "swap" and pairs is None:
            how += (
                ", too large to swap whole"
                if not swap_allowed
                else ", the swap space (--swap-space) is full"
                if self.swap_space
                else ", no --swap-space"
            )
        for request in group:
            logger.info(
                "Preempted request %s (%s; %d tokens): no free KV block for the running requests "
                "(%d free after it). Total preemptions: %d, recomputed tokens: %d.",
                request.request_id,
                how,
                request.num_tokens,
                self.kv_cache_manager.num_free_blocks(),
                self.num_preemptions_total,
                self.num_recomputed_tokens_total,
            )

    def _requeue(self, group: list[Request], drop_kv: Callable[[Request], None]) -> None:
        """Recompute preemption: drop the KV (`drop_kv`), queue the group first."""
        for request in reversed(group):
            drop_kv(request)
            self.beam_search.forget_report(request)
            request.status = RequestStatus.PREEMPTED
            self.num_recomputed_tokens_total += request.num_computed_tokens
            request.num_computed_tokens = 0
            self.waiting.appendleft(request)

    def _forget(self, request_id: str) -> None:
        self._num_dropped_blocks.pop(request_id, None)
        if self._num_tokens_sent.pop(request_id, None) is not None:
            self._forget_req_ids.add(request_id)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Append sampled tokens, apply token-level stop conditions, free finished requests, advance
        beam searches."""
        outputs, self._cut_outputs = self._cut_outputs, []
        finished: list[Request] = []
        for request_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted or preempted meanwhile
            prompt_logprobs = runner_output.prompt_logprobs.get(request_id)
            token_id = runner_output.sampled_token_ids.get(request_id)
            if token_id is None:
                if prompt_logprobs is not None:
                    outputs.append(EngineCoreOutput(request_id, [], prompt_logprobs=prompt_logprobs))
                continue
            logprobs = runner_output.logprobs.get(request_id)
            if self.beam_search.report(request, logprobs):
                continue  # a beam: its search picks the continuations
            output = EngineCoreOutput(request_id, [], [logprobs] if logprobs else None, prompt_logprobs)
            for token in [token_id, *runner_output.extra_token_ids.get(request_id, ())]:
                request.append_token(token)
                output.new_token_ids.append(token)
                grammar_complete = self.structured.accept(request, token)
                if request.check_stop(self.config.max_model_len, grammar_complete):
                    output.finish_reason, output.stop_reason = request.finish_reason, request.stop_reason
                    finished.append(request)
                    break
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(request_id)
            if drafts:
                self._settle_drafts(request, drafts, len(output.new_token_ids) - 1)
            outputs.append(output)
        pruned, beam_outputs = self.beam_search.advance(self._fork_beam)
        self._finish(finished + pruned)
        if self.speculative is not None:
            self._propose_drafts(runner_output.draft_token_ids)
        return outputs + beam_outputs

    def _settle_drafts(self, request: Request, drafts: list[int], num_accepted: int) -> None:
        """After verification: the rejected drafts' K/V were computed but are not the request's. Their
        slots are written again from num_computed_tokens on; blocks holding nothing else are released."""
        self.spec_num_drafts += 1
        self.spec_num_draft_tokens += len(drafts)
        self.spec_num_accepted_tokens += num_accepted
        assert self.speculative is not None, "drafts come with a speculative config"
        adapt_num_spec_tokens(request, len(drafts), num_accepted, self.speculative.num_speculative_tokens)
        request.spec_token_ids = []
        request.num_computed_tokens = min(request.num_computed_tokens, request.num_tokens - 1)
        if request.finish_reason is None:
            dropped = self.kv_cache_manager.trim(request)
            if dropped:
                self._num_dropped_blocks[request.request_id] = (
                    self._num_dropped_blocks.get(request.request_id, 0) + dropped
                )

    def _propose_drafts(self, draft_model_proposals: dict[str, list[int]]) -> None:
        """Draft tokens for the next step: n-gram prompt lookup here, or the draft model's proposals."""
        assert self.speculative is not None
        for request in self.running:
            num = num_drafts_allowed(
                request, self.speculative.num_speculative_tokens, self.config.max_model_len
            )
            if not num:
                request.spec_token_ids = []
            elif self.ngram is not None:
                request.spec_token_ids = self.ngram.propose(request.all_token_ids, num)
            else:
                request.spec_token_ids = draft_model_proposals.get(request.request_id, [])[:num]

    def _fork_beam(self, parent: Request, request_id: str) -> Request:
        assert parent.status is RequestStatus.RUNNING, "a beam forks right after it reported"
        child = parent.fork(request_id)
        self.kv_cache_manager.fork(parent, child, parent.num_computed_tokens)
        self.requests[request_id] = child
        self.running.append(child)
        return child

    def abort_requests(self, request_ids: list[str]) -> None:
        """End requests wherever they are (held, waiting, running, swapped) and free their blocks at
        once. A beam search's request id or output ids end the whole search."""
        request_ids = self.beam_search.take_aborted(request_ids)
        requests = [self.requests[rid] for rid in request_ids if rid in self.requests]
        for request in requests:
            request.finish_reason = FinishReason.ABORT
        self._finish(requests)

    def _finish(self, requests: list[Request]) -> None:
        gone = {request.request_id for request in requests}
        self.running = [r for r in self.running if r.request_id not in gone]
        if any(r.status is not RequestStatus.RUNNING for r in requests):
            self.waiting = deque(r for r in self.waiting if r.request_id not in gone)
            groups = ([r for r in group if r.request_id not in gone] for group in self.swapped)
            self.swapped = deque(group for group in groups if group)
        released: list[Request] = []
        for request in requests:
            if request.status is RequestStatus.SWAPPED:
                assert self.swap_space is not None
                self.swap_space.discard(request)
            else:
                self.kv_cache_manager.free(request)
            request.status = RequestStatus.FINISHED
            self.structured.remove(request)
            released += self.parallel_sampling.forget(request)
            self._forget(request.request_id)
            del self.requests[request.request_id]
        # NOTE: samples whose leader ended before they forked compute the prompt themselves.
        self.waiting.extendleft(reversed([r for r in released if r.request_id not in gone]))

    def reset_prefix_cache(self) -> int:
        """Forget every cached block hash; returns how many blocks were cached."""
        return self.kv_cache_manager.reset_prefix_cache()

    def describe(self, max_requests: int) -> str:
        """The queues, the KV usage and (the first `max_requests` of) the running requests, for a log."""
        stats = self.get_stats()
        running = ", ".join(
            f"{r.request_id} ({r.num_computed_tokens}/{r.num_tokens} tokens computed)"
            for r in self.running[:max_requests]
        )
        return (
            f"Running: {stats.num_running_reqs} requests, waiting: {stats.num_waiting_reqs}, KV cache "
            f"{stats.kv_cache_usage:.1%} used ({self.kv_cache_manager.num_free_blocks()} free blocks). "
            f"The step in progress computes: {running or 'nothing'}."
        )

    def block_owners(self) -> BlockOwners:
        """Who holds each KV block now."""
        return self.kv_cache_manager.block_owners()

    def get_stats(self) -> SchedulerStats:
        kv = self.kv_cache_manager
        kv_stats = kv.stats()
        stored = sum(
            request.num_computed_tokens
            for request in self.requests.values()
            if kv.num_table_entries(request.request_id)
        )
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting) + self.parallel_sampling.num_held(),
            kv_cache_usage=kv_stats.usage,
            num_preemptions_total=self.num_preemptions_total,
            num_recomputed_tokens_total=self.num_recomputed_tokens_total,
            num_kv_slots_allocated=kv_stats.num_allocated_slots,
            num_kv_tokens_stored=stored,
            num_shared_blocks=kv_stats.num_shared_blocks,
            num_blocks_saved=kv_stats.num_blocks_saved,
            num_swapped_reqs=sum(len(group) for group in self.swapped),
            prefix_cache_queries=kv_stats.prefix_cache_queries,
            prefix_cache_hits=kv_stats.prefix_cache_hits,
            spec_decode_num_drafts=self.spec_num_drafts,
            spec_decode_num_draft_tokens=self.spec_num_draft_tokens,
            spec_decode_num_accepted_tokens=self.spec_num_accepted_tokens,
        )
