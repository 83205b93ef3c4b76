"""Speculative decoding in the scheduler: after a step verified a request's drafts, settle them (count,
adapt, release the rejected drafts' blocks); after each step, propose the next drafts."""

from pagedserve.config import SpeculativeConfig
from pagedserve.core.kv_cache_manager import KVCacheManager
from pagedserve.core.request import Request
from pagedserve.core.spec_decode import (
    NgramProposer,
    adapt_num_spec_tokens,
    before_image_placeholders,
    num_drafts_allowed,
)


class DraftSettling:
    """The scheduler's collaborator for draft tokens, with the cumulative counts it reports: steps with
    drafts, draft tokens verified, drafts accepted."""

    def __init__(self, speculative: SpeculativeConfig, kv: KVCacheManager, max_model_len: int) -> None:
        self.speculative, self.kv, self.max_model_len = speculative, kv, max_model_len
        self.ngram = NgramProposer(speculative) if speculative.method == "ngram" else None
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0

    def settle(self, request: Request, drafts: list[int], num_accepted: int) -> int:
        """After verification: the rejected drafts' K/V were computed but are not the request's. Their
        slots are written again from num_computed_tokens on; blocks holding nothing else are released.
        Returns how many were (the workers must hear of it)."""
        self.num_drafts += 1
        self.num_draft_tokens += len(drafts)
        self.num_accepted_tokens += num_accepted
        adapt_num_spec_tokens(request, len(drafts), num_accepted, self.speculative.num_speculative_tokens)
        request.spec_token_ids = []
        request.num_computed_tokens = min(request.num_computed_tokens, request.num_tokens - 1)
        return self.kv.trim(request) if request.finish_reason is None else 0

    def propose(self, running: list[Request], draft_model_proposals: dict[str, list[int]]) -> None:
        """Draft tokens for the next step: n-gram prompt lookup here, or the draft model's proposals."""
        for request in running:
            num = num_drafts_allowed(request, self.speculative.num_speculative_tokens, self.max_model_len)
            if not num:
                request.spec_token_ids = []
            elif self.ngram is not None:
                drafts = self.ngram.propose(request.all_token_ids, num)
                request.spec_token_ids = before_image_placeholders(request, drafts)
            else:
                request.spec_token_ids = draft_model_proposals.get(request.request_id, [])[:num]
