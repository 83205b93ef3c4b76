"""The sampler pipeline of one step. Every logits row, a plain sample or one position of a draft
verification, goes through the same stages in the same order: the grammar mask (structured outputs),
the logits processors (repetition/frequency/presence penalties, logit_bias, min_tokens), then temperature,
top-k, top-p, min-p and the position's seeded noise (layers/sampler.py). A request with drafts then keeps
them up to the first its samples disagree with (layers/rejection_sampler.py). Speculation composes with
every processor by construction: a verified position is processed as if the drafts before it had been
sampled one step at a time (worker/sampling_inputs.py)."""

import torch

from pagedserve.core.sched_output import ModelRunnerOutput
from pagedserve.layers.grammar_bitmask import apply_grammar_bitmask
from pagedserve.layers.rejection_sampler import accept_drafts
from pagedserve.layers.sampler import Sampler, SamplingMetadata
from pagedserve.protocol import PositionLogprobs
from pagedserve.structured_output.manager import GrammarBitmask
from pagedserve.worker.request_state import CachedRequestState


def sample_step(
    sampler: Sampler,
    request_ids: list[str],
    states: dict[str, CachedRequestState],
    drafts: list[list[int]],
    logits: torch.Tensor,
    greedy_tokens: torch.Tensor | None,
    meta: SamplingMetadata,
    grammar: GrammarBitmask | None,
    output: ModelRunnerOutput,
) -> None:
    """`logits` [rows, vocab]: len(draft) + 1 rows per request (`request_ids`, their states in `states`),
    request by request, and `meta` their settings (worker/sampling_inputs.py); `greedy_tokens` each row's
    argmax where the LM head found it (None: the sampler takes it from the logits). Fills the output's
    sampled tokens, accepted drafts and logprobs."""
    if grammar is not None:
        rows = [request_id for request_id, draft in zip(request_ids, drafts) for _ in range(len(draft) + 1)]
        apply_grammar_bitmask(logits, rows, grammar.request_ids, grammar.bitmask)
        greedy_tokens = None  # NOTE: the head's argmax is of the logits before the mask
    sampled = sampler(logits, meta, greedy_tokens)
    if any(drafts):
        tokens = accept_drafts(sampled.sampled_token_ids.tolist(), drafts)
        output.sampled_token_ids.update(zip(request_ids, (t[0] for t in tokens)))
        output.extra_token_ids.update((r, t[1:]) for r, d, t in zip(request_ids, drafts, tokens) if d)
    else:
        output.sampled_token_ids.update(zip(request_ids, sampled.sampled_token_ids.tolist()))
    if sampled.logprobs is None or sampled.logprob_token_ids is None or sampled.ranks is None:
        return
    ids, values, ranks = sampled.logprob_token_ids.tolist(), sampled.logprobs.tolist(), sampled.ranks.tolist()
    first_row = 0
    for request_id, draft in zip(request_ids, drafts):  # NOTE: only when some request asked for logprobs
        num = states[request_id].sampling_params.logprobs
        if num is not None:
            output.logprobs[request_id] = PositionLogprobs(
                ids[first_row][: num + 1], values[first_row][: num + 1], ranks[first_row]
            )
        first_row += len(draft) + 1
