"""What each step tells the workers of a scheduled request (`_record`): the whole request the first time
(and after a copy on write rewrote its table), else a diff: its new tokens, its new blocks and how many
were trimmed off its table since (`_note_dropped`); and what the chunk takes of the step (budget, drafts,
encoder tokens). The scheduling decisions (scheduler.py) record each chunk they schedule here."""

from pagedserve.core.encoder_budget import encoder_tokens
from pagedserve.core.kv_cache_interface import SlotAllocation
from pagedserve.core.request import Request
from pagedserve.core.sched_output import CachedRequestData, NewRequestData
from pagedserve.core.scheduler_state import SchedulerState, ScheduleStep


class SchedulerDiffs(SchedulerState):
    """A SchedulerState that records each scheduled chunk in its step and keeps the workers' copies of the
    requests in step with it (`Request.num_tokens_sent`, `_num_dropped_blocks`)."""

    def _note_dropped(self, request_id: str, num_blocks: int) -> None:
        """`num_blocks` trimmed off the request's table: its next diff tells the workers."""
        if num_blocks:
            self._num_dropped_blocks[request_id] = self._num_dropped_blocks.get(request_id, 0) + num_blocks

    def _record(
        self, step: ScheduleStep, request: Request, num_new: int, allocation: SlotAllocation | None
    ) -> None:
        assert allocation is not None, "the caller checked the free blocks"
        request_id = request.request_id
        if allocation.copies:
            step.copies += allocation.copies
        num_sent = request.num_tokens_sent
        # NOTE: a copy on write replaced a block mid-table: the workers get the whole request again.
        if num_sent is not None and not allocation.table_rewritten:
            step.cached_reqs.append(
                CachedRequestData(
                    request_id,
                    request.all_token_ids[num_sent:],
                    num_sent,
                    allocation.new_block_ids,
                    request.num_computed_tokens,
                    self._num_dropped_blocks.pop(request_id, 0) if self._num_dropped_blocks else 0,
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
                    lora_request=request.lora_request,
                    beam=request.beam_search is not None,
                    images=request.images or None,
                )
            )
        num_tokens = request.num_tokens_sent = len(request.all_token_ids)
        num_drafts = request.num_computed_tokens + num_new - num_tokens
        if num_drafts > 0:
            step.spec_tokens[request_id] = request.spec_token_ids[:num_drafts]
        step.num_scheduled[request_id] = num_new
        step.budget -= num_new
        if request.images:
            step.encoder_tokens += encoder_tokens(request, request.num_computed_tokens, num_new)
