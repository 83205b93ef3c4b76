"""The pooling runner's scheduler: waiting prompts, first come first served, batched whole under the
step's token budget (--max-num-batched-tokens) and --max-num-seqs. A prompt is computed in one step and
finished by it: no KV blocks, no decode, no preemption. The same interface as `Scheduler`, so the
engine core steps either."""

from collections import OrderedDict

from pagedserve.config import SchedulerConfig
from pagedserve.core.kv_cache_interface import BlockOwners
from pagedserve.core.request import Request
from pagedserve.core.sched_output import ModelRunnerOutput, NewRequestData, SchedulerOutput
from pagedserve.core.scheduler_state import RequestKVUsage
from pagedserve.protocol import EngineCoreOutput, FinishReason, SchedulerStats


class PoolingScheduler:
    def __init__(self, config: SchedulerConfig, block_size: int) -> None:
        self.config = config
        self.block_size = block_size
        self.waiting: OrderedDict[str, Request] = OrderedDict()

    def add_request(self, request: Request) -> None:
        if request.pooling_params is None:
            raise ValueError(
                f"request {request.request_id} has no pooling_params: the engine runs --runner pooling"
            )
        if request.request_id in self.waiting:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        self.waiting[request.request_id] = request

    def abort_requests(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.waiting.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting)

    def schedule(self) -> SchedulerOutput:
        """The oldest prompts that fit the budget together (at least one: the config keeps the budget at
        least --max-model-len, so any prompt fits alone)."""
        batch: list[NewRequestData] = []
        num_tokens = 0
        for request in self.waiting.values():
            n = len(request.prompt_token_ids)
            if batch and (
                num_tokens + n > self.config.max_num_batched_tokens or len(batch) >= self.config.max_num_seqs
            ):
                break
            batch.append(
                NewRequestData(
                    request.request_id,
                    request.prompt_token_ids,
                    n,
                    request.sampling_params,
                    request.eos_token_id,
                    [],
                    0,
                    request.pooling_params,
                )
            )
            num_tokens += n
        for new in batch:
            del self.waiting[new.request_id]
        ids = [new.request_id for new in batch]
        return SchedulerOutput(
            batch,
            [],
            {new.request_id: new.num_prompt_tokens for new in batch},
            num_tokens,
            finished_req_ids=set(ids),
            first_scheduled_req_ids=ids,
        )

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Every scheduled prompt ends in its step, with its pooled vector."""
        return [
            EngineCoreOutput(
                request_id, [], finish_reason=FinishReason.STOP, pooled=runner_output.pooled.get(request_id)
            )
            for request_id in scheduler_output.num_scheduled_tokens
        ]

    def get_stats(self) -> SchedulerStats:
        return SchedulerStats(num_waiting_reqs=len(self.waiting))

    def reset_prefix_cache(self) -> int:
        return 0  # nothing is cached

    def describe(self, max_requests: int) -> str:
        return f"Pooling runner: {len(self.waiting)} prompts waiting; no KV cache."

    def block_owners(self) -> BlockOwners:
        return BlockOwners([], [], self.block_size)

    def request_kv_usage(self, request_id: str) -> RequestKVUsage | None:
        return None
