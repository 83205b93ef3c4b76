"""Continuous batching: every step hands one token budget to running requests first, then to swapped-out
ones coming back, then to waiting ones.

There are no prefill/decode phases: a request has `num_computed_tokens` and `num_tokens`, and a step
computes some of the difference (a decode is a request with one new token; a long prompt is chunked).
Requests of one group (the samples of a prompt, the beams of a search) share KV blocks and are preempted
together. Which request comes first in each of those is `RequestOrder`'s (--scheduling-policy). With
pipeline micro-batches, requests whose step is in flight sit out (`StepsInFlight`'s rules).

This module makes the scheduling decisions (running groups, swap-in, admission, preemption); the
Scheduler builds on the update from each step's output (scheduler_update.py), the workers' diffs
(scheduler_diffs.py) and its state (scheduler_state.py).
"""

from dataclasses import dataclass

from pagedserve.core.block_pool import KVCacheBlock
from pagedserve.core.encoder_budget import encoder_cut, encoder_tokens
from pagedserve.core.groups import groups_of, plan_group
from pagedserve.core.kv_cache_interface import Plan, SlotAllocation
from pagedserve.core.preemption import log_cut_short
from pagedserve.core.request import Request, RequestStatus
from pagedserve.core.sched_output import SchedulerOutput
from pagedserve.core.scheduler_state import ScheduleStep
from pagedserve.core.scheduler_update import SchedulerUpdate, report
from pagedserve.protocol import FinishReason
from pagedserve.utils import cdiv

# What `allocate_slots` returns for a plan that grows in place (`KVCacheManager.grows_in_place`); shared,
# never modified.
_IN_PLACE = SlotAllocation([], [])


@dataclass(frozen=True)
class Admission:
    """What admitting a waiting request takes: seats of --max-num-seqs, its prefix-cache hits, and the
    tokens it computes this step after them."""

    more_seats: int
    hits: list[KVCacheBlock] | None
    num_cached: int
    num_new: int


class Scheduler(SchedulerUpdate):
    """Decides, each step, which requests compute how many tokens, within `max_num_seqs`,
    `max_num_batched_tokens` and the free KV blocks. When running requests need blocks and none are
    free, the newest (or least urgent) group is preempted: swapped out to host memory (the KV manager's
    swap space) or recomputed later (`config.preemption_mode`; by default groups that share blocks swap,
    single requests recompute). Waiting requests are admitted only as far as `admission` allows
    (KV-aware: preemptions stay rare)."""

    def schedule(self) -> SchedulerOutput:
        self._fork_ready_samples()
        step = ScheduleStep(self.config.max_num_batched_tokens, max_requests=self._batch_share())
        # NOTE: the queues are looked at only when they hold someone (a steady decode step calls nothing).
        if self.waiting:
            self._preempt_for_urgent_waiting(step)
        self._schedule_running(step)
        # NOTE: nobody comes back or is admitted in a step that had to preempt: memory is short already.
        if not step.memory_short and (self.swapped or self.waiting):
            self._swap_in(step)
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
        if step.new_reqs:
            output.first_scheduled_req_ids = self._started_request_ids(output)
        self._forget_req_ids = set()
        self.in_flight.sent(step.num_scheduled)
        if self.structured.num_constrained:
            output.grammar_bitmask = self.structured.bitmask(
                (self.requests[rid] for rid in step.num_scheduled), step.spec_tokens
            )
        return output

    def _batch_share(self) -> int | None:
        """Pipeline micro-batches: the most requests one batch takes, an even share of the live ones
        (running, waiting, swapped; at most --max-num-seqs run at once), so that the batches in flight
        stay balanced. None (no limit) with one batch at a time."""
        max_batches = self.in_flight.max_batches
        if max_batches == 1:
            return None
        num_live = len(self.running) + len(self.waiting) + sum(len(group) for group in self.swapped)
        return cdiv(min(num_live, self.config.max_num_seqs), max_batches)

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

    def _schedule_running(self, step: ScheduleStep) -> None:
        """Grow the running groups in order; when the blocks run out, preempt the last group."""
        kv = self.kv_cache_manager
        groups = self.in_flight.idle_groups(self.order.running_groups(groups_of(self.running)))
        images = self._num_with_images > 0  # NOTE: text-only batches skip the encoder budget per group
        index = 0
        while index < len(groups) and step.budget > 0 and not step.full:
            group = groups[index]
            plan = plan_group(group, step.budget)
            if images:
                plan = self._within_encoder_budget(plan, step)
            if kv.grows_in_place(plan):  # NOTE: most decodes: nothing to allocate, no preemption to weigh
                for request, num_new in plan:
                    self._record(step, request, num_new, _IN_PLACE)
                index += 1
                continue
            while kv.num_blocks_needed(plan) > kv.num_free_blocks():
                if self.in_flight.any:
                    # NOTE: no preemption while steps are in flight; once they are back, the group grows,
                    # or the victim is chosen among all running groups as at one batch at a time.
                    step.memory_short = True
                    return
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

    def _swap_in(self, step: ScheduleStep) -> None:
        """Bring swapped-out groups back in order while blocks and seats suffice, and while no waiting
        request outranks them (the priority policy: it is admitted first)."""
        kv = self.kv_cache_manager
        urgent = self.order.next_waiting(self.waiting, self.structured.is_ready)
        while self.swapped and step.budget > 0 and not step.full:
            group = self.order.next_swapped(self.swapped)
            if urgent is not None and self.order.outranks(urgent, group):
                return
            plan = self._within_encoder_budget(plan_group(group, step.budget), step)
            if (
                not self._adapter_fits(group[0], self._running_adapters())
                or self._num_seats_taken() + self._num_seats(group) > self.config.max_num_seqs
                or kv.num_blocks_to_resume(group, plan) > kv.num_free_blocks()
            ):
                # NOTE: it will never fit whole: recompute it request by request
                if not self.running and not self.in_flight.any:
                    self.swapped.remove(group)
                    self.preemption.requeue(group, self.waiting, kv.discard_swapped)
                return
            step.swap_in += kv.swap_in(group)
            self.swapped.remove(group)
            for request in group:
                request.status = RequestStatus.RUNNING
            self.running += group
            for request, num_new in plan:
                self._record(step, request, num_new, kv.allocate_slots(request, num_new))

    def _admit_waiting(self, step: ScheduleStep) -> None:
        """Admit waiting requests in order (`RequestOrder`; not before the swapped-out groups it puts
        first), reusing their longest cached prefix, while the seats and the KV admission policy allow
        (`_admission`). A request whose adapter would exceed --max-loras waits; those behind it go on."""
        if not self.waiting:  # NOTE: a decode step's common case: no pass over the running groups for seats
            return
        kv = self.kv_cache_manager
        seats = self._num_seats_taken()
        adapters = self._running_adapters()

        def ready(request: Request) -> bool:
            return self.structured.is_ready(request) and self._adapter_fits(request, adapters)

        while self.waiting and step.budget > 0 and not step.full:
            request = self.order.next_admission(self.waiting, self.swapped, ready)
            if request is None:
                return
            admission = self._admission(request, seats, step.budget)
            if admission is None:
                return
            limit = self.config.max_num_batched_tokens
            num_new = encoder_cut(
                request,
                admission.num_cached,
                admission.num_new,
                step.encoder_tokens,
                limit,
                self.config.whole_image_tokens is not None,
            )
            if num_new == 0:
                return  # its next image waits for the next step's encoder budget
            allocation = kv.allocate_slots(request, num_new, admission.hits)
            if allocation is None:
                if self.running or self.in_flight.any:
                    return
                self._cut_short(request)  # the pool is all free (nothing runs or is swapped) and too small
                continue
            self.waiting.remove(request)
            seats += admission.more_seats
            if request.lora_key:
                adapters.add(request.lora_key)
            request.num_computed_tokens = admission.num_cached
            if request.num_cached_tokens < 0:  # NOTE: a resumed request keeps its first hit, as vLLM's
                request.num_cached_tokens = admission.num_cached
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self._record(step, request, num_new, allocation)

    def _running_adapters(self, running: list[Request] | None = None) -> set[bytes]:
        """The adapters (identities) of the running requests (or of `running`; the base model's requests
        take no slot); none looked for without --enable-lora (this runs every step)."""
        if self.config.max_loras is None:
            return set()
        return {
            request.lora_key for request in (self.running if running is None else running) if request.lora_key
        }

    def _adapter_fits(self, request: Request, adapters: set[bytes]) -> bool:
        """--max-loras: the request's adapter runs already, or a slot is left for it."""
        limit = self.config.max_loras
        key = request.lora_key
        return limit is None or not key or key in adapters or len(adapters) < limit

    def _admission(
        self,
        request: Request,
        seats: int,
        budget: int,
        running: list[Request] | None = None,
        victims: list[Request] | None = None,
    ) -> Admission | None:
        """What admitting `request` now takes, or None when the seats (--max-num-seqs, counting the forks
        each group will make; `seats` are taken) or the KV admission policy do not allow it. With
        `victims`: as if they were preempted first (`running` are the others, `seats` theirs)."""
        kv = self.kv_cache_manager
        running = self.running if running is None else running
        mates = [r for r in running if request.group_id is not None and r.group_id == request.group_id]
        more_seats = self._num_seats(mates + [request]) - (self._num_seats(mates) if mates else 0)
        if seats + more_seats > self.config.max_num_seqs:
            return None
        hits = kv.get_computed_blocks(request)
        num_cached = kv.num_hit_tokens(hits)
        num_new = min(request.num_tokens - num_cached, budget)
        released = kv.num_blocks_released(victims, hits) if victims else 0
        if not self.admission.admits(request, num_cached + num_new, hits, running, kv, released):
            return None
        return Admission(more_seats, hits, num_cached, num_new)

    def _preempt_for_urgent_waiting(self, step: ScheduleStep) -> None:
        """--scheduling-policy priority: when the most urgent waiting request cannot be admitted, preempt
        the fewest running groups of a larger priority value that make room for it, or none when that
        would not admit it (`UrgentPreemption`). It is admitted in the next step (nobody is admitted in a
        step that preempted); not while swapped-out groups come first."""
        if not self.order.by_priority or self.in_flight.any:  # NOTE: no preemption while steps are in flight
            return
        request = self.order.next_admission(self.waiting, self.swapped, self.structured.is_ready)
        if request is None:
            return

        def admits(victims: list[list[Request]]) -> bool:
            gone = {id(r) for group in victims for r in group}
            running = [r for r in self.running if id(r) not in gone]
            seats = sum(self._num_seats(group) for group in groups_of(running))
            victim_requests = [r for group in victims for r in group]
            return self._adapter_fits(request, self._running_adapters(running)) and (
                self._admission(request, seats, step.budget, running, victim_requests) is not None
            )

        groups = self.order.running_groups(groups_of(self.running))
        for victim in self.urgent_preemption.victims(request, groups, admits):
            self._preempt(victim, step, alone=False, urgent=request)

    def _preempt(
        self, group: list[Request], step: ScheduleStep, alone: bool, urgent: Request | None = None
    ) -> None:
        """Take the group out of `running`: swapped out, or back to `waiting` (`Preemption`; `urgent`:
        the waiting request it yields to)."""
        step.memory_short = True
        ids = {request.request_id for request in group}
        self.running = [r for r in self.running if r.request_id not in ids]
        for request in group:
            self._forget(request)
        pairs = self.preemption.preempt(group, self.waiting, alone, urgent)
        if pairs is not None:
            step.swap_out += pairs
            self.swapped.appendleft(group)

    def _cut_short(self, request: Request) -> None:
        """End a request that can never be computed (its tokens need more blocks than the whole pool)."""
        log_cut_short(request, self.kv_cache_manager)
        request.finish_reason = FinishReason.LENGTH
        self._cut_outputs.append(report(request))
        self._finish([request])

    def _within_encoder_budget(self, plan: Plan, step: ScheduleStep) -> Plan:
        """`plan` with each image request's chunk cut before the images past the step's encoder budget."""
        limit, used, kept = self.config.max_num_batched_tokens, step.encoder_tokens, []
        for request, num_new in plan:
            if request.images:
                num_new = encoder_cut(
                    request,
                    request.num_computed_tokens,
                    num_new,
                    used,
                    limit,
                    self.config.whole_image_tokens is not None,
                )
                used += encoder_tokens(request, request.num_computed_tokens, num_new)
            if num_new > 0:
                kept.append((request, num_new))
        return kept
