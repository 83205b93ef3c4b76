"""The scheduler's state: its queues (waiting, running, swapped-out groups), its requests, what the workers
were last told, and what it reports (stats, the stall log). The scheduling decisions build on it
(scheduler.py); preemption and draft settling are its collaborators (preemption.py, draft_settling.py)."""

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from pagedserve.config import SchedulerConfig, SpeculativeConfig
from pagedserve.config.reasoning import ReasoningConfig
from pagedserve.core.beam_search import BeamSearchManager
from pagedserve.core.draft_settling import DraftSettling
from pagedserve.core.groups import groups_of
from pagedserve.core.kv_admission import KVAdmissionPolicy
from pagedserve.core.kv_cache_interface import BlockOwners
from pagedserve.core.kv_cache_manager import KVCacheManager
from pagedserve.core.parallel_sampling import ParallelSampling
from pagedserve.core.preemption import Preemption
from pagedserve.core.request import Request, RequestStatus
from pagedserve.core.request_order import RequestOrder
from pagedserve.core.sched_output import CachedRequestData, NewRequestData
from pagedserve.core.steps_in_flight import StepsInFlight
from pagedserve.core.structured import StructuredOutputs
from pagedserve.core.thinking import Thinking
from pagedserve.core.urgent_preemption import UrgentPreemption
from pagedserve.protocol import EngineCoreOutput, FinishReason, SchedulerStats
from pagedserve.structured_output.manager import StructuredOutputManager


@dataclass(frozen=True)
class RequestKVUsage:
    """What one request holds of the KV cache (tests and logs read it through EngineCore)."""

    num_computed_tokens: int
    blocks_per_group: list[int]


@dataclass
class ScheduleStep:
    """What one schedule() call has decided so far."""

    budget: int
    new_reqs: list[NewRequestData] = field(default_factory=list)
    cached_reqs: list[CachedRequestData] = field(default_factory=list)
    num_scheduled: dict[str, int] = field(default_factory=dict)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    spec_tokens: dict[str, list[int]] = field(default_factory=dict)
    # The most requests this step takes (None: any number; pipeline micro-batches take a share each).
    max_requests: int | None = None
    # Blocks ran short: a group was preempted, or waits for the steps in flight. Nobody comes back or is
    # admitted in such a step.
    memory_short: bool = False
    encoder_tokens: int = 0  # image tokens the step's scheduled chunks encode (core/encoder_budget.py)

    @property
    def full(self) -> bool:
        return self.max_requests is not None and len(self.num_scheduled) >= self.max_requests


class SchedulerState:
    """Requests and queues of a Scheduler, and the operations that only keep them consistent (add, end,
    forget, report)."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache_manager: KVCacheManager,
        admission: KVAdmissionPolicy | None = None,
        structured_output: StructuredOutputManager | None = None,
        speculative: SpeculativeConfig | None = None,
        max_batches_in_flight: int = 1,
        reasoning: ReasoningConfig | None = None,
    ) -> None:
        self.config = config
        self.order = RequestOrder(config)
        thinking = Thinking(reasoning) if reasoning is not None and reasoning.tracks_thinking else None
        self.structured = StructuredOutputs(structured_output, thinking)
        self.admission = admission or KVAdmissionPolicy()
        self.kv_cache_manager = kv_cache_manager
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[list[Request]] = deque()  # groups, oldest first
        self.parallel_sampling = ParallelSampling()
        self.beam_search = BeamSearchManager()
        self.preemption = Preemption(config, kv_cache_manager, self.order, self.beam_search)
        self.urgent_preemption = UrgentPreemption(self.order)
        self.in_flight = StepsInFlight(max_batches_in_flight)
        self.drafts = (
            None
            if speculative is None
            else DraftSettling(speculative, kv_cache_manager, config.max_model_len)
        )
        self._forget_req_ids: set[str] = set()  # the workers must drop these next step
        self._cut_outputs: list[EngineCoreOutput] = []  # final outputs of requests that can never fit
        self._num_dropped_blocks: dict[str, int] = {}  # blocks trimmed since the workers last heard
        # Requests with images among `requests`: a text-only step skips the encoder budget without a pass.
        self._num_with_images = 0

    def add_request(self, request: Request) -> None:
        if request.beam_search is not None:
            self.beam_search.add(request)  # renames it: the search's first beam
        self._keep(request)
        self.structured.add(request)
        if not self.parallel_sampling.hold(request):
            self.order.enqueue(self.waiting, request)

    def _keep(self, request: Request) -> None:
        """`request` joins `requests` (added, or forked from a beam)."""
        self.requests[request.request_id] = request
        self._num_with_images += bool(request.images)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def _num_seats(self, group: list[Request]) -> int:
        """Seats of --max-num-seqs that a group takes: its members, or as many as it will fork into
        (a leader's held samples; a beam search's width), so that forks never exceed the limit."""
        first = group[0]
        return max(
            len(group), 1 + self.parallel_sampling.num_held_by(first), self.beam_search.width_of(first)
        )

    def _num_seats_taken(self) -> int:
        return sum(self._num_seats(group) for group in groups_of(self.running))

    def _forget(self, request: Request) -> None:
        """The workers drop their copy of `request` next step (if they hold one)."""
        self._num_dropped_blocks.pop(request.request_id, None)
        if request.num_tokens_sent is not None:
            request.num_tokens_sent = None
            self._forget_req_ids.add(request.request_id)

    def abort_requests(self, request_ids: list[str]) -> None:
        """End requests wherever they are (held, waiting, running, swapped) and free their blocks at
        once (a running request's when its step in flight returns). A beam search's request id or output
        ids end the whole search."""
        request_ids = self.beam_search.take_aborted(request_ids)
        requests = [self.requests[rid] for rid in request_ids if rid in self.requests]
        for request in requests:
            request.finish_reason = FinishReason.ABORT
        self._finish(requests)

    def _finish(self, requests: list[Request]) -> None:
        if not requests:  # NOTE: most steps: no pass over the running list
            return
        gone = {request.request_id for request in requests}
        self.running = [r for r in self.running if r.request_id not in gone]
        if any(r.status is not RequestStatus.RUNNING for r in requests):
            self.waiting = deque(r for r in self.waiting if r.request_id not in gone)
            groups = ([r for r in group if r.request_id not in gone] for group in self.swapped)
            self.swapped = deque(group for group in groups if group)
        released: list[Request] = []
        for request in requests:
            if request.status is RequestStatus.SWAPPED:
                self.kv_cache_manager.discard_swapped(request)
            elif not self.in_flight.keep_blocks_of(request):
                self.kv_cache_manager.free(request)
            request.status = RequestStatus.FINISHED
            self.structured.remove(request)
            released += self.parallel_sampling.forget(request)
            self._forget(request)
            del self.requests[request.request_id]
            self._num_with_images -= bool(request.images)
        # NOTE: samples whose leader ended before they forked compute the prompt themselves.
        for request in reversed([r for r in released if r.request_id not in gone]):
            self.order.enqueue(self.waiting, request, first=True)

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

    def request_kv_usage(self, request_id: str) -> RequestKVUsage | None:
        """A live request's computed tokens and the blocks it holds per KV cache group; None once gone."""
        request = self.requests.get(request_id)
        if request is None:
            return None
        return RequestKVUsage(
            request.num_computed_tokens, self.kv_cache_manager.num_held_blocks_per_group(request_id)
        )

    def get_stats(self) -> SchedulerStats:
        kv, drafts = self.kv_cache_manager, self.drafts
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
            num_preemptions_total=self.preemption.num_preemptions_total,
            num_recomputed_tokens_total=self.preemption.num_recomputed_tokens_total,
            num_priority_preemptions=self.preemption.num_yields_total,
            num_kv_slots_allocated=kv_stats.num_allocated_slots,
            num_kv_tokens_stored=stored,
            num_shared_blocks=kv_stats.num_shared_blocks,
            num_blocks_saved=kv_stats.num_blocks_saved,
            num_swapped_reqs=sum(len(group) for group in self.swapped),
            prefix_cache_queries=kv_stats.prefix_cache_queries,
            prefix_cache_hits=kv_stats.prefix_cache_hits,
            spec_decode_num_drafts=drafts.num_drafts if drafts else 0,
            spec_decode_num_draft_tokens=drafts.num_draft_tokens if drafts else 0,
            spec_decode_num_accepted_tokens=drafts.num_accepted_tokens if drafts else 0,
            running_lora_adapters=self._adapter_names(self.running),
            waiting_lora_adapters=self._adapter_names(self.waiting),
        )

    def _adapter_names(self, requests: Iterable[Request]) -> list[str]:
        """The adapters of `requests` (without --enable-lora: none, without looking at each request)."""
        if self.config.max_loras is None:
            return []
        return sorted({r.lora_request.lora_name for r in requests if r.lora_request is not None})
