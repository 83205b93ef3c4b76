"""The worker's persistent view of the requests it holds (tokens, progress, block tables, sampling
settings), updated by each step's scheduler diff, and the step's flattened batch tensors built from it:
numpy gathers over the held rows (no Python loop over the batch's requests), one host-to-device copy.
A decode step of the same requests as the previous one reuses that step's layout (rows, order, sampling
settings) and gathers only its tokens, positions, tables and slots, in one call of the decode helpers
(worker/decode_inputs.py: native on the CPU)."""

from dataclasses import dataclass, field

import numpy as np
import torch

from pagedserve.attention.backends.base import CommonAttentionMetadata
from pagedserve.core.sched_output import SchedulerOutput
from pagedserve.layers.sampler import SamplingMetadata
from pagedserve.worker.block_table import BlockTables, slot_mapping
from pagedserve.worker.decode_inputs import DecodeInputBuffer, DecodeInputs
from pagedserve.worker.mrope_positions import MRopePositions
from pagedserve.worker.request_state import CachedRequestState
from pagedserve.worker.sampling_inputs import SamplingRows, SamplingState, to_device
from pagedserve.worker.staging import StepStaging

_SAMPLING = "sampling."  # the staged arrays of the sampling metadata are named with this prefix


@dataclass
class BatchInputs:
    """Flattened, unpadded batch. Single-token (decode) requests come first."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]; [3, T] for an M-RoPE family (worker/mrope_positions.py)
    attention: list[CommonAttentionMetadata]  # per KV cache group: its block tables and slot mapping
    request_ids: list[str]  # [R], batch order
    sample_rows: list[int]  # indices into request_ids whose tokens reach the end: they sample
    # The positions whose logits are computed: per sampling row its last token, and with draft tokens
    # (speculative decoding) the last 1 + num_drafts tokens.
    logits_indices: torch.Tensor
    draft_token_ids: list[list[int]]  # per sampling row (empty: no drafts)
    # The sampling settings of the logits rows (None when nothing samples, or built by hand in tests).
    sampling: SamplingMetadata | None = None
    # Whether logits_indices lists every token (a decode step's): the hidden states need no gather.
    logits_at_every_token: bool = False

    @property
    def num_tokens_per_row(self) -> list[int]:
        starts = self.attention[0].query_start_loc
        return [end - start for start, end in zip(starts, starts[1:])]


@dataclass
class _DecodeLayout:
    """What a decode-only step (one token per request, every request sampling, no drafts) shares with the
    next step when the same requests decode again, in the same order, with no request added since
    (`sampling_version`): their rows, and the staged tensors that depend on nothing else."""

    order: list[str]
    rows: np.ndarray
    sampling_version: int
    query_start_loc: list[int]
    query_start_loc_tensor: torch.Tensor
    logits_indices: torch.Tensor
    sampling: SamplingMetadata | None
    # What every step of the layout hands on unchanged: each row samples, none has drafts.
    sample_rows: list[int] = field(init=False)
    no_drafts: list[list[int]] = field(init=False)

    def __post_init__(self) -> None:
        self.sample_rows = list(range(len(self.order)))
        self.no_drafts = [[] for _ in self.order]


class InputBatch:
    """Every request the worker holds (`states`), kept across steps. Each holds one row (its block-table
    row) of the persistent arrays: block tables, token ids, sampling settings. `mrope`: an M-RoPE
    family's positions (None: a token's position is its index). `pack`: stage each step's arrays in one
    buffer and copy it (default: off the CPU; worker/staging.py)."""

    def __init__(
        self,
        block_size: int,
        device: torch.device,
        vocab_size: int,
        num_groups: int = 1,
        mrope: MRopePositions | None = None,
        decode: DecodeInputs | None = None,
        pack: bool | None = None,
    ) -> None:
        self.block_size = block_size
        self.mrope = mrope
        self.device = device
        self.vocab_size = vocab_size
        self.num_groups = num_groups
        self.states: dict[str, CachedRequestState] = {}
        self.block_tables = BlockTables(num_groups)
        self.sampling = SamplingState()
        # Per row: every token known (then this step's drafts), how many are known, how many computed.
        self.token_ids = np.zeros((64, 256), dtype=np.int64)
        self.num_tokens = np.zeros(64, dtype=np.int64)
        self.num_computed = np.zeros(64, dtype=np.int64)
        self.staging = StepStaging(device, pack)
        self.decode = DecodeInputs() if decode is None else decode  # a steady decode step's arrays
        self.decode_buffers = DecodeInputBuffer(num_groups, block_size, device, self.staging.pack, mrope)
        self._decode_layout: _DecodeLayout | None = None
        # Set when the last update gave each request it names one new token, its only one not computed
        # (and added none): their (positions, token ids), in the update's order. With the same requests in
        # the same order, a decode layout holds (`_repeats`) and these are the step's inputs.
        self._next_tokens: tuple[list[int], list[int]] | None = None

    def update(self, out: SchedulerOutput) -> None:
        """Apply the scheduler's diff: forget finished/preempted requests, add new ones, extend cached ones
        (a loop over the changed requests only)."""
        for request_id in out.finished_req_ids:
            self.states.pop(request_id, None)
            self.block_tables.remove(request_id)
        for new in out.scheduled_new_reqs:
            state = CachedRequestState(
                new.request_id,
                new.num_prompt_tokens,
                new.sampling_params,
                new.eos_token_id,
                new.lora_request,
                new.beam,
                new.images,
            )
            self.states[new.request_id] = state
            self.block_tables.remove(new.request_id)  # NOTE: a resumed request comes back as new
            self.block_tables.add(new.request_id, list(new.block_ids))
            row = self.block_tables.row_of[new.request_id]
            self.sampling.add(row, state)
            if self.mrope is not None:
                self.mrope.add(row, new.images)
            self._write_tokens(row, 0, new.token_ids, new.num_computed_tokens)
        # NOTE: a decode's one new token is written with the others' in one array assignment below.
        rows, starts, tokens, num_computed = [], [], [], []
        row_of = self.block_tables.row_of
        for cached in out.scheduled_cached_reqs:
            if cached.num_dropped_blocks:
                self.block_tables.drop_last(cached.request_id, cached.num_dropped_blocks)
            new_token_ids = cached.new_token_ids
            if len(new_token_ids) == 1:
                rows.append(row_of[cached.request_id])
                starts.append(cached.new_tokens_start)
                tokens.append(new_token_ids[0])
                num_computed.append(cached.num_computed_tokens)
            else:
                self._write_tokens(
                    row_of[cached.request_id],
                    cached.new_tokens_start,
                    new_token_ids,
                    cached.num_computed_tokens,
                )
            if cached.new_block_ids:
                self.block_tables.append(cached.request_id, cached.new_block_ids)
        self._next_tokens = None
        if rows:
            # NOTE: the maxima of the lists: numpy's reductions cost more than Python's max up to many rows.
            self._fit(max(rows), max(starts) + 1)
            self.decode.write_next_tokens(
                self.token_ids, self.num_tokens, self.num_computed, rows, starts, tokens, num_computed
            )
            if (
                not out.scheduled_new_reqs
                and len(rows) == len(out.scheduled_cached_reqs)
                and num_computed == starts
            ):
                self._next_tokens = (starts, tokens)

    def num_known(self, request_id: str) -> int:
        """How many tokens of the request the worker knows (its prompt, then its outputs)."""
        return int(self.num_tokens[self.block_tables.row_of[request_id]])

    def known_tokens(self, request_id: str) -> np.ndarray:
        """Every token of the request the worker knows: a view of its row."""
        return self.token_ids[self.block_tables.row_of[request_id], : self.num_known(request_id)]

    def _write_tokens(self, row: int, start: int, token_ids: list[int], num_computed: int) -> None:
        """Tokens [start, start + len) of the request in `row`, which now knows that many and has
        `num_computed` of them computed."""
        end = start + len(token_ids)
        self._fit(row, end)
        self.token_ids[row, start:end] = token_ids
        self.num_tokens[row] = end
        self.num_computed[row] = num_computed

    def _fit(self, row: int, width: int) -> None:
        """Grow the token arrays (by doubling) to hold `row` and `width` tokens in it."""
        rows, old_width = self.token_ids.shape
        if row < rows and width <= old_width:
            return
        new_rows = rows if row < rows else max(2 * rows, row + 1)
        grown = np.zeros((new_rows, old_width if width <= old_width else 2 * width), dtype=np.int64)
        grown[:rows, :old_width] = self.token_ids
        self.token_ids = grown
        self.num_tokens = np.resize(self.num_tokens, grown.shape[0])
        self.num_computed = np.resize(self.num_computed, grown.shape[0])

    def build(self, out: SchedulerOutput) -> BatchInputs:
        """Flatten the scheduled tokens (a request's draft tokens after its own) into the step's tensors,
        with the sampling settings of the rows that sample, in one host-to-device copy."""
        layout = self._decode_layout
        if layout is not None and self._repeats(layout, out):
            return self._build_decode(layout)
        scheduled, spec = out.num_scheduled_tokens, out.scheduled_spec_decode_tokens
        # decodes first, then verifications (1 + drafts tokens: attention backends may take them as
        # decodes), then prefill chunks (stable)
        order = sorted(
            scheduled, key=lambda rid: (scheduled[rid] != 1, scheduled[rid] != 1 + len(spec.get(rid, [])))
        )
        rows = np.fromiter((self.block_tables.row_of[r] for r in order), dtype=np.int64, count=len(order))
        nums = np.fromiter((scheduled[r] for r in order), dtype=np.int64, count=len(order))
        num_drafts = self._write_all_drafts(order, rows, spec)
        starts = self.num_computed[rows]
        query_start_loc = np.concatenate([[0], np.cumsum(nums)])
        seq_lens = starts + nums
        # Every token's row, position and KV slot at once.
        token_rows = np.repeat(np.arange(len(order)), nums)
        positions = starts[token_rows] + np.arange(int(query_start_loc[-1])) - query_start_loc[token_rows]
        token_row_ids = rows[token_rows]
        arrays = self._token_arrays(rows, token_row_ids, positions, self.token_ids[token_row_ids, positions])
        arrays["query_start_loc"], arrays["seq_lens"] = query_start_loc, seq_lens
        # The rows whose scheduled tokens reach their end sample: their last 1 + num_drafts positions.
        sample_rows = np.flatnonzero(seq_lens == self.num_tokens[rows] + num_drafts)
        num_logits = 1 + num_drafts[sample_rows]
        arrays["logits_indices"] = _last_positions(query_start_loc[sample_rows + 1], num_logits)
        drafts, sampling, sampling_arrays = self._sampling(order, spec, rows, sample_rows, num_logits)
        arrays.update({_SAMPLING + name: array for name, array in sampling_arrays.items()})
        tensors = self.staging.to_device(arrays)
        if sampling is not None:
            to_device(sampling, {name: tensors[_SAMPLING + name] for name in sampling_arrays})
        num_decodes = int(np.count_nonzero(nums == 1))
        query_starts = query_start_loc.tolist()
        every_row_decodes = num_decodes == len(order) == len(sample_rows) and not spec
        self._decode_layout = (
            self._layout(order, rows, query_starts, tensors, sampling) if every_row_decodes else None
        )
        return BatchInputs(
            tensors["input_ids"],
            tensors["positions"],
            self._attention(tensors, seq_lens, query_starts, num_decodes),
            order,
            sample_rows.tolist(),
            tensors["logits_indices"],
            drafts,
            sampling,
            len(arrays["logits_indices"]) == len(arrays["input_ids"]),
        )

    def _layout(
        self,
        order: list[str],
        rows: np.ndarray,
        query_starts: list[int],
        tensors: dict[str, torch.Tensor],
        sampling: SamplingMetadata | None,
    ) -> _DecodeLayout | None:
        """What the next step may repeat of a decode-only step's batch (None for rows with a per-token
        setting)."""
        if self.sampling.per_token[rows].any():
            return None
        layout_tensors = tensors["query_start_loc"], tensors["logits_indices"]
        return _DecodeLayout(order, rows, self.sampling.version, query_starts, *layout_tensors, sampling)

    def _repeats(self, layout: _DecodeLayout, out: SchedulerOutput) -> bool:
        """The step decodes one token of each request of the previous (decode-only) step, in the same order,
        each its next token (so it samples), and the sampling settings are unchanged: its layout holds."""
        scheduled = out.num_scheduled_tokens
        return (
            self._next_tokens is not None
            and out.total_num_scheduled_tokens == len(scheduled)  # each request computes one token
            and not out.scheduled_spec_decode_tokens
            and self.sampling.version == layout.sampling_version
            and list(scheduled) == layout.order
        )

    def _build_decode(self, layout: _DecodeLayout) -> BatchInputs:
        """The batch of a step that repeats the previous decode step's layout: one token per row, each its
        request's next, in the same order: its inputs from the update's positions and token ids, written
        into the layout's buffers by one call of the decode helpers."""
        assert self._next_tokens is not None, "checked by _repeats"
        buffers = self.decode_buffers
        tensors = buffers.fill(self.decode, self.block_tables, layout.rows, self._next_tokens)
        tensors["query_start_loc"] = layout.query_start_loc_tensor
        attention = self._attention(tensors, buffers.seq_lens, layout.query_start_loc, len(layout.order))
        return BatchInputs(
            tensors["input_ids"],
            tensors["positions"],
            attention,
            layout.order,
            layout.sample_rows,
            layout.logits_indices,
            layout.no_drafts,
            layout.sampling,
            logits_at_every_token=True,
        )

    def _token_arrays(
        self, rows: np.ndarray, token_row_ids: np.ndarray, positions: np.ndarray, input_ids: np.ndarray
    ) -> dict[str, np.ndarray]:
        """The step's token ids, positions, and each group's block tables (of `rows`, in order) and slot
        mapping (host arrays to stage): token i is `input_ids[i]`, of the request in row `token_row_ids[i]`,
        at `positions[i]`."""
        tables = self.block_tables.gather_rows(rows)  # [groups, rows, width]
        slots = slot_mapping(self.block_tables.table, token_row_ids, positions, self.block_size)
        return self._named(token_row_ids, input_ids, positions, tables, slots)

    def _named(
        self,
        token_row_ids: np.ndarray,
        input_ids: np.ndarray,
        positions: np.ndarray,
        tables: np.ndarray,
        slots: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """The step's token arrays by their staged names (an M-RoPE family's 3-D positions from its rows)."""
        return {
            "input_ids": input_ids,
            "positions": positions if self.mrope is None else self.mrope.positions(token_row_ids, positions),
            **{f"block_tables{g}": tables[g] for g in range(self.num_groups)},
            **{f"slot_mapping{g}": slots[g] for g in range(self.num_groups)},
        }

    def _sampling(
        self,
        order: list[str],
        spec: dict[str, list[int]],
        rows: np.ndarray,
        sample_rows: np.ndarray,
        num_logits: np.ndarray,
    ) -> tuple[list[list[int]], SamplingMetadata | None, dict[str, np.ndarray]]:
        """The sampling rows' drafts, and their settings (host arrays, staged with the step's others)."""
        sample_ids = [order[i] for i in sample_rows.tolist()]
        drafts = [spec.get(request_id, []) for request_id in sample_ids]
        if not sample_ids:
            return drafts, None, {}
        step = SamplingRows(
            np.repeat(rows[sample_rows], num_logits),
            [self.states[r] for r, draft in zip(sample_ids, drafts) for _ in range(len(draft) + 1)],
            [draft[:j] for draft in drafts for j in range(len(draft) + 1)],
            self.token_ids,
            self.num_tokens,
        )
        sampling_arrays, sampling = self.sampling.host_arrays(step, self.vocab_size)
        return drafts, sampling, sampling_arrays

    def _attention(
        self,
        tensors: dict[str, torch.Tensor],
        seq_lens: np.ndarray,
        query_start_loc: list[int],
        num_decodes: int,
    ) -> list[CommonAttentionMetadata]:
        """Each KV cache group's attention metadata of the step (its `num_decodes` decodes, one token each,
        first); `tensors`: the staged ones, with "query_start_loc" and "seq_lens"."""
        lengths = seq_lens.tolist()
        return [
            CommonAttentionMetadata(
                query_start_loc=query_start_loc,
                seq_lens=lengths,
                query_start_loc_tensor=tensors["query_start_loc"],
                seq_lens_tensor=tensors["seq_lens"],
                block_tables=tensors[f"block_tables{group}"],
                slot_mapping=tensors[f"slot_mapping{group}"],
                num_decodes=num_decodes,
                block_size=self.block_size,
            )
            for group in range(self.num_groups)
        ]

    def _write_all_drafts(self, order: list[str], rows: np.ndarray, spec: dict[str, list[int]]) -> np.ndarray:
        """Each request's draft tokens after its known ones (a loop over the requests with drafts only); how
        many, per request of `order`."""
        num_drafts = np.zeros(len(order), dtype=np.int64)
        if spec:
            for i, request_id in enumerate(order):
                if spec.get(request_id):
                    num_drafts[i] = self._write_drafts(int(rows[i]), spec[request_id])
        return num_drafts

    def _write_drafts(self, row: int, draft: list[int]) -> int:
        """Put a request's draft tokens after its known ones (the next diff overwrites them with what was
        accepted); their number."""
        start = int(self.num_tokens[row])
        self._fit(row, start + len(draft))
        self.token_ids[row, start : start + len(draft)] = draft
        return len(draft)


def _last_positions(ends: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The last counts[i] token indices before ends[i], for each i, concatenated."""
    firsts: np.ndarray = np.repeat(ends - counts, counts)
    offsets: np.ndarray = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    positions: np.ndarray = firsts + offsets
    return positions
