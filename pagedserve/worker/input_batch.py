"""The worker's copy of each request (tokens, blocks) and the step's flattened batch tensors."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pagedserve.attention.backends.base import CommonAttentionMetadata
from pagedserve.core.sched_output import SchedulerOutput
from pagedserve.layers.sampler import SamplingMetadata
from pagedserve.sampling_params import SamplingParams

_UINT64_MASK = 2**64 - 1


@dataclass(slots=True)
class CachedRequestState:
    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams
    eos_token_id: int | None
    block_ids: list[int]
    num_computed_tokens: int


@dataclass
class BatchInputs:
    """Flattened, unpadded batch. Single-token (decode) requests come first."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    attention: list[CommonAttentionMetadata]  # per KV cache group: its block tables and slot mapping
    request_ids: list[str]  # [R], batch order
    sample_rows: list[int]  # indices into request_ids whose tokens reach the end: they sample
    # The positions whose logits are computed: per sampling row its last token, and with draft tokens
    # (speculative decoding) the last 1 + num_drafts tokens.
    logits_indices: torch.Tensor
    draft_token_ids: list[list[int]]  # per sampling row (empty: no drafts)


def update_states(states: dict[str, CachedRequestState], out: SchedulerOutput) -> None:
    """Apply the scheduler's diff: forget finished/preempted requests, add new ones, extend cached ones."""
    for request_id in out.finished_req_ids:
        states.pop(request_id, None)
    for new in out.scheduled_new_reqs:
        states[new.request_id] = CachedRequestState(
            new.request_id,
            list(new.token_ids),
            new.num_prompt_tokens,
            new.sampling_params,
            new.eos_token_id,
            list(new.block_ids),
            new.num_computed_tokens,
        )
    for cached in out.scheduled_cached_reqs:
        state = states[cached.request_id]
        if cached.num_dropped_blocks:
            del state.block_ids[-cached.num_dropped_blocks :]
        state.token_ids.extend(cached.new_token_ids)
        state.block_ids.extend(cached.new_block_ids)
        state.num_computed_tokens = cached.num_computed_tokens


def build_batch(
    states: dict[str, CachedRequestState],
    out: SchedulerOutput,
    block_size: int,
    device: torch.device,
    num_groups: int = 1,
) -> BatchInputs:
    """Flatten the scheduled tokens (a request's draft tokens after its own) and advance each state's
    num_computed_tokens past them. A request's block ids hold `num_groups` tables, entry-major (the KV
    manager's layout): group g's table is every num_groups-th id from g."""
    scheduled, spec = out.num_scheduled_tokens, out.scheduled_spec_decode_tokens
    # decodes first, then verifications (1 + drafts tokens: attention backends may take them as decodes),
    # then prefill chunks (stable)
    order = sorted(
        scheduled, key=lambda rid: (scheduled[rid] != 1, scheduled[rid] != 1 + len(spec.get(rid, [])))
    )
    input_ids: list[int] = []
    positions: list[np.ndarray] = []
    slots: list[list[np.ndarray]] = [[] for _ in range(num_groups)]
    query_start_loc, seq_lens, sample_rows = [0], [], []
    logits_indices: list[int] = []
    drafts: list[list[int]] = []
    max_blocks = max(len(states[rid].block_ids) for rid in order) // num_groups
    block_tables = np.zeros((num_groups, len(order), max_blocks), dtype=np.int64)
    for row, request_id in enumerate(order):
        state, num = states[request_id], scheduled[request_id]
        start, draft = state.num_computed_tokens, spec.get(request_id, [])
        input_ids.extend((state.token_ids + draft if draft else state.token_ids)[start : start + num])
        pos = np.arange(start, start + num)
        tables = np.asarray(state.block_ids, dtype=np.int64).reshape(-1, num_groups).T  # [groups, entries]
        positions.append(pos)
        for group, table in enumerate(tables):
            slots[group].append(table[pos // block_size] * block_size + pos % block_size)
        block_tables[:, row, : tables.shape[1]] = tables
        query_start_loc.append(query_start_loc[-1] + num)
        seq_lens.append(start + num)
        state.num_computed_tokens = start + num
        if start + num == len(state.token_ids) + len(draft):
            sample_rows.append(row)
            logits_indices += range(query_start_loc[-1] - 1 - len(draft), query_start_loc[-1])
            drafts.append(draft)
    num_decodes = sum(1 for rid in order if scheduled[rid] == 1)
    attention = [
        CommonAttentionMetadata(
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            block_tables=torch.from_numpy(block_tables[group]).to(device),
            slot_mapping=torch.from_numpy(np.concatenate(slots[group])).to(device),
            num_decodes=num_decodes,
            block_size=block_size,
        )
        for group in range(num_groups)
    ]
    return BatchInputs(
        torch.tensor(input_ids, device=device),
        torch.from_numpy(np.concatenate(positions)).to(device),
        attention,
        order,
        sample_rows,
        torch.tensor(logits_indices, device=device),
        drafts,
    )


def build_sampling_metadata(
    requests: list[CachedRequestState],
    vocab_size: int,
    device: torch.device,
    offsets: list[int] | None = None,
) -> SamplingMetadata:
    """Stack the sampling settings of the requests that sample this step (row i = requests[i]). With
    draft tokens a request has one row per verified position: `offsets[i]` is row i's position after
    the request's last known token (0 without drafts)."""
    params = [r.sampling_params for r in requests]
    rows = len(params)

    def column(values: Sequence[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    # NOTE: a top_k at or above the vocabulary keeps every token (and fits int64 whatever was asked).
    top_k = [min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size for p in params]
    # NOTE: a seeded request's noise depends only on (seed, output position): reproducible whatever
    # else is in the batch, and across preemptions. Masked to 64 bits, what manual_seed takes, for any seed.
    offsets = offsets or [0] * rows
    seeds = {
        i: (p.seed * 1_000_003 + len(r.token_ids) + offsets[i]) & _UINT64_MASK
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
        counts = torch.zeros(rows, vocab_size, device=device)
        prompt_mask = torch.zeros(rows, vocab_size, dtype=torch.bool, device=device)
        for i, r in enumerate(requests):
            output = torch.tensor(r.token_ids[r.num_prompt_tokens :], dtype=torch.int64, device=device)
            counts[i].index_add_(0, output, torch.ones(len(output), device=device))
            prompt_mask[i, torch.tensor(r.token_ids[: r.num_prompt_tokens], device=device)] = True
        meta.output_token_counts, meta.prompt_token_mask = counts, prompt_mask
        meta.presence_penalty = column([p.presence_penalty for p in params])
        meta.frequency_penalty = column([p.frequency_penalty for p in params])
        meta.repetition_penalty = column([p.repetition_penalty for p in params])
    meta.logit_bias = _logit_bias(requests, vocab_size, device)
    return meta


def _logit_bias(
    requests: list[CachedRequestState], vocab_size: int, device: torch.device
) -> torch.Tensor | None:
    """logit_bias, plus -inf on stop_token_ids and EOS (unless ignore_eos: then it is no stop, as in vLLM)
    while a request is under its min_tokens."""
    bias = None
    for i, r in enumerate(requests):
        p = r.sampling_params
        entries = dict(p.logit_bias or {})
        if len(r.token_ids) - r.num_prompt_tokens < p.min_tokens:
            eos = [] if r.eos_token_id is None or p.ignore_eos else [r.eos_token_id]
            banned = list(p.stop_token_ids or []) + eos
            entries.update({token: float("-inf") for token in banned})
        if entries:
            bias = torch.zeros(len(requests), vocab_size, device=device) if bias is None else bias
            bias[i, torch.tensor(list(entries), device=device)] = torch.tensor(
                list(entries.values()), device=device
            )
    return bias
