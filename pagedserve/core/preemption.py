"""Preemption: when the running groups need KV blocks and none are free, the newest group (the least
urgent under --scheduling-policy priority) is swapped out to host blocks or dropped and recomputed later;
a request that can never fit ends with 'length'."""

from collections.abc import Callable

from pagedserve.core.request import Request, RequestStatus
from pagedserve.core.scheduler_state import SchedulerState, ScheduleStep
from pagedserve.logger import init_logger
from pagedserve.protocol import EngineCoreOutput, FinishReason

logger = init_logger(__name__)


class Preemption(SchedulerState):
    """The Scheduler's preemption and cut-short decisions."""

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

    def _preempt(self, group: list[Request], step: ScheduleStep, alone: bool) -> None:
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
        if mode == "swap" and swap_allowed:
            pairs = self.kv_cache_manager.swap_out(group)
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
                if self.kv_cache_manager.can_swap
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
        """Recompute preemption: drop the KV (`drop_kv`), queue the group first (under priority, first
        among its equals)."""
        for request in reversed(group):
            drop_kv(request)
            self.beam_search.forget_report(request)
            request.status = RequestStatus.PREEMPTED
            self.num_recomputed_tokens_total += request.num_computed_tokens
            request.num_computed_tokens = 0
            self.order.enqueue(self.waiting, request, first=True)
