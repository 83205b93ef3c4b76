"""Verifying draft tokens (speculative decoding): keep the longest run of drafts the model agrees with,
then one token of its own, so that every output token has exactly the distribution it would have had
without speculation.

A request with d drafts has d + 1 rows of logits: the distribution after its last token and after
each draft. Draft j is accepted with probability p_j(draft_j) (the drafts come from a deterministic
proposer, q = one-hot, so min(1, p/q) = p); at the first rejection the token is drawn from the residual
max(0, p_j - q_j), normalized: p_j without the draft. If all d are accepted, a bonus token is drawn from
p_d. Greedy rows use the one-hot of their argmax as p, which makes this exactly greedy decoding."""

import torch

from pagedserve.layers.sampler import Sampler, SamplingMetadata, draw, row_generators


def rejection_sample(
    sampler: Sampler, logits: torch.Tensor, meta: SamplingMetadata, draft_token_ids: list[list[int]]
) -> list[list[int]]:
    """logits [P, V] (P = sum of len(drafts) + 1, one row per verified position, request by request) ->
    the tokens each request gets this step: its accepted drafts, then one more."""
    logits = sampler.apply_penalties_and_bias(logits, meta)
    drafts = [token for draft in draft_token_ids for token in [*draft, -1]]
    if meta.all_greedy:  # the one-hot case of the rule below, without a softmax and noise per vocabulary row
        final = logits.argmax(dim=-1).tolist()
        accepted = [draft == target for draft, target in zip(drafts, final)]
    else:
        accepted, final = _accept_and_draw(logits, meta, torch.tensor(drafts, device=logits.device), sampler)
    tokens, start = [], 0
    for draft in draft_token_ids:
        num_accepted = next((j for j in range(len(draft)) if not accepted[start + j]), len(draft))
        tokens.append(draft[:num_accepted] + [final[start + num_accepted]])
        start += len(draft) + 1
    return tokens


def _accept_and_draw(
    logits: torch.Tensor, meta: SamplingMetadata, drafts: torch.Tensor, sampler: Sampler
) -> tuple[list[bool], list[int]]:
    """Per row: whether its draft (-1: none) is accepted, and the token drawn from its residual."""
    probs = sampler.probabilities(logits, meta)
    greedy = torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(probs.dtype)
    probs = torch.where((meta.temperature == 0)[:, None], greedy, probs)
    has_draft = drafts >= 0
    rows = torch.arange(len(drafts), device=logits.device)
    draft_probs = torch.where(has_draft, probs[rows, drafts.clamp(min=0)], 0.0)
    generators = row_generators(logits.device, meta.seeds)
    uniform = torch.rand(len(drafts), device=logits.device)
    for row, generator in generators.items():
        uniform[row] = torch.rand(1, generator=generator, device=logits.device)
    residual = probs.clone()
    residual[rows[has_draft], drafts[has_draft]] = 0.0
    return (uniform < draft_probs).tolist(), draw(residual, meta.seeds, generators).tolist()
