"""Preemption: when the running groups need KV blocks and none are free, the newest group (the least
urgent under --scheduling-policy priority) is swapped out to host blocks or dropped and recomputed later;
under priority a waiting request also preempts lazier groups when that admits it (urgent_preemption.py).
A request that can never fit ends with 'length'. The scheduler picks the victim; this collaborator
decides how it goes and keeps the counts."""

from collections import deque
from collections.abc import Callable

from pagedserve.config import SchedulerConfig
from pagedserve.core.beam_search import BeamSearchManager
from pagedserve.core.kv_cache_manager import KVCacheManager
from pagedserve.core.request import Request, RequestStatus
from pagedserve.core.request_order import RequestOrder
from pagedserve.logger import init_logger

logger = init_logger(__name__)


class Preemption:
    """Swap-out or recompute of a preempted group, through the KV manager; the waiting queue it puts
    recomputed requests back into is the scheduler's, passed in."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        order: RequestOrder,
        beam_search: BeamSearchManager,
    ) -> None:
        self.config, self.kv, self.order, self.beam_search = config, kv, order, beam_search
        self.num_preemptions_total = 0
        self.num_yields_total = 0  # those for a more urgent waiting request
        self.num_recomputed_tokens_total = 0  # computed tokens whose KV a preemption dropped

    def preempt(
        self, group: list[Request], waiting: deque[Request], alone: bool, urgent: Request | None = None
    ) -> list[tuple[int, int]] | None:
        """Swap the group out (its KV to host blocks) when the mode says so and the host blocks suffice:
        returns the (device, host) pairs to copy, and the caller keeps the group as swapped out. Else drop
        its KV and queue it first in `waiting` for recompute (returns None). A group that cannot grow even
        `alone` (nothing else running) is recomputed; parallel samples then go on as independent requests
        (each fits the pool alone), else they would be admitted and preempted together forever. (A beam
        search always fits alone: the frontend checks its worst case.) `urgent`: the waiting request it
        yields to (counted apart), None when the running requests need its blocks."""
        if alone and self.beam_search.width_of(group[0]) == 0:
            for request in group:
                request.group_id = None
        for request in group:
            request.num_preemptions += 1
            request.num_yields += int(urgent is not None)
            request.spec_token_ids = []
        self.num_preemptions_total += 1
        self.num_yields_total += int(urgent is not None)
        mode = self.config.preemption_mode or ("swap" if len(group) > 1 else "recompute")
        pairs = self.kv.swap_out(group) if mode == "swap" and not alone else None
        if pairs is not None:
            for request in group:
                request.status = RequestStatus.SWAPPED
        else:
            self.requeue(group, waiting, self.kv.free)
        self._log(group, mode, pairs is not None, alone, urgent)
        return pairs

    def requeue(
        self, group: list[Request], waiting: deque[Request], drop_kv: Callable[[Request], None]
    ) -> None:
        """Recompute preemption: drop the KV (`drop_kv`), queue the group first (under priority, first
        among its equals)."""
        for request in reversed(group):
            drop_kv(request)
            self.beam_search.forget_report(request)
            request.status = RequestStatus.PREEMPTED
            self.num_recomputed_tokens_total += request.num_computed_tokens
            request.num_computed_tokens = 0
            self.order.enqueue(waiting, request, first=True)

    def _log(
        self, group: list[Request], mode: str, swapped: bool, alone: bool, urgent: Request | None
    ) -> None:
        how = "swap" if swapped else "recompute"
        if mode == "swap" and not swapped:
            how += (
                ", too large to swap whole"
                if alone
                else ", the swap space (--swap-space) is full"
                if self.kv.can_swap
                else ", no --swap-space"
            )
        why = (
            "no free KV block for the running requests"
            if urgent is None
            else f"it yields to the more urgent waiting request {urgent.request_id}"
        )
        for request in group:
            logger.info(
                "Preempted request %s (%s; %d tokens): %s (%d free blocks after it). Total preemptions: "
                "%d, recomputed tokens: %d.",
                request.request_id,
                how,
                request.num_tokens,
                why,
                self.kv.num_free_blocks(),
                self.num_preemptions_total,
                self.num_recomputed_tokens_total,
            )


def log_cut_short(request: Request, kv: KVCacheManager) -> None:
    """Why a request ends early with finish reason 'length' (vLLM's): its tokens need more KV blocks than
    the whole pool (it grew past it, or was preempted just before)."""
    logger.warning(
        "Request %s ends early (finish_reason 'length'): its %d tokens need more KV blocks than "
        "the whole cache holds, %d blocks of %d tokens. Lower max_tokens or --max-model-len, or "
        "raise --kv-cache-memory (--gpu-memory-utilization on a GPU, or --num-gpu-blocks-override).",
        request.request_id,
        request.num_tokens,
        kv.num_usable_blocks,
        kv.block_size,
    )
