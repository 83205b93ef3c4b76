"""Continuous batching: every step hands one token budget to running requests first, then to waiting ones.

There are no prefill/decode phases: a request has `num_computed_tokens` and `num_tokens`, and a step
computes some of the difference (a decode is a request with one new token; a long prompt is chunked).
"""
import time
from collections import deque

from pagedserve.config import SchedulerConfig
from pagedserve.core.kv_cache_manager import KVCacheManager
from pagedserve.core.request import Request, RequestStatus
from pagedserve.core.sched_output import (CachedRequestData, ModelRunnerOutput, NewRequestData,
                                          SchedulerOutput)
from pagedserve.logger import init_logger
from pagedserve.protocol import EngineCoreOutput, FinishReason, SchedulerStats

logger = init_logger(__name__)


class Scheduler:
    """Decides, each step, which requests compute how many tokens, within `max_num_seqs`,
    `max_num_batched_tokens` and the free KV blocks. Preempts the newest running request
    (recompute) when a running one needs a block and none is free."""

    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager) -> None:
        self.config = config
        self.kv_cache_manager = kv_cache_manager
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions_total = 0
        self._forget_req_ids: set[str] = set()  # the workers must drop these next step
        self._num_tokens_sent: dict[str, int] = {}  # how many tokens each worker copy holds

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        new_reqs: list[NewRequestData] = []
        cached_reqs: list[CachedRequestData] = []
        num_scheduled: dict[str, int] = {}
        preempted = False

        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            new_block_ids = self.kv_cache_manager.allocate_slots(request, num_new)
            while new_block_ids is None:
                victim = self.running.pop()  # the newest running request
                self._preempt(victim)
                preempted = True
                if victim is request:
                    break
                new_block_ids = self.kv_cache_manager.allocate_slots(request, num_new)
            if new_block_ids is None:
                break
            if request.request_id in self._num_tokens_sent:
                cached_reqs.append(self._cached_data(request, new_block_ids))
            else:  # resumed after preemption: the workers rebuild it
                new_reqs.append(self._new_data(request))
            num_scheduled[request.request_id] = num_new
            budget -= num_new
            index += 1

        # NOTE: admit nobody in a step that had to preempt: memory is short already.
        while (self.waiting and budget > 0 and not preempted
               and len(self.running) < self.config.max_num_seqs):
            request = self.waiting[0]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if self.kv_cache_manager.allocate_slots(request, num_new) is None:
                break
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            new_reqs.append(self._new_data(request))
            num_scheduled[request.request_id] = num_new
            budget -= num_new

        for request_id, num_new in num_scheduled.items():
            self.requests[request_id].num_computed_tokens += num_new
        output = SchedulerOutput(new_reqs, cached_reqs, num_scheduled,
                                 self.config.max_num_batched_tokens - budget, self._forget_req_ids)
        self._forget_req_ids = set()
        return output

    def _new_data(self, request: Request) -> NewRequestData:
        self._num_tokens_sent[request.request_id] = request.num_tokens
        return NewRequestData(request.request_id, list(request.all_token_ids), request.num_prompt_tokens,
                              request.sampling_params, request.eos_token_id,
                              self.kv_cache_manager.get_block_ids(request.request_id),
                              request.num_computed_tokens)

    def _cached_data(self, request: Request, new_block_ids: list[int]) -> CachedRequestData:
        num_sent = self._num_tokens_sent[request.request_id]
        self._num_tokens_sent[request.request_id] = request.num_tokens
        return CachedRequestData(request.request_id, request.all_token_ids[num_sent:], new_block_ids,
                                 request.num_computed_tokens)

    def _preempt(self, request: Request) -> None:
        """Recompute preemption: drop the request's KV, put it at the head of the waiting queue."""
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions_total += 1
        self._forget(request.request_id)
        self.waiting.appendleft(request)
        logger.info("Preempted request %s (recompute, %d tokens): no free KV block for the running "
                    "requests. Total preemptions: %d.", request.request_id, request.num_tokens,
                    self.num_preemptions_total)

    def _forget(self, request_id: str) -> None:
        if self._num_tokens_sent.pop(request_id, None) is not None:
            self._forget_req_ids.add(request_id)

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Append sampled tokens, apply token-level stop conditions, free finished requests."""
        outputs: list[EngineCoreOutput] = []
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
            request.append_token(token_id)
            logprobs = runner_output.logprobs.get(request_id)
            output = EngineCoreOutput(request_id, [token_id], [logprobs] if logprobs else None,
                                      prompt_logprobs)
            if request.check_stop(self.config.max_model_len):
                output.finish_reason, output.stop_reason = request.finish_reason, request.stop_reason
                finished.append(request)
            outputs.append(output)
        if finished:
            self._finish(finished)
        return outputs

    def abort_requests(self, request_ids: list[str]) -> None:
        """End requests wherever they are (waiting or running) and free their blocks at once."""
        requests = [self.requests[rid] for rid in request_ids if rid in self.requests]
        for request in requests:
            request.finish_reason = FinishReason.ABORT
        self._finish(requests)

    def _finish(self, requests: list[Request]) -> None:
        gone = {request.request_id for request in requests}
        self.running = [r for r in self.running if r.request_id not in gone]
        if any(r.status is not RequestStatus.RUNNING for r in requests):
            self.waiting = deque(r for r in self.waiting if r.request_id not in gone)
        for request in requests:
            request.status = RequestStatus.FINISHED
            self.kv_cache_manager.free(request)
            self._forget(request.request_id)
            del self.requests[request.request_id]

    def get_stats(self) -> SchedulerStats:
        stored = sum(r.num_computed_tokens for r in self.running)
        return SchedulerStats(len(self.running), len(self.waiting), self.kv_cache_manager.usage(),
                              self.num_preemptions_total, self.kv_cache_manager.num_allocated_slots(), stored)
