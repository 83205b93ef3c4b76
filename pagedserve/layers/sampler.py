"""Batched sampling: every request's logits processed together as tensors, never a loop per request
(except for drawing seeded noise, one generator per seeded request)."""

import functools
from dataclasses import dataclass

import torch

from pagedserve.kernels.cpu import load_cpu_kernels

_NEG_INF = float("-inf")


@dataclass
class SamplingMetadata:
    """Per-row sampling settings of one step's logits (row i = the i-th sampled request)."""

    temperature: torch.Tensor  # [R] float32; 0 = greedy
    all_greedy: bool
    top_k: torch.Tensor | None  # [R] int64, vocab size = off
    top_p: torch.Tensor | None  # [R] float32, 1 = off
    min_p: torch.Tensor | None  # [R] float32, 0 = off
    seeds: dict[int, int]  # row -> seed for this token (reproducible per request)
    max_num_logprobs: int | None
    # Penalties: [R] tensors plus the token counts they act on, None when no row uses them.
    presence_penalty: torch.Tensor | None = None
    frequency_penalty: torch.Tensor | None = None
    repetition_penalty: torch.Tensor | None = None
    output_token_counts: torch.Tensor | None = None  # [R, V] counts of generated tokens
    prompt_token_mask: torch.Tensor | None = None  # [R, V] bool: token occurs in the prompt
    # Additive biases (logit_bias, and -inf for stop tokens before min_tokens): [R, V] or None.
    logit_bias: torch.Tensor | None = None
    # [R] bool: the rows of beams (core/beam_search.py), whose logprobs are HF's beam scores; None: none.
    beam_rows: torch.Tensor | None = None

    @property
    def processes_logits(self) -> bool:
        """Whether a penalty or bias changes the logits before the sampler picks."""
        return (
            self.logit_bias is not None
            or self.repetition_penalty is not None
            or self.frequency_penalty is not None
        )


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [R]
    logprob_token_ids: torch.Tensor | None  # [R, 1 + k]: sampled token, then the top-k
    logprobs: torch.Tensor | None  # [R, 1 + k]
    ranks: torch.Tensor | None  # [R]: the sampled token's rank (gather_logprobs)


class Sampler:
    """logits [R, V] float32 -> one token per row, plus the logprobs of the raw model distribution (a
    beam's: processed, as HF's beam search ranks them)."""

    def __call__(
        self, logits: torch.Tensor, meta: SamplingMetadata, greedy_tokens: torch.Tensor | None = None
    ) -> SamplerOutput:
        """`greedy_tokens`: each row's argmax of `logits` as given, if known (the LM head's kernel found it):
        the greedy rows take it unless a penalty or bias changes the logits first."""
        raw_logprobs = None if meta.max_num_logprobs is None else torch.log_softmax(logits, dim=-1)
        if meta.processes_logits:
            greedy_tokens = None
            if raw_logprobs is not None and meta.beam_rows is not None:
                # NOTE: HF's beam search applies the processors to the log-softmax, not renormalized after.
                processed = self.apply_penalties_and_bias(raw_logprobs, meta)
                raw_logprobs = torch.where(meta.beam_rows[:, None], processed, raw_logprobs)
            logits = self.apply_penalties_and_bias(logits, meta)
        greedy_rows = greedy(logits) if greedy_tokens is None else greedy_tokens
        if meta.all_greedy:  # NOTE: the fast path: no temperature, top-k/p or noise work
            sampled = greedy_rows
        else:
            sampled = torch.where(meta.temperature > 0, self._sample(logits, meta), greedy_rows)
        if raw_logprobs is None or meta.max_num_logprobs is None:
            return SamplerOutput(sampled, None, None, None)
        return SamplerOutput(sampled, *gather_logprobs(raw_logprobs, meta.max_num_logprobs, sampled))

    def apply_penalties_and_bias(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """logit_bias (and min_tokens' -inf) first, then the penalties: the order of vLLM's sampler and of
        HF's processors (sequence_bias before repetition_penalty)."""
        if meta.logit_bias is not None:
            logits = logits + meta.logit_bias
        if meta.repetition_penalty is not None:
            assert meta.prompt_token_mask is not None and meta.output_token_counts is not None
            seen = meta.prompt_token_mask | (meta.output_token_counts > 0)
            penalty = torch.where(seen, meta.repetition_penalty[:, None], 1.0)
            logits = torch.where(logits > 0, logits / penalty, logits * penalty)
        if meta.frequency_penalty is not None:
            counts = meta.output_token_counts
            assert counts is not None and meta.presence_penalty is not None, "set with frequency_penalty"
            logits = logits - meta.frequency_penalty[:, None] * counts
            logits = logits - meta.presence_penalty[:, None] * (counts > 0)
        return logits

    def _sample(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        return draw(self.probabilities(logits, meta), meta.seeds)

    def probabilities(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """The distribution each row samples from: temperature, top-k, top-p, min-p applied (rows with
        temperature 0 get temperature 1 here; the caller takes their argmax instead)."""
        temperature = torch.where(meta.temperature > 0, meta.temperature, 1.0)
        logits = logits / temperature[:, None]
        if meta.top_k is not None or meta.top_p is not None:
            logits = _apply_top_k_top_p(logits, meta.top_k, meta.top_p)
        probs = logits.softmax(dim=-1)
        if meta.min_p is not None:
            threshold = probs.amax(dim=-1, keepdim=True) * meta.min_p[:, None]
            probs = probs.masked_fill(probs < threshold, 0.0)
        return probs


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Each row's most likely token (the first of equals, the first NaN if any: as torch.argmax). On CPU
    through the native kernel, rows spread over the threads (kernels/cpu/greedy_argmax.cpp), else numpy's
    vectorized argmax: torch's CPU argmax is ~10x slower (8 ms vs 0.65 ms for 64 rows of 49k logits on the
    development machine, docs/benchmarks.md), more than the rest of the step outside the model."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        ops = _native_ops()
        if ops is not None and logits.dim() == 2 and logits.shape[1] and logits.stride(1) == 1:
            tokens: torch.Tensor = ops.greedy_argmax(logits)
            return tokens
        return torch.from_numpy(logits.numpy().argmax(axis=-1))
    return logits.argmax(dim=-1)


@functools.cache
def _native_ops() -> torch._ops._OpNamespace | None:
    """torch.ops.pagedserve when the native CPU kernels are built, else None (asked once per process)."""
    return None if load_cpu_kernels().module is None else torch.ops.pagedserve


def row_generators(device: torch.device, seeds: dict[int, int]) -> dict[int, torch.Generator]:
    """One generator per seeded row: its draws depend only on the request's seed and position."""
    return {row: torch.Generator(device).manual_seed(seed) for row, seed in seeds.items()}


def draw(
    probs: torch.Tensor, seeds: dict[int, int], generators: dict[int, torch.Generator] | None = None
) -> torch.Tensor:
    """One token per row drawn from `probs` (rows need not be normalized)."""
    # Gumbel-style sampling: argmax(p / q), q ~ Exp(1), is a draw from p.
    noise = torch.empty_like(probs).exponential_()
    for row, generator in (generators or row_generators(probs.device, seeds)).items():
        noise[row].exponential_(generator=generator)
    return (probs / noise).argmax(dim=-1)


def _apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    if top_k is not None:
        kth = sorted_logits.gather(1, (logits.shape[1] - top_k).clamp(min=0)[:, None])
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, _NEG_INF)
    if top_p is not None:
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1 - top_p[:, None]
        drop[:, -1] = False  # always keep the most likely token
        sorted_logits = sorted_logits.masked_fill(drop, _NEG_INF)
    return sorted_logits.scatter(1, order, sorted_logits)


def gather_logprobs(
    logprobs: torch.Tensor, num_top: int, token_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logprobs [N, V], token_ids [N] -> ids and values [N, 1 + num_top] (the given token, then the
    top-k) and the given token's rank [N]: how many tokens are at least as likely, itself included (vLLM's
    count: 1 for the most likely)."""
    chosen = logprobs.gather(1, token_ids[:, None])
    ranks = (logprobs >= chosen).sum(dim=-1)
    if num_top == 0:
        return token_ids[:, None], chosen, ranks
    top_values, top_ids = top_tokens(logprobs, num_top)
    return torch.cat([token_ids[:, None], top_ids], dim=1), torch.cat([chosen, top_values], dim=1), ranks


def top_tokens(logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest values of each row [N, V] and their ids, largest first, equal values by ascending id.
    NOTE: torch.topk orders equal values as its kernel happens to (it varies with the batch): a grammar
    masks thousands of tokens to -inf, and which of them a row reports must not depend on its batch."""
    kth = logprobs.topk(k, dim=-1).values[:, -1:]
    above = logprobs > kth
    at_kth = logprobs == kth
    take = above | (at_kth & (at_kth.cumsum(dim=-1) <= k - above.sum(dim=-1, keepdim=True)))
    ids = take.nonzero()[:, 1].view(-1, k)  # each row's k ids, ascending
    values = logprobs.gather(1, ids)
    order = values.sort(dim=-1, descending=True, stable=True).indices
    return values.gather(1, order), ids.gather(1, order)
