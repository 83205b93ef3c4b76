"""Verifying draft tokens (speculative decoding): keep the longest run of drafts the model agrees with,
then one token of its own, so that every output token has exactly the distribution it would have had
without speculation.

A request with d drafts has d + 1 rows of logits: the distribution after its last token and after each
draft. Every row is sampled exactly as a plain decode step would sample that position (the same logits
processors, grammar mask and seeded noise), and draft j is accepted iff it equals row j's sample; the
request gets its accepted drafts, then the first sample that differs (or the last row's, the bonus token).

This is the rejection rule for a deterministic proposer (q one-hot): draft j is accepted with probability
p_j(draft_j) = min(1, p/q), and a rejected position's token is row j's sample conditioned on not being the
draft, which is the residual max(0, p_j - q_j), normalized. Because each position draws what it would
draw unspeculated, a seeded request's tokens are the same whether or not a step had drafts, and so
independent of what shares its batch (the token budget decides how many drafts a step verifies)."""


def accept_drafts(sampled: list[int], draft_token_ids: list[list[int]]) -> list[list[int]]:
    """`sampled`: one token per verified row, request by request (len(draft) + 1 rows each) -> the
    tokens each request gets this step: its accepted drafts, then one more."""
    tokens, start = [], 0
    for draft in draft_token_ids:
        rows = sampled[start : start + len(draft) + 1]
        num_accepted = next((j for j, token in enumerate(draft) if token != rows[j]), len(draft))
        tokens.append(draft[:num_accepted] + [rows[num_accepted]])
        start += len(draft) + 1
    return tokens
