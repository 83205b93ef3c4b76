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
    probs = sampler.probabilities(logits, meta)
    greedy = torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(probs.dtype)
    probs = torch.where((meta.temperature == 0)[:, None], greedy, probs)
    drafts = torch.tensor(
        [token for draft in draft_token_ids for token in [*draft, -1]], device=logits.device
    )
    has_draft = drafts >= 0
    rows = torch.arange(len(drafts), device=logits.device)
    draft_probs = torch.where(has_draft, probs[rows, drafts.clamp(min=0)], 0.0)
    generators = row_generators(logits.device, meta.seeds)
    uniform = torch.rand(len(drafts), device=logits.device)
    for row, generator in generators.items():
        uniform[row] = torch.rand(1, generator=generator, device=logits.device)
    accepted = (uniform < draft_probs).tolist()
    residual = probs.clone()
    residual[rows[has_draft], drafts[has_draft]] = 0.0
    final = draw(residual, meta.seeds, generators).tolist()
    tokens, start = [], 0
    for draft in draft_token_ids:
        num_accepted = next((j for j in range(len(draft)) if not accepted[start + j]), len(draft))
        tokens.append(draft[:num_accepted] + [final[start + num_accepted]])
        start += len(draft) + 1
    return tokens
