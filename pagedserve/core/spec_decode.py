"""Speculative decoding, the scheduler's half: who gets draft tokens, and n-gram prompt lookup to propose
them. The workers verify the drafts in the next step's forward (layers/rejection_sampler.py); the
scheduler then keeps the accepted tokens and releases the KV of the rejected ones."""

import numpy as np

from pagedserve.config import SpeculativeConfig
from pagedserve.core.request import Request, RequestStatus


def num_drafts_allowed(request: Request, k: int, max_model_len: int) -> int:
    """How many draft tokens `request` may verify next step: 0 where speculation cannot keep the output
    exact or cannot pay. A beam's continuation is chosen by its search, and logprobs are reported per
    sampled position: those requests decode one token at a time. Penalties, min_tokens and grammars
    speculate: each verified position is sampled with the drafts before it counted as output
    (worker/sampling_inputs.py) and masked by its own grammar row (StructuredOutputs.bitmask)."""
    params = request.sampling_params
    if (
        request.status is not RequestStatus.RUNNING
        or request.beam_search is not None
        or request.num_computed_tokens != request.num_tokens - 1
        or params.logprobs is not None
    ):
        return 0
    # The token after k accepted drafts is the (k+1)-th new one; every draft needs a position.
    return max(
        0,
        min(
            k,
            request.num_spec_tokens,
            request.max_tokens - request.num_output_tokens - 1,
            max_model_len - request.num_tokens,
        ),
    )


def adapt_num_spec_tokens(request: Request, num_drafts: int, num_accepted: int, k: int) -> None:
    """Per-request draft length: one more after a step whose drafts were all accepted (up to k), the
    accepted count plus one after a rejection. A request whose drafts keep failing verifies one draft per
    step (a small extra cost) instead of k."""
    if num_accepted == num_drafts:
        request.num_spec_tokens = min(k, request.num_spec_tokens + 1)
    else:
        request.num_spec_tokens = num_accepted + 1


class NgramProposer:
    """Prompt lookup: find the longest suffix of the request's tokens (prompt_lookup_max down to
    prompt_lookup_min tokens) that occurred earlier, and propose the tokens that followed its latest
    earlier occurrence. Costs no model: it pays on outputs that copy their context (edits, summaries
    quoting the input, code with repeated identifiers)."""

    def __init__(self, spec: SpeculativeConfig) -> None:
        self.spec = spec

    def propose(self, token_ids: list[int], num_tokens: int) -> list[int]:
        tokens = np.asarray(token_ids, dtype=np.int64)
        for n in range(
            min(self.spec.prompt_lookup_max, len(tokens) - 1), self.spec.prompt_lookup_min - 1, -1
        ):
            # Earlier windows only (the suffix itself is the last window); each must have a continuation.
            windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
            starts = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
            if len(starts):
                start = int(starts[-1]) + n
                return [int(token) for token in tokens[start : start + num_tokens]]
        return []


def before_image_placeholders(request: Request, drafts: list[int]) -> list[int]:
    """`drafts` up to the first image placeholder token: prompt lookup copies the prompt, placeholders
    included, but a placeholder after the prompt stands for no image."""
    if not request.images:
        return drafts
    placeholders = {request.prompt_token_ids[image.offset] for image in request.images}
    for index, token in enumerate(drafts):
        if token in placeholders:
            return drafts[:index]
    return drafts
