"""Prompt logprobs (`prompt_logprobs=k`): the logprob of each prompt token given the ones before it, and
the top-k, for the prompt positions computed in a step (chunked prompts report chunk by chunk). Only the
requests that asked and still have prompt positions to compute are visited."""

from collections.abc import Callable

import numpy as np
import torch

from pagedserve.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedserve.layers.sampler import gather_logprobs
from pagedserve.protocol import PositionLogprobs
from pagedserve.worker.input_batch import BatchInputs, InputBatch
from pagedserve.worker.request_state import CachedRequestState


class PromptLogprobs:
    def __init__(self, compute_logits: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.compute_logits = compute_logits
        self.pending: set[str] = set()  # asked, and prompt positions left to compute

    def update(self, out: SchedulerOutput) -> None:
        self.pending -= out.finished_req_ids
        self.pending.update(
            new.request_id
            for new in out.scheduled_new_reqs
            if new.sampling_params.prompt_logprobs is not None
        )

    def compute(
        self,
        batch: BatchInputs,
        hidden: torch.Tensor,
        held: InputBatch,
        output: ModelRunnerOutput,
    ) -> None:
        """The step's prompt positions of every pending request, into `output.prompt_logprobs`. The first
        prompt token has none (None in its place)."""
        if not self.pending:
            return
        query_start_loc = batch.attention[0].query_start_loc
        for row, request_id in enumerate(batch.request_ids):
            if request_id not in self.pending:
                continue
            state = held.states[request_id]
            first_row = query_start_loc[row]
            end = batch.attention[0].seq_lens[row]  # computed after this step
            start = end - (query_start_loc[row + 1] - first_row)
            if end >= state.num_prompt_tokens:  # its prompt is done after this step
                self.pending.discard(request_id)
            if start < state.num_prompt_tokens:
                output.prompt_logprobs[request_id] = self._positions(
                    state, held.known_tokens(request_id), hidden[first_row:], start, end
                )

    def _positions(
        self, state: CachedRequestState, tokens: np.ndarray, hidden: torch.Tensor, start: int, end: int
    ) -> list[PositionLogprobs | None]:
        """Prompt positions [start, end) of `state`, whose known tokens are `tokens`, hidden[i] being
        position start + i."""
        num_top = state.sampling_params.prompt_logprobs
        assert num_top is not None, "only requests that asked are pending"
        last = min(end, state.num_prompt_tokens - 1)  # position p predicts prompt token p + 1
        result: list[PositionLogprobs | None] = [None] if start == 0 else []
        if last > start:
            logits = self.compute_logits(hidden[: last - start]).float()
            targets = torch.from_numpy(tokens[start + 1 : last + 1]).to(logits.device)
            ids, values, ranks = gather_logprobs(torch.log_softmax(logits, dim=-1), num_top, targets)
            result += map(PositionLogprobs, ids.tolist(), values.tolist(), ranks.tolist())
        return result
