"""EngineCoreOutputs -> RequestOutputs: detokenize, apply stop strings, gather the n samples (the n best
of best_of), measure.

Serves both the offline LLMEngine (cumulative outputs) and AsyncLLM (deltas for streaming, or only the
final output): each request's `SamplingParams.output_kind` decides.
"""

import time
from dataclasses import dataclass, field, replace

from pagedserve.engine.detokenizer import IncrementalDetokenizer
from pagedserve.engine.input_processor import split_samples
from pagedserve.engine.logprob_dicts import LogprobDicts
from pagedserve.engine.tokenizer import AnyTokenizer
from pagedserve.metrics.stats import FinishedRequestStats, IterationStats
from pagedserve.outputs import CompletionOutput, PromptLogprobs, RequestOutput, SampleLogprobs
from pagedserve.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
    child_request_id,
)
from pagedserve.sampling_params import RequestOutputKind, SamplingParams


@dataclass
class SampleState:
    """One of a request's samples (one engine-core request each), or one of its best beams."""

    index: int
    detokenizer: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    logprobs: SampleLogprobs | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_sent_tokens: int = 0  # tokens already handed out as deltas
    last_token_time: float | None = None

    def completion(self, delta: bool) -> CompletionOutput:
        """Everything so far, or (delta) only what is new since the previous delta."""
        start = self.num_sent_tokens if delta else 0
        if delta:
            self.num_sent_tokens = len(self.token_ids)
        text = self.detokenizer.get_next_output_text(self.finish_reason is not None, delta)
        logprobs = None if self.logprobs is None else self.logprobs[start:]
        return CompletionOutput(
            self.index,
            text,
            self.token_ids[start:],
            self.cumulative_logprob,
            logprobs,
            self.finish_reason,
            self.stop_reason,
        )


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    samples: list[SampleState]
    arrival_time: float
    output_kind: RequestOutputKind
    num_returned: int  # n: fewer than the samples when best_of > n
    max_tokens: int | None = None
    prompt_logprobs: PromptLogprobs | None = None
    first_token_time: float | None = None
    scheduled_time: float | None = None
    num_outputs_sent: int = 0
    error: str | None = None  # set when the engine could not take one of its samples
    pooled: list[float] | None = None  # --runner pooling: the prompt's embedding or scores
    num_cached_tokens: int | None = None  # its first sample's prefix-cache hit, once reported
    child_ids: list[str] = field(default_factory=list)  # its samples' engine-core ids

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.samples)

    def to_output(self, updated: list[SampleState], finished: bool | None = None) -> RequestOutput | None:
        """The output due after `updated` samples progressed, per `output_kind`; None if none is due.
        `finished`: the request's `finished`, when the caller has it already."""
        finished = self.finished if finished is None else finished
        kind = self.output_kind
        picking = len(self.samples) > self.num_returned  # the best n are known only at the end
        if (kind is RequestOutputKind.FINAL_ONLY or picking) and not finished:
            return None
        delta = kind is RequestOutputKind.DELTA
        samples = sorted(updated, key=lambda s: s.index) if delta else self.samples
        # NOTE: deltas carry the prompt logprobs once, in the first output (prefill is complete by then).
        prompt_logprobs = None if delta and self.num_outputs_sent else self.prompt_logprobs
        self.num_outputs_sent += 1
        metrics = {"arrival_time": self.arrival_time}
        if self.scheduled_time is not None:
            metrics["scheduled_time"] = self.scheduled_time
        if self.first_token_time is not None:
            metrics["first_token_time"] = self.first_token_time
        completions = [s.completion(delta) for s in samples]
        if picking:
            best = sorted(completions, key=lambda c: -(c.cumulative_logprob or float("-inf")))
            completions = [replace(c, index=i) for i, c in enumerate(best[: self.num_returned])]
        return RequestOutput(
            self.request_id,
            self.prompt,
            self.prompt_token_ids,
            prompt_logprobs,
            completions,
            finished,
            metrics,
            self.error,
            self.pooled,
            self.num_cached_tokens,
        )

    def finished_stats(self, now: float, reason: str | None = None) -> FinishedRequestStats:
        scheduled, first_token = self.scheduled_time, self.first_token_time
        return FinishedRequestStats(
            reason or self.samples[0].finish_reason or str(FinishReason.ABORT),
            now - self.arrival_time,
            len(self.prompt_token_ids),
            sum(len(s.token_ids) for s in self.samples),
            len(self.samples),
            self.max_tokens,
            prefill_time=0.0 if scheduled is None else (first_token or now) - scheduled,
            decode_time=0.0 if first_token is None else now - first_token,
        )


class OutputProcessor:
    """Tracks every request in flight on the frontend side. Not thread-safe: one caller drives it."""

    def __init__(self, tokenizer: AnyTokenizer, measures: bool = True) -> None:
        """`measures`: `process_outputs` may be given stats (a server's metrics: every token's time);
        without (the offline engine), a final-only request needs no output from the engine core between
        its first token and its end (`EngineCoreRequest.final_only`)."""
        self.tokenizer = tokenizer
        self.measures = measures
        self.logprob_dicts = LogprobDicts(tokenizer)
        self._requests: dict[str, RequestState] = {}
        self._child_to_parent: dict[str, tuple[RequestState, SampleState]] = {}

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float,
    ) -> list[str]:
        """Register a request; returns the engine-core ids of its samples (best_of, else n)."""
        num_samples = params.num_samples
        samples = [
            SampleState(
                i,
                IncrementalDetokenizer(
                    self.tokenizer,
                    prompt_token_ids,
                    params.skip_special_tokens,
                    params.stop_strings,
                    params.include_stop_str_in_output,
                ),
                logprobs=[] if params.logprobs is not None else None,
                cumulative_logprob=0.0 if params.logprobs is not None else None,
            )
            for i in range(num_samples)
        ]
        state = RequestState(
            request_id,
            prompt,
            prompt_token_ids,
            samples,
            arrival_time,
            params.output_kind,
            params.n,
            params.max_tokens,
            [] if params.prompt_logprobs is not None else None,
        )
        self._requests[request_id] = state
        child_ids = state.child_ids = [
            child_request_id(request_id, i, num_samples) for i in range(num_samples)
        ]
        for child_id, sample in zip(child_ids, samples):
            self._child_to_parent[child_id] = (state, sample)
        return child_ids

    def register(
        self, request_id: str, prompt: str | None, request: EngineCoreRequest
    ) -> list[EngineCoreRequest]:
        """Track a validated request; returns what the engine core gets: one request per sample (in one
        group), or the beam search as one. The one way a request enters the engine."""
        child_ids = self.add_request(
            request_id, prompt, request.prompt_token_ids, request.sampling_params, request.arrival_time
        )
        children = split_samples(request, child_ids)
        if not self.measures:
            for child in children:
                child.final_only = _final_only(child)
        return children

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests

    @property
    def num_unfinished(self) -> int:
        return len(self._requests)

    def get(self, request_id: str) -> RequestState | None:
        return self._requests.get(request_id)

    def parent_of(self, child_id: str) -> RequestState | None:
        """The request an engine-core id (a sample) belongs to, while it is in flight."""
        entry = self._child_to_parent.get(child_id)
        return None if entry is None else entry[0]

    def fail_all(self) -> list[RequestState]:
        """Forget every request in flight (the engine died); returns them, for the log."""
        states = list(self._requests.values())
        self._requests.clear()
        self._child_to_parent.clear()
        return states

    def process_outputs(
        self, core_outputs: EngineCoreOutputs, stats: IterationStats | None = None
    ) -> tuple[list[RequestOutput], list[str]]:
        """Returns the outputs due (per each request's output_kind) and the engine-core ids to abort
        (stopped by a stop string). Adds token counts and latencies to `stats` when given (a server's
        metrics); without, nothing is measured (the offline engine reads none) but the times each output
        carries (scheduled, first token)."""
        self._record_scheduled(core_outputs, stats)
        if stats is not None and core_outputs.num_scheduled_tokens:
            stats.num_iteration_tokens.append(core_outputs.num_scheduled_tokens)
        updated: dict[str, tuple[RequestState, list[SampleState]]] = {}
        to_abort: list[str] = []
        now = time.time()
        child_to_parent = self._child_to_parent
        for output in core_outputs.outputs:
            entry = child_to_parent.get(output.request_id)
            if output.error is not None:
                # NOTE: a beam search fails under its request's id, which is none of its outputs' ids.
                failed = entry[0] if entry is not None else self._requests.get(output.request_id)
                if failed is not None:
                    to_abort += self._fail(failed, output)
                    updated[failed.request_id] = (failed, list(failed.samples))
                continue
            if entry is None:
                continue
            state, sample = entry
            if output.prompt_logprobs is not None and sample.index == 0 and state.prompt_logprobs is not None:
                state.prompt_logprobs += (
                    None if position is None else self.logprob_dicts.position(position)
                    for position in output.prompt_logprobs
                )
            if output.num_cached_tokens is not None and sample.index == 0:
                state.num_cached_tokens = output.num_cached_tokens
            if not output.new_token_ids and output.finish_reason is None:
                continue  # a prompt chunk: nothing to show yet
            if output.pooled is not None:
                state.pooled = output.pooled
                if stats is not None:
                    stats.num_prompt_tokens += len(state.prompt_token_ids)
            if stats is not None or state.first_token_time is None:
                self._record_tokens(state, sample, output, now, stats)
            if self._update_sample(sample, output):
                to_abort.append(output.request_id)
            if sample.finish_reason is not None:
                del child_to_parent[output.request_id]
            elif state.output_kind is RequestOutputKind.FINAL_ONLY:
                continue  # NOTE: its one output comes when a sample finishes: no per-step output to build
            updated.setdefault(state.request_id, (state, []))[1].append(sample)
        results = []
        for state, samples in updated.values():
            finished = state.finished
            result = state.to_output(samples, finished)
            if result is not None:
                results.append(result)
            if finished:
                del self._requests[state.request_id]
                if stats is not None:
                    stats.finished_requests.append(state.finished_stats(now))
        return results, to_abort

    def _fail(self, state: RequestState, output: EngineCoreOutput) -> list[str]:
        """The engine could not take one of the request's samples: the whole request ends with its error.
        Returns the other samples' engine-core ids to abort."""
        state.error = f"The engine could not run request {state.request_id}: {output.error}"
        return self._end_samples(state, str(FinishReason.ERROR), output.request_id)

    def _update_sample(self, sample: SampleState, output: EngineCoreOutput) -> bool:
        """Append the output to the sample; True when a stop string ended it before the engine did."""
        new_token_ids, new_logprobs = output.new_token_ids, output.new_logprobs
        stop = sample.detokenizer.update(new_token_ids)
        if stop is None:
            sample.token_ids += new_token_ids
        else:
            sample.token_ids += new_token_ids[: stop[1]]
            new_logprobs = new_logprobs[: stop[1]] if new_logprobs else None
        for entry in new_logprobs or ():
            if sample.logprobs is not None:
                sample.logprobs.append(self.logprob_dicts.position(entry))
            # The sampled token comes first.
            sample.cumulative_logprob = (sample.cumulative_logprob or 0.0) + entry.logprobs[0]
        if output.cumulative_logprob is not None:  # a beam search's final beam
            sample.cumulative_logprob = output.cumulative_logprob
        if stop is not None:
            sample.finish_reason, sample.stop_reason = "stop", stop[0]
            return not output.finished
        if output.finish_reason is not None:
            sample.finish_reason, sample.stop_reason = str(output.finish_reason), output.stop_reason
        return False

    @staticmethod
    def _record_tokens(
        state: RequestState,
        sample: SampleState,
        output: EngineCoreOutput,
        now: float,
        stats: IterationStats | None,
    ) -> None:
        """The request's first-token time (its outputs carry it); with `stats`, the step's token counts and
        latencies."""
        if not output.new_token_ids:
            return
        first = state.first_token_time is None
        if first:
            state.first_token_time = now
        if stats is None:
            return
        if first:
            stats.time_to_first_tokens.append(now - state.arrival_time)
            stats.num_prompt_tokens += len(state.prompt_token_ids)
        elif sample.last_token_time is not None:
            stats.inter_token_latencies.append(now - sample.last_token_time)
        sample.last_token_time = now
        stats.num_generation_tokens += len(output.new_token_ids)

    def _record_scheduled(self, core_outputs: EngineCoreOutputs, stats: IterationStats | None) -> None:
        for child_id in core_outputs.scheduled_request_ids:
            entry = self._child_to_parent.get(child_id)
            if entry is not None and entry[0].scheduled_time is None:
                entry[0].scheduled_time = core_outputs.timestamp
                if stats is not None:
                    stats.queue_times.append(core_outputs.timestamp - entry[0].arrival_time)

    def abort_request(self, request_id: str, stats: IterationStats | None = None) -> list[str]:
        """Forget a request; returns the engine-core ids still to abort."""
        state = self._requests.pop(request_id, None)
        if state is None:
            return []
        child_ids = self._end_samples(state, str(FinishReason.ABORT))
        if stats is not None:
            stats.finished_requests.append(state.finished_stats(time.time(), str(FinishReason.ABORT)))
        return child_ids

    def _end_samples(self, state: RequestState, reason: str, gone_id: str | None = None) -> list[str]:
        """End the request's live samples with `reason`; returns their engine-core ids to abort (less
        `gone_id`, a sample the engine no longer has)."""
        live = []
        for child_id in state.child_ids:  # NOTE: not a scan of every request in flight (many aborts)
            entry = self._child_to_parent.pop(child_id, None)
            if entry is not None:
                entry[1].finish_reason = reason
                if child_id != gone_id:
                    live.append(child_id)
        return live


def _final_only(request: EngineCoreRequest) -> bool:
    """Whether the frontend needs the request's tokens only at its end: one final output, no stop strings
    to watch in its text, no logprobs to collect, no beams."""
    params = request.sampling_params
    return (
        params.output_kind is RequestOutputKind.FINAL_ONLY
        and not params.stop
        and params.logprobs is None
        and params.prompt_logprobs is None
        and request.beam_search is None
    )
