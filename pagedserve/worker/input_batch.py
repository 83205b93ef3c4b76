"""The worker's persistent view of the requests it holds (tokens, progress, block tables), updated by each
step's scheduler diff, and the step's flattened batch tensors built from it."""

from dataclasses import dataclass

import numpy as np
import torch

from pagedserve.attention.backends.base import CommonAttentionMetadata
from pagedserve.core.sched_output import SchedulerOutput
from pagedserve.protocol import LoRARequest
from pagedserve.sampling_params import SamplingParams
from pagedserve.worker.block_table import BlockTables


@dataclass(slots=True)
class CachedRequestState:
    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams
    eos_token_id: int | None
    num_computed_tokens: int
    lora_request: LoRARequest | None = None
    beam: bool = False  # a beam search's beam: its logprobs are HF's beam scores (layers/sampler.py)


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

    @property
    def num_tokens_per_row(self) -> list[int]:
        starts = self.attention[0].query_start_loc
        return [end - start for start, end in zip(starts, starts[1:])]


class InputBatch:
    """Every request the worker holds (`states`) and their block tables, kept across steps."""

    def __init__(self, block_size: int, device: torch.device, num_groups: int = 1) -> None:
        self.block_size = block_size
        self.device = device
        self.num_groups = num_groups
        self.states: dict[str, CachedRequestState] = {}
        self.block_tables = BlockTables(num_groups)

    def update(self, out: SchedulerOutput) -> None:
        """Apply the scheduler's diff: forget finished/preempted requests, add new ones, extend cached ones."""
        for request_id in out.finished_req_ids:
            self.states.pop(request_id, None)
            self.block_tables.remove(request_id)
        for new in out.scheduled_new_reqs:
            self.states[new.request_id] = CachedRequestState(
                new.request_id,
                list(new.token_ids),
                new.num_prompt_tokens,
                new.sampling_params,
                new.eos_token_id,
                new.num_computed_tokens,
                new.lora_request,
                new.beam,
            )
            self.block_tables.remove(new.request_id)  # NOTE: a resumed request comes back as new
            self.block_tables.add(new.request_id, list(new.block_ids))
        for cached in out.scheduled_cached_reqs:
            state = self.states[cached.request_id]
            if cached.num_dropped_blocks:
                self.block_tables.drop_last(cached.request_id, cached.num_dropped_blocks)
            state.token_ids.extend(cached.new_token_ids)
            self.block_tables.append(cached.request_id, list(cached.new_block_ids))
            state.num_computed_tokens = cached.num_computed_tokens

    def build(self, out: SchedulerOutput) -> BatchInputs:
        """Flatten the scheduled tokens (a request's draft tokens after its own) and advance each state's
        num_computed_tokens past them."""
        scheduled, spec = out.num_scheduled_tokens, out.scheduled_spec_decode_tokens
        # decodes first, then verifications (1 + drafts tokens: attention backends may take them as
        # decodes), then prefill chunks (stable)
        order = sorted(
            scheduled, key=lambda rid: (scheduled[rid] != 1, scheduled[rid] != 1 + len(spec.get(rid, [])))
        )
        input_ids: list[int] = []
        starts = np.empty(len(order), dtype=np.int64)
        sample_rows: list[int] = []
        logits_indices: list[int] = []
        drafts: list[list[int]] = []
        nums = np.fromiter((scheduled[rid] for rid in order), dtype=np.int64, count=len(order))
        query_start_loc = np.concatenate([[0], np.cumsum(nums)])
        for row, request_id in enumerate(order):
            state, num = self.states[request_id], int(nums[row])
            start, draft = state.num_computed_tokens, spec.get(request_id, [])
            input_ids.extend((state.token_ids + draft if draft else state.token_ids)[start : start + num])
            starts[row] = start
            state.num_computed_tokens = start + num
            if start + num == len(state.token_ids) + len(draft):
                sample_rows.append(row)
                end = int(query_start_loc[row + 1])
                logits_indices += range(end - 1 - len(draft), end)
                drafts.append(draft)
        # Every token's position and KV slot at once: row of each token, then its offset in the request.
        token_rows = np.repeat(np.arange(len(order)), nums)
        positions = starts[token_rows] + np.arange(int(query_start_loc[-1])) - query_start_loc[token_rows]
        tables = self.block_tables.gather(order)  # [groups, rows, width]
        slots = tables[:, token_rows, positions // self.block_size] * self.block_size + (
            positions % self.block_size
        )
        seq_lens = (starts + nums).tolist()
        num_decodes = int(np.count_nonzero(nums == 1))
        attention = [
            CommonAttentionMetadata(
                query_start_loc=query_start_loc.tolist(),
                seq_lens=seq_lens,
                block_tables=torch.from_numpy(tables[group]).to(self.device),
                slot_mapping=torch.from_numpy(slots[group]).to(self.device),
                num_decodes=num_decodes,
                block_size=self.block_size,
            )
            for group in range(self.num_groups)
        ]
        return BatchInputs(
            torch.tensor(input_ids, device=self.device),
            torch.from_numpy(positions).to(self.device),
            attention,
            order,
            sample_rows,
            torch.tensor(logits_indices, device=self.device),
            drafts,
        )
