"""The sampling settings of a step's logits rows, stacked into tensors for the sampler pipeline (penalties,
bias, min_tokens, temperature, top-k/p, min-p, seeds). Every row, a plain sample or one position of a draft
verification, is built the same way from the tokens that precede it."""

from collections.abc import Sequence

import torch

from pagedserve.layers.sampler import SamplingMetadata
from pagedserve.worker.input_batch import CachedRequestState

_UINT64_MASK = 2**64 - 1


def build_sampling_metadata(
    requests: list[CachedRequestState],
    vocab_size: int,
    device: torch.device,
    drafted: list[list[int]] | None = None,
) -> SamplingMetadata:
    """Stack the sampling settings of the rows that sample this step (row i = requests[i]). With draft
    tokens a request has one row per verified position: `drafted[i]` holds the drafts before row i's
    position (none without drafts), which count as output for its penalties, min_tokens and seed, as
    they would had they been sampled one step at a time."""
    params = [r.sampling_params for r in requests]
    rows = len(params)
    drafted = drafted or [[] for _ in range(rows)]

    def column(values: Sequence[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    # NOTE: a top_k at or above the vocabulary keeps every token (and fits int64 whatever was asked).
    top_k = [min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size for p in params]
    # NOTE: a seeded request's noise depends only on (seed, output position): reproducible whatever
    # else is in the batch, and across preemptions. Masked to 64 bits, what manual_seed takes, for any seed.
    seeds = {
        i: (p.seed * 1_000_003 + len(r.token_ids) + len(drafted[i])) & _UINT64_MASK
        for i, (p, r) in enumerate(zip(params, requests))
        if p.seed is not None and p.temperature > 0
    }
    logprobs = [p.logprobs for p in params if p.logprobs is not None]
    meta = SamplingMetadata(
        temperature=column([p.temperature for p in params]),
        all_greedy=all(p.temperature == 0 for p in params),
        top_k=column(top_k, torch.int64) if any(k < vocab_size for k in top_k) else None,
        top_p=column([p.top_p for p in params]) if any(p.top_p < 1 for p in params) else None,
        min_p=column([p.min_p for p in params]) if any(p.min_p > 0 for p in params) else None,
        seeds=seeds,
        max_num_logprobs=max(logprobs) if logprobs else None,
    )
    if any(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1 for p in params):
        meta.output_token_counts, meta.prompt_token_mask = _seen_tokens(requests, drafted, vocab_size, device)
        meta.presence_penalty = column([p.presence_penalty for p in params])
        meta.frequency_penalty = column([p.frequency_penalty for p in params])
        meta.repetition_penalty = column([p.repetition_penalty for p in params])
    meta.logit_bias = _logit_bias(requests, drafted, vocab_size, device)
    if any(r.beam for r in requests):
        meta.beam_rows = column([r.beam for r in requests], torch.bool)
    return meta


def _seen_tokens(
    requests: list[CachedRequestState], drafted: list[list[int]], vocab_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: how often each token occurs in the output so far (drafts before the row included), and
    which tokens occur in the prompt (the penalties' inputs)."""
    counts = torch.zeros(len(requests), vocab_size, device=device)
    prompt_mask = torch.zeros(len(requests), vocab_size, dtype=torch.bool, device=device)
    for i, r in enumerate(requests):
        output = torch.tensor(
            r.token_ids[r.num_prompt_tokens :] + drafted[i], dtype=torch.int64, device=device
        )
        counts[i].index_add_(0, output, torch.ones(len(output), device=device))
        prompt_mask[i, torch.tensor(r.token_ids[: r.num_prompt_tokens], device=device)] = True
    return counts, prompt_mask


def _logit_bias(
    requests: list[CachedRequestState], drafted: list[list[int]], vocab_size: int, device: torch.device
) -> torch.Tensor | None:
    """logit_bias, plus -inf on stop_token_ids and EOS (unless ignore_eos: then it is no stop, as in vLLM)
    while a row is under its request's min_tokens."""
    bias = None
    for i, r in enumerate(requests):
        p = r.sampling_params
        entries = dict(p.logit_bias or {})
        if len(r.token_ids) + len(drafted[i]) - r.num_prompt_tokens < p.min_tokens:
            eos = [] if r.eos_token_id is None or p.ignore_eos else [r.eos_token_id]
            banned = list(p.stop_token_ids or []) + eos
            entries.update({token: float("-inf") for token in banned})
        if entries:
            bias = torch.zeros(len(requests), vocab_size, device=device) if bias is None else bias
            bias[i, torch.tensor(list(entries), device=device)] = torch.tensor(
                list(entries.values()), device=device
            )
    return bias
