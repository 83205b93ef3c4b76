"""EngineCoreOutputs -> RequestOutputs: detokenize, apply stop strings, gather the n samples."""
import time
from dataclasses import dataclass, field
from typing import Any

from pagedserve.engine.detokenizer import IncrementalDetokenizer
from pagedserve.outputs import CompletionOutput, RequestOutput
from pagedserve.protocol import EngineCoreOutput, FinishReason
from pagedserve.sampling_params import SamplingParams


@dataclass
class SampleState:
    """One of a request's n samples (one engine-core request each)."""

    index: int
    detokenizer: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def completion(self) -> CompletionOutput:
        return CompletionOutput(self.index, self.detokenizer.output_text, list(self.token_ids),
                                self.cumulative_logprob, self.logprobs, self.finish_reason, self.stop_reason)


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    samples: list[SampleState]
    arrival_time: float
    prompt_logprobs: list[dict[int, float] | None] | None = None
    first_token_time: float | None = None

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.samples)

    def to_output(self) -> RequestOutput:
        metrics = {"arrival_time": self.arrival_time}
        if self.first_token_time is not None:
            metrics["first_token_time"] = self.first_token_time
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, self.prompt_logprobs,
                             [s.completion() for s in self.samples], self.finished, metrics)


def child_request_id(request_id: str, index: int, n: int) -> str:
    return request_id if n == 1 else f"{index}_{request_id}"


class OutputProcessor:
    """Tracks every request in flight on the frontend side."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.requests: dict[str, RequestState] = {}
        self.child_to_parent: dict[str, tuple[RequestState, SampleState]] = {}

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, arrival_time: float) -> list[str]:
        """Register a request; returns the engine-core ids of its n samples."""
        samples = [SampleState(i, IncrementalDetokenizer(self.tokenizer, prompt_token_ids,
                                                         params.skip_special_tokens, params.stop_strings,
                                                         params.include_stop_str_in_output),
                               logprobs=[] if params.logprobs is not None else None,
                               cumulative_logprob=0.0 if params.logprobs is not None else None)
                   for i in range(params.n)]
        state = RequestState(request_id, prompt, prompt_token_ids, samples, arrival_time,
                             [] if params.prompt_logprobs is not None else None)
        self.requests[request_id] = state
        child_ids = [child_request_id(request_id, i, params.n) for i in range(params.n)]
        for child_id, sample in zip(child_ids, samples):
            self.child_to_parent[child_id] = (state, sample)
        return child_ids

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        """Returns the updated requests and the engine-core ids to abort (stopped by a stop string)."""
        updated: dict[str, RequestState] = {}
        to_abort: list[str] = []
        now = time.time()
        for output in outputs:
            entry = self.child_to_parent.get(output.request_id)
            if entry is None:
                continue
            state, sample = entry
            if output.new_token_ids and state.first_token_time is None:
                state.first_token_time = now
            if output.prompt_logprobs is not None and sample.index == 0 and state.prompt_logprobs is not None:
                state.prompt_logprobs.extend(output.prompt_logprobs)
            sample.token_ids.extend(output.new_token_ids)
            for logprobs in output.new_logprobs or []:
                sample.logprobs.append(logprobs)
                sample.cumulative_logprob += next(iter(logprobs.values()))
            stop = sample.detokenizer.update(output.new_token_ids)
            if stop is not None and not output.finished:
                sample.finish_reason, sample.stop_reason = "stop", stop
                to_abort.append(output.request_id)
            elif output.finish_reason is not None:
                sample.finish_reason, sample.stop_reason = str(output.finish_reason), output.stop_reason
                if stop is not None:
                    sample.finish_reason, sample.stop_reason = "stop", stop
            if sample.finish_reason is not None:
                del self.child_to_parent[output.request_id]
            updated[state.request_id] = state
        results = [state.to_output() for state in updated.values()]
        for state in updated.values():
            if state.finished:
                del self.requests[state.request_id]
        return results, to_abort

    def abort_request(self, request_id: str) -> list[str]:
        """Forget a request; returns the engine-core ids still to abort."""
        state = self.requests.pop(request_id, None)
        if state is None:
            return []
        child_ids = [cid for cid, (parent, _) in self.child_to_parent.items() if parent is state]
        for child_id in child_ids:
            self.child_to_parent[child_id][1].finish_reason = str(FinishReason.ABORT)
            del self.child_to_parent[child_id]
        return child_ids
