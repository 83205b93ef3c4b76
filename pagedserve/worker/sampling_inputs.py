"""The sampling settings of a step's logits rows for the sampler pipeline (penalties, bias, min_tokens,
temperature, top-k/p, min-p, seeds). Each held request's settings live in a row of persistent columns,
written once when the request arrives (`SamplingState.add`); a step gathers its rows' columns at once, and
only the rows that use a per-token feature (penalties, logit_bias, min_tokens, a seed) are visited one by
one. Every row, a plain sample or one position of a draft verification, is built the same way from the
tokens that precede it."""

from dataclasses import dataclass

import numpy as np
import torch

from pagedserve.layers.sampler import SamplingMetadata
from pagedserve.worker.request_state import CachedRequestState

_UINT64_MASK = 2**64 - 1


@dataclass
class SamplingRows:
    """The step's sampling rows: the persistent row of each (a request repeats once per verified draft
    position), its request, and the drafts before its position (they count as output for its penalties,
    min_tokens and seed, as they would had they been sampled one step at a time)."""

    rows: np.ndarray  # [R] int64, rows of the SamplingState
    requests: list[CachedRequestState]
    drafted: list[list[int]]
    # Each held request's known tokens by row, token_ids[row, :num_tokens[row]] (the input batch's arrays).
    token_ids: np.ndarray
    num_tokens: np.ndarray

    def num_known(self, i: int) -> int:
        """How many tokens sampling row i's request knows (without its drafts)."""
        return int(self.num_tokens[self.rows[i]])

    def known_tokens(self, i: int) -> np.ndarray:
        return self.token_ids[self.rows[i], : self.num_known(i)]


class SamplingState:
    """Per-row sampling settings [rows] of the requests a worker holds; rows grow by doubling."""

    def __init__(self, rows: int = 64) -> None:
        self.temperature = np.zeros(rows, dtype=np.float32)
        self.top_k = np.zeros(rows, dtype=np.int64)  # 0 = off
        self.top_p = np.ones(rows, dtype=np.float32)
        self.min_p = np.zeros(rows, dtype=np.float32)
        self.presence_penalty = np.zeros(rows, dtype=np.float32)
        self.frequency_penalty = np.zeros(rows, dtype=np.float32)
        self.repetition_penalty = np.ones(rows, dtype=np.float32)
        self.num_logprobs = np.full(rows, -1, dtype=np.int64)  # -1 = none asked
        self.beam = np.zeros(rows, dtype=np.bool_)
        # A per-token feature (penalties' token counts, logit_bias or min_tokens' bans, a seed): the row
        # is visited on its own when it samples.
        self.per_token = np.zeros(rows, dtype=np.bool_)
        # Counts the writes: a step's gathered settings stay valid while it is unchanged (input_batch.py).
        self.version = 0

    def add(self, row: int, request: CachedRequestState) -> None:
        """Write a request's settings into `row` (whatever request held it before is overwritten)."""
        if row >= len(self.temperature):
            self._grow(max(row + 1, 2 * len(self.temperature)))
        self.version += 1
        p = request.sampling_params
        with np.errstate(over="ignore"):  # a float beyond float32 becomes inf, as torch.tensor casts it
            self.temperature[row] = p.temperature
        self.top_k[row] = max(p.top_k, 0)  # int64 by validation
        self.top_p[row] = p.top_p
        self.min_p[row] = p.min_p
        self.presence_penalty[row] = p.presence_penalty
        self.frequency_penalty[row] = p.frequency_penalty
        self.repetition_penalty[row] = p.repetition_penalty
        self.num_logprobs[row] = -1 if p.logprobs is None else p.logprobs
        self.beam[row] = request.beam
        self.per_token[row] = bool(
            _uses_penalties(request) or p.logit_bias or p.min_tokens > 0 or p.seed is not None
        )

    def host_arrays(
        self, step: SamplingRows, vocab_size: int
    ) -> tuple[dict[str, np.ndarray], SamplingMetadata]:
        """The step's columns as host arrays (named as SamplingMetadata's tensors), and the metadata with
        its host-side fields set; `to_device` fills in the tensors from the arrays' device copies."""
        rows = step.rows
        temperature = self.temperature[rows]
        top_k = self.top_k[rows]
        top_k = np.where((top_k > 0) & (top_k < vocab_size), top_k, vocab_size)
        num_logprobs = self.num_logprobs[rows]
        arrays = {"temperature": temperature}
        if (top_k < vocab_size).any():
            arrays["top_k"] = top_k
        for name, off in (("top_p", 1.0), ("min_p", 0.0)):
            column = getattr(self, name)[rows]
            if (column != off).any():
                arrays[name] = column
        if self.beam[rows].any():
            arrays["beam_rows"] = self.beam[rows]
        meta = SamplingMetadata(
            temperature=torch.empty(0),  # set from the device copy
            all_greedy=not (temperature != 0).any(),
            top_k=None,
            top_p=None,
            min_p=None,
            seeds={},
            max_num_logprobs=int(num_logprobs.max()) if (num_logprobs >= 0).any() else None,
        )
        visited = np.flatnonzero(self.per_token[rows])
        if len(visited):
            self._per_token_arrays(step, visited, vocab_size, arrays, meta)
        return arrays, meta

    def _per_token_arrays(
        self,
        step: SamplingRows,
        visited: np.ndarray,
        vocab_size: int,
        arrays: dict[str, np.ndarray],
        meta: SamplingMetadata,
    ) -> None:
        """Penalties (with the token counts they act on), logit_bias and min_tokens' bans, and seeds, of
        the rows that use them."""
        rows, requests, drafted = step.rows, step.requests, step.drafted
        penalized = [i for i in visited.tolist() if _uses_penalties(requests[i])]
        if penalized:
            counts = np.zeros((len(rows), vocab_size), dtype=np.float32)
            prompt_mask = np.zeros((len(rows), vocab_size), dtype=np.bool_)
            for i in penalized:
                known, num_prompt = step.known_tokens(i), requests[i].num_prompt_tokens
                np.add.at(counts[i], known[num_prompt:], 1.0)
                np.add.at(counts[i], drafted[i], 1.0)
                prompt_mask[i, known[:num_prompt]] = True
            arrays["output_token_counts"], arrays["prompt_token_mask"] = counts, prompt_mask
            for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
                arrays[name] = getattr(self, name)[rows]
        bias = _logit_bias(step, visited, vocab_size)
        if bias is not None:
            arrays["logit_bias"] = bias
        # NOTE: a seeded request's noise depends only on (seed, output position): reproducible whatever
        # else is in the batch, and across preemptions. Masked to 64 bits, what manual_seed takes, for any seed.
        for i in visited.tolist():
            seed = requests[i].sampling_params.seed
            if seed is not None and self.temperature[rows[i]] > 0:
                position = step.num_known(i) + len(drafted[i])
                meta.seeds[i] = (seed * 1_000_003 + position) & _UINT64_MASK

    def _grow(self, rows: int) -> None:
        for name, column in vars(self).items():
            if not isinstance(column, np.ndarray):
                continue
            grown = np.resize(column, rows)  # the new rows hold copies: add() overwrites them
            setattr(self, name, grown)


def to_device(meta: SamplingMetadata, tensors: dict[str, torch.Tensor]) -> SamplingMetadata:
    """Set the metadata's tensors from the device copies of `host_arrays`' arrays."""
    for name, tensor in tensors.items():
        setattr(meta, name, tensor)
    return meta


def build_sampling_metadata(
    requests: list[CachedRequestState],
    token_ids: list[list[int]],
    vocab_size: int,
    device: torch.device,
    drafted: list[list[int]] | None = None,
) -> SamplingMetadata:
    """The metadata of `requests` (row i = requests[i], which knows `token_ids[i]`) built from scratch,
    without a persistent state: the reference the step's incremental path must equal, and the entry point
    for one-off callers."""
    state = SamplingState(max(len(requests), 1))
    for row, request in enumerate(requests):
        state.add(row, request)
    lengths = [len(tokens) for tokens in token_ids]
    known = np.zeros((len(requests), max(lengths, default=0)), dtype=np.int64)
    for row, tokens in enumerate(token_ids):
        known[row, : len(tokens)] = tokens
    step = SamplingRows(
        np.arange(len(requests)), requests, drafted or [[] for _ in requests], known, np.array(lengths)
    )
    arrays, meta = state.host_arrays(step, vocab_size)
    return to_device(meta, {name: torch.from_numpy(a).to(device) for name, a in arrays.items()})


def _uses_penalties(request: CachedRequestState) -> bool:
    p = request.sampling_params
    return bool(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1)


def _logit_bias(step: SamplingRows, visited: np.ndarray, vocab_size: int) -> np.ndarray | None:
    """logit_bias, plus -inf on stop_token_ids and EOS (unless ignore_eos: then it is no stop, as in vLLM)
    while a row is under its request's min_tokens."""
    bias = None
    for i in visited.tolist():
        r = step.requests[i]
        p = r.sampling_params
        entries = dict(p.logit_bias or {})
        if step.num_known(i) + len(step.drafted[i]) - r.num_prompt_tokens < p.min_tokens:
            eos = [] if r.eos_token_id is None or p.ignore_eos else [r.eos_token_id]
            banned = list(p.stop_token_ids or []) + eos
            entries.update({token: float("-inf") for token in banned})
        if entries:
            bias = np.zeros((len(step.rows), vocab_size), dtype=np.float32) if bias is None else bias
            bias[i, list(entries)] = list(entries.values())
    return bias
