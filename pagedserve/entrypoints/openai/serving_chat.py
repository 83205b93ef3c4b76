"""POST /v1/chat/completions: a conversation through the chat template, n samples, streamed or not."""

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi.responses import StreamingResponse

from pagedserve.engine.async_llm import AsyncLLM
from pagedserve.engine.request_options import RequestOptions
from pagedserve.entrypoints.chat_utils import (
    ContentFormat,
    apply_chat_template,
    image_placeholder,
    normalize_messages,
    resolve_content_format,
    with_images,
)
from pagedserve.entrypoints.openai.chat_reasoning import ChatReasoning, OutputSplit
from pagedserve.entrypoints.openai.chat_tools import ChatTools, ToolStreamer, resolve_chat_tools
from pagedserve.entrypoints.openai.harmony_chat import HarmonyChat
from pagedserve.entrypoints.openai.protocol import CompletionTokensDetails, UsageInfo
from pagedserve.entrypoints.openai.protocol_chat import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatResponseMessage,
    ChatStreamChoice,
    ChatTemplateRequest,
    ChatTokenLogprob,
    DeltaMessage,
    TopLogprob,
)
from pagedserve.entrypoints.openai.served_models import ServedModels
from pagedserve.entrypoints.openai.serving_engine import (
    MIN_LOGPROB,
    OpenAIServing,
    as_http,
    random_id,
    usage_info,
)
from pagedserve.entrypoints.openai.tool_parsers.streaming import ToolCallDelta
from pagedserve.entrypoints.utils import started
from pagedserve.errors import InvalidRequestError
from pagedserve.outputs import CompletionOutput, RequestOutput
from pagedserve.protocol import EngineCoreRequest
from pagedserve.sampling_params import SamplingParams


class OpenAIServingChat(OpenAIServing):
    def __init__(
        self,
        engine: AsyncLLM,
        models: ServedModels,
        chat_template: str | None,
        tool_call_parser: str | None = None,
        content_format: ContentFormat = "auto",
    ) -> None:
        """`tool_call_parser`: set with --enable-auto-tool-choice; None: tool_choice "auto" is refused.
        `content_format`: --chat-template-content-format."""
        super().__init__(engine, models)
        self.chat_template = chat_template
        self.tool_call_parser = tool_call_parser
        template = chat_template or getattr(self.tokenizer, "chat_template", None)
        self.content_format = resolve_content_format(
            content_format, template if isinstance(template, str) else None
        )
        # NOTE: a harmony model (gpt-oss) renders and reads its chats through openai-harmony, not a template.
        self.harmony = HarmonyChat.of(engine.config, tool_call_parser)
        harmony_encoding = None if self.harmony is None else self.harmony.encoding
        self.reasoning = ChatReasoning(engine.config.reasoning, self.tokenizer, harmony_encoding)
        self.image_placeholder = image_placeholder(self.tokenizer, engine.config.model.multimodal)

    def render(self, request: ChatTemplateRequest) -> list[int]:
        """The prompt token ids of a request's conversation. Raises InvalidRequestError."""
        if self.harmony is not None:
            return self.harmony.render(request)
        return apply_chat_template(
            self.tokenizer,
            normalize_messages(
                [m.model_dump() for m in request.messages or ()], self.content_format, self.image_placeholder
            ),
            self.chat_template,
            request.add_generation_prompt,
            request.tools,
            continue_final_message=request.continue_final_message,
            documents=request.documents,
            template_kwargs=request.template_variables(),
        )

    async def create_chat_completion(
        self, request: ChatCompletionRequest
    ) -> ChatCompletionResponse | StreamingResponse:
        """Raises InvalidRequestError before anything reaches the engine."""
        return as_http(await self.generate(request))

    async def generate(
        self, request: ChatCompletionRequest
    ) -> ChatCompletionResponse | AsyncGenerator[ChatCompletionChunk, None]:
        """The whole response, or (stream) its chunks; the Responses and Messages APIs translate these.
        Raises InvalidRequestError before anything reaches the engine, and a refusal before the first
        output (a full queue, a dead engine) before the first chunk."""
        lora_request = self.check_model(request.model)
        request.check_supported()
        tools = resolve_chat_tools(
            request.tools,
            request.tool_choice,
            self.tool_call_parser,
            request.parallel_tool_calls is not False,
        )
        request_id = random_id("chatcmpl")

        def process() -> EngineCoreRequest:
            params = self._sampling_params(request, tools)
            prompt_ids = self.render(request)
            options = RequestOptions(params, priority=request.priority, lora_request=lora_request)
            prompt = with_images(
                request.prompt_with_salt(prompt_ids), [m.model_dump() for m in request.messages or ()]
            )
            return self.engine.process_inputs(request_id, prompt, options)

        try:
            # NOTE: templating and tokenizing in a thread: a huge conversation never holds up the event loop.
            core = await asyncio.to_thread(process)
        except InvalidRequestError as error:
            raise request.named_as_sent(error) from error
        # NOTE: admitted before the response starts: a full queue is a 503, not a broken stream.
        (outputs,) = self.engine.submit([core], request.timeout)
        if request.stream:
            # NOTE: started: a refusal before the first output is a status, not an event in a 200 stream.
            return self._chunks(request, request_id, core, tools, await started(outputs))
        return await self._full(request, request_id, core, tools, outputs)

    def _sampling_params(self, request: ChatCompletionRequest, tools: ChatTools) -> SamplingParams:
        """The request's sampling parameters (max_completion_tokens over the deprecated max_tokens); a
        required or named tool_choice becomes the output's constraint."""
        max_tokens = request.max_completion_tokens
        if max_tokens is None:
            max_tokens = request.max_tokens
        params = request.to_sampling_params(
            max_tokens, request.num_logprobs(), request.prompt_logprobs, defaults=self.sampling_defaults
        )
        if self.harmony is not None:
            params = self.harmony.with_stop_tokens(params)
        if tools.constraint is None:
            return params
        if params.structured_outputs is not None:
            raise InvalidRequestError(
                "A required or named tool_choice constrains the output already: drop "
                "response_format / structured_outputs.",
                param="tool_choice",
            )
        return replace(params, structured_outputs=tools.constraint)

    async def _full(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        core: EngineCoreRequest,
        tools: ChatTools,
        outputs: AsyncIterator[RequestOutput],
    ) -> ChatCompletionResponse:
        """The whole response, once the request has finished: a choice per sample, usage, prompt logprobs."""
        final: RequestOutput | None = None
        async for output in outputs:  # FINAL_ONLY: one output, the finished one
            final = output
        assert final is not None, "a request ends with its final output"
        samples = final.outputs
        splits = [self.reasoning.sample(core.prompt_token_ids) for _ in samples]
        choices = [self._choice(request, tools, sample, split) for sample, split in zip(samples, splits)]
        num_generated = sum(len(s.token_ids) for s in samples)
        usage = self._usage(len(core.prompt_token_ids), num_generated, splits, final.num_cached_tokens)
        return ChatCompletionResponse(
            id=request_id,
            model=self.response_model(core),
            choices=choices,
            usage=usage,
            prompt_logprobs=self.prompt_logprobs(
                core.prompt_token_ids, final.prompt_logprobs, request.return_tokens_as_token_ids
            ),
        )

    def _usage(
        self,
        num_prompt_tokens: int,
        num_generated: int,
        splits: list[OutputSplit | None],
        num_cached_tokens: int | None,
    ) -> UsageInfo:
        """Usage, with the samples' reasoning tokens under a reasoning parser."""
        usage = usage_info(num_prompt_tokens, num_generated, num_cached_tokens)
        if self.reasoning.reports_reasoning:
            num_reasoning = sum(split.num_reasoning_tokens for split in splits if split is not None)
            usage.completion_tokens_details = CompletionTokensDetails(reasoning_tokens=num_reasoning)
        return usage

    def _choice(
        self,
        request: ChatCompletionRequest,
        tools: ChatTools,
        sample: CompletionOutput,
        split: OutputSplit | None,
    ) -> ChatChoice:
        """A finished sample as a choice: its reasoning split off (with a reasoning parser), the rest
        parsed for tool calls when tools are on."""
        reasoning, content = None, sample.text
        if split is not None:
            reasoning, content = split.feed(sample.text, sample.token_ids, finished=True)
            reasoning = reasoning if split.thought and request.include_reasoning else None
        result = tools.output(content, sample.finish_reason)
        message = ChatResponseMessage(
            content=result.content,
            reasoning=reasoning,
            reasoning_content=reasoning,
            tool_calls=[
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in result.tool_calls
            ],
        )
        return ChatChoice(
            index=sample.index,
            message=message,
            logprobs=self._logprobs(request, sample),
            finish_reason=result.finish_reason,
            stop_reason=sample.stop_reason,
        )

    async def _chunks(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        core: EngineCoreRequest,
        tools: ChatTools,
        outputs: AsyncGenerator[RequestOutput, None],
    ) -> AsyncGenerator[ChatCompletionChunk, None]:
        """First a role chunk per choice, then content (or tool-call) deltas, the finish reason with the
        last one. Closing it early closes `outputs` (the request is aborted)."""
        created = int(time.time())
        num_prompt_tokens = len(core.prompt_token_ids)
        num_generated, num_cached_tokens = 0, None
        continuous_usage = request.usage_in_every_chunk()

        splits = [self.reasoning.sample(core.prompt_token_ids) for _ in range(request.n)]

        def chunk(choices: list[ChatStreamChoice], with_usage: bool) -> ChatCompletionChunk:
            usage = (
                self._usage(num_prompt_tokens, num_generated, splits, num_cached_tokens)
                if with_usage
                else None
            )
            return ChatCompletionChunk(
                id=request_id, created=created, model=self.response_model(core), choices=choices, usage=usage
            )

        streamers: list[ToolStreamer | None] = [tools.streamer() for _ in range(request.n)]
        try:
            for index in range(request.n):
                role = ChatStreamChoice(index=index, delta=DeltaMessage(role="assistant", content=""))
                yield chunk([role], continuous_usage)
            async for output in outputs:
                num_cached_tokens = output.num_cached_tokens
                for sample in output.outputs:
                    num_generated += len(sample.token_ids)
                    logprobs = self._logprobs(request, sample)
                    delta, finish_reason = self._delta(
                        request, tools, streamers[sample.index], splits[sample.index], sample
                    )
                    if delta is None and sample.finish_reason is None and logprobs is None:
                        continue  # text held back (a stop string or a tool call may be starting)
                    choice = ChatStreamChoice(
                        index=sample.index,
                        delta=delta or DeltaMessage(content=""),
                        logprobs=logprobs,
                        finish_reason=finish_reason,
                        stop_reason=sample.stop_reason,
                    )
                    yield chunk([choice], continuous_usage)
            if request.include_usage_in_stream():
                yield chunk([], True)
        finally:
            await outputs.aclose()

    @staticmethod
    def _delta(
        request: ChatCompletionRequest,
        tools: ChatTools,
        streamer: ToolStreamer | None,
        split: OutputSplit | None,
        sample: CompletionOutput,
    ) -> tuple[DeltaMessage | None, str | None]:
        """This output's delta (None: nothing to send yet) and finish reason. With a reasoning parser the
        reasoning is split off first; only the content goes on to the tool-call parser."""
        finished = sample.finish_reason is not None
        reasoning, text = "", sample.text
        if split is not None:
            reasoning, text = split.feed(sample.text, sample.token_ids, finished)
            reasoning = reasoning if request.include_reasoning else ""
        calls: list[ToolCallDelta] = []
        if streamer is None:
            content, finish_reason = text, sample.finish_reason
        else:
            content, calls = streamer.feed(text, finished)
            finish_reason = tools.finish_reason(sample.finish_reason, streamer.has_tool_calls)
        if not content and not calls and not reasoning:
            return None, finish_reason
        return DeltaMessage(
            content=content or None,
            reasoning=reasoning or None,
            reasoning_content=reasoning or None,
            tool_calls=[c.to_openai() for c in calls] or None,
        ), finish_reason

    def _logprobs(self, request: ChatCompletionRequest, sample: CompletionOutput) -> ChatLogprobs | None:
        """Per generated token: its logprob and the `top_logprobs` most likely tokens."""
        if not request.logprobs or sample.logprobs is None:
            return None
        num_top = request.top_logprobs or 0
        as_ids = request.return_tokens_as_token_ids
        content = []
        for token_id, entry in zip(sample.token_ids, sample.logprobs):
            top = sorted(entry.items(), key=lambda item: item[1].logprob, reverse=True)[:num_top]
            content.append(
                ChatTokenLogprob(
                    **self._top(token_id, entry[token_id].logprob, as_ids),
                    top_logprobs=[TopLogprob(**self._top(t, v.logprob, as_ids)) for t, v in top],
                )
            )
        return ChatLogprobs(content=content)

    def _top(self, token_id: int, logprob: float, as_ids: bool | None) -> dict[str, Any]:
        token = self.shown_token(token_id, as_ids)
        return {"token": token, "logprob": max(logprob, MIN_LOGPROB), "bytes": list(token.encode("utf-8"))}
