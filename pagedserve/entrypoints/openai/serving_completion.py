"""POST /v1/completions: one or many prompts (text or token ids), n samples each, streamed or not."""

import asyncio
import time
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass, field, replace

from fastapi.responses import StreamingResponse

from pagedserve.engine.async_llm import AsyncLLM
from pagedserve.engine.input_processor import PromptType
from pagedserve.engine.request_options import RequestOptions
from pagedserve.entrypoints.openai.protocol_completion import (
    CompletionChoice,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
)
from pagedserve.entrypoints.openai.served_models import ServedModels
from pagedserve.entrypoints.openai.serving_engine import OpenAIServing, as_http, random_id, usage_info
from pagedserve.entrypoints.utils import merge_async_iterators, started
from pagedserve.errors import InvalidRequestError
from pagedserve.outputs import CompletionOutput, Logprob, RequestOutput
from pagedserve.protocol import EngineCoreRequest
from pagedserve.sampling_params import beam_search_defaults

Logprobs = Sequence[dict[int, Logprob] | None]


@dataclass
class _Batch:
    """One completions request after validation: an engine request per prompt."""

    request: CompletionRequest
    request_id: str
    created: int
    core_requests: list[EngineCoreRequest]
    echo_texts: list[str] | None  # per prompt, when echo is on

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(r.prompt_token_ids) for r in self.core_requests)

    def shown(self, sample: CompletionOutput) -> CompletionOutput:
        """`sample` as the client sees it: with echo and max_tokens 0 (vLLM's prompt scoring), without
        the one token the engine generated."""
        if not self.request.echo_only():
            return sample
        return replace(sample, text="", token_ids=[], logprobs=None if sample.logprobs is None else [])


@dataclass
class _TextOffsets:
    """Where each token of one choice starts in the choice's text, as its text and tokens arrive (the whole
    response at once, or stream deltas). A token's offset is given once the text reaches its start, or when
    the choice ends: text held back in a stream (a stop string may be starting, an incomplete character)
    holds its tokens' logprobs back with it, so a stream's offsets are the full response's."""

    text: str = ""
    position: int = 0  # where the next token starts
    pending: list[tuple[int, dict[int, Logprob] | None]] = field(default_factory=list)

    def add(self, text: str, token_ids: Sequence[int], logprobs: Logprobs) -> None:
        self.text += text
        self.pending += zip(token_ids, logprobs)


def _num_cached(outputs: Iterable[RequestOutput]) -> int | None:
    """The prompts' prefix-cache hits together (None while none is known)."""
    known = [output.num_cached_tokens for output in outputs if output.num_cached_tokens is not None]
    return sum(known) if known else None


def _split_prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[PromptType]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise InvalidRequestError("prompt must not be empty.", param="prompt")
    if isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


class OpenAIServingCompletion(OpenAIServing):
    def __init__(self, engine: AsyncLLM, models: ServedModels) -> None:
        super().__init__(engine, models)
        self._skipped: dict[int, bool] = {}  # token id -> whether skip_special_tokens drops it

    async def create_completion(self, request: CompletionRequest) -> CompletionResponse | StreamingResponse:
        """Raises InvalidRequestError (every prompt is checked before any reaches the engine)."""
        return as_http(await self.generate(request))

    async def generate(
        self, request: CompletionRequest
    ) -> CompletionResponse | AsyncGenerator[CompletionResponse, None]:
        """The whole response, or (stream) its chunks; the Ollama API translates these. Raises
        InvalidRequestError (every prompt is checked before any reaches the engine), and a refusal before
        the first output before the first chunk."""
        lora_request = self.check_model(request.model)
        request.check_supported()
        num_logprobs = request.logprobs
        beam_search = request.beam_search_params()
        params = request.to_sampling_params(
            1 if request.echo_only() else request.max_tokens,  # NOTE: that token is dropped (vLLM's way)
            num_logprobs,
            request.num_prompt_logprobs(),
            None if beam_search else request.best_of,
            beam_search_defaults(self.sampling_defaults) if beam_search else self.sampling_defaults,
        )
        request_id = random_id("cmpl")
        prompts = _split_prompts(request.prompt)

        options = RequestOptions(params, beam_search, request.priority, lora_request)

        def process() -> list[EngineCoreRequest]:
            return [
                self.engine.process_inputs(f"{request_id}-{i}", request.prompt_with_salt(prompt), options)
                for i, prompt in enumerate(prompts)
            ]

        # NOTE: tokenizing in a thread: a huge prompt never holds up the event loop (/health, other requests).
        core_requests = await asyncio.to_thread(process)
        echo_texts = None
        if request.echo:
            echo_texts = [
                prompt
                if isinstance(prompt, str) and request.truncate_prompt_tokens is None
                else self.tokenizer.decode(core.prompt_token_ids, skip_special_tokens=True)
                for prompt, core in zip(prompts, core_requests)
            ]
        batch = _Batch(request, request_id, int(time.time()), core_requests, echo_texts)
        # NOTE: all prompts are admitted or none, before the response starts: a full queue is a 503.
        outputs = merge_async_iterators(*self.engine.submit(core_requests, request.timeout))
        if request.stream:
            # NOTE: started: a refusal before the first output is a status, not an event in a 200 stream.
            return self._chunks(batch, await started(outputs))
        return await self._full(batch, outputs)

    async def _full(
        self, batch: _Batch, outputs: AsyncGenerator[tuple[int, RequestOutput], None]
    ) -> CompletionResponse:
        finals: dict[int, RequestOutput] = {}
        async for prompt_index, output in outputs:
            finals[prompt_index] = output
        choices, num_generated = [], 0
        for prompt_index in sorted(finals):
            output = finals[prompt_index]
            for sample in map(batch.shown, output.outputs):
                num_generated += len(sample.token_ids)
                offsets = _TextOffsets()
                choices.append(self._choice(batch, prompt_index, sample, output.prompt_logprobs, offsets))
        return CompletionResponse(
            id=batch.request_id,
            created=batch.created,
            model=self.response_model(batch.core_requests[0]),
            choices=choices,
            usage=usage_info(batch.num_prompt_tokens, num_generated, _num_cached(finals.values())),
        )

    async def _chunks(
        self, batch: _Batch, outputs: AsyncGenerator[tuple[int, RequestOutput], None]
    ) -> AsyncGenerator[CompletionResponse, None]:
        """Chunks of one choice each; the usage chunk when asked. Closing it early closes `outputs`."""
        n = batch.request.n
        text_offsets = [_TextOffsets() for _ in range(len(batch.core_requests) * n)]
        started = [False] * len(text_offsets)
        prompt_logprobs: dict[int, Logprobs | None] = {}
        num_generated = 0
        latest: dict[int, RequestOutput] = {}  # each prompt's latest output: its prefix-cache hit
        continuous_usage = batch.request.usage_in_every_chunk()
        try:
            async for prompt_index, output in outputs:
                latest[prompt_index] = output
                prompt_logprobs.setdefault(prompt_index, output.prompt_logprobs)
                for sample in map(batch.shown, output.outputs):
                    index = prompt_index * n + sample.index
                    num_generated += len(sample.token_ids)
                    echo = None if started[index] else prompt_logprobs[prompt_index]
                    choice = self._choice(
                        batch, prompt_index, sample, echo, text_offsets[index], first=not started[index]
                    )
                    started[index] = True
                    if not (
                        choice.text or choice.finish_reason or choice.logprobs and choice.logprobs.tokens
                    ):
                        continue  # text held back (a stop string may be starting): nothing to send yet
                    yield CompletionResponse(
                        id=batch.request_id,
                        created=batch.created,
                        model=self.response_model(batch.core_requests[0]),
                        choices=[choice],
                        usage=usage_info(batch.num_prompt_tokens, num_generated, _num_cached(latest.values()))
                        if continuous_usage
                        else None,
                    )
            if batch.request.include_usage_in_stream():
                usage = usage_info(batch.num_prompt_tokens, num_generated, _num_cached(latest.values()))
                yield CompletionResponse(
                    id=batch.request_id,
                    created=batch.created,
                    model=self.response_model(batch.core_requests[0]),
                    choices=[],
                    usage=usage,
                )
        finally:
            await outputs.aclose()

    def _choice(
        self,
        batch: _Batch,
        prompt_index: int,
        sample: CompletionOutput,
        prompt_logprobs: Logprobs | None,
        offsets: _TextOffsets,
        first: bool = True,
    ) -> CompletionChoice:
        """A choice of `sample` (whole, or a delta); the echoed prompt goes first in a choice's first one."""
        text, token_ids = sample.text, sample.token_ids
        logprobs: Logprobs | None = sample.logprobs
        if batch.echo_texts is not None and first:
            text = batch.echo_texts[prompt_index] + text
            token_ids = batch.core_requests[prompt_index].prompt_token_ids + token_ids
            if logprobs is not None:
                logprobs = [*(prompt_logprobs or []), *logprobs]
        request = batch.request
        choice_logprobs = None
        if request.logprobs is not None and logprobs is not None:
            offsets.add(text, token_ids, logprobs)
            choice_logprobs = self._logprobs(
                offsets, sample.finish_reason is not None, request.return_tokens_as_token_ids
            )
        return CompletionChoice(
            index=prompt_index * request.n + sample.index,
            text=text,
            logprobs=choice_logprobs,
            finish_reason=sample.finish_reason,
            stop_reason=sample.stop_reason,
            prompt_logprobs=self.prompt_logprobs(
                batch.core_requests[prompt_index].prompt_token_ids,
                prompt_logprobs,
                request.return_tokens_as_token_ids,
            )
            if request.prompt_logprobs is not None and first
            else None,
        )

    def _logprobs(self, offsets: _TextOffsets, final: bool, as_ids: bool | None) -> CompletionLogProbs:
        """The legacy completions format: per token its text, offset, logprob and the top alternatives
        (the sampled token included), for the tokens of `offsets` whose start the text has reached (every
        one when `final`), taken off its pending ones. The first prompt token has no logprob (None). A
        special token the text left out (skip_special_tokens, or a BOS the tokenizer added) takes no room
        in it. `as_ids`: tokens shown as "token_id:N" (return_tokens_as_token_ids)."""
        text, released = offsets.text, 0
        result = CompletionLogProbs()
        for token_id, entry in offsets.pending:
            if not final and offsets.position >= len(text):
                break
            released += 1
            token = self.token_string(token_id)
            result.tokens.append(self.shown_token(token_id, as_ids))
            result.text_offset.append(min(offsets.position, len(text)))
            if text.startswith(token, offsets.position) or not self._skipped_in_text(token_id):
                offsets.position += len(token)
            if entry is None:
                result.token_logprobs.append(None)
                result.top_logprobs.append(None)
                continue
            result.token_logprobs.append(entry[token_id].logprob if token_id in entry else None)
            result.top_logprobs.append({self.shown_token(t, as_ids): lp.logprob for t, lp in entry.items()})
        del offsets.pending[:released]
        return result

    def _skipped_in_text(self, token_id: int) -> bool:
        """Whether skip_special_tokens drops the token from decoded text (the tokenizer's special tokens,
        and added tokens marked special, which all_special_ids may not list)."""
        skipped = self._skipped.get(token_id)
        if skipped is None:
            skipped = self._skipped[token_id] = not self.tokenizer.decode(
                [token_id], skip_special_tokens=True
            )
        return skipped
