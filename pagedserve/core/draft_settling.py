"""Speculative decoding in the scheduler: after a step verified a request's drafts, settle them (count,
adapt, release the rejected drafts' blocks); after each step, propose the next drafts."""

from pagedserve.core.request import Request
from pagedserve.core.scheduler_state import SchedulerState
from pagedserve.core.spec_decode import adapt_num_spec_tokens, num_drafts_allowed


class DraftSettling(SchedulerState):
    """The Scheduler's side of draft tokens."""

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
