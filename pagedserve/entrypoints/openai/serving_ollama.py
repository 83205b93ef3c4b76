"""POST /api/chat, /api/generate, /api/embed and /api/embeddings: Ollama's API as a translator over chat
completions (chat_translation.py), completions (a `raw` prompt) and embeddings. Messages, tools and
earlier tool calls become the chat request's; `options`, `format` and `think` its sampling and output
fields (ollama_options.py); its chunks come back as Ollama's NDJSON lines or one object
(ollama_replies.py). `keep_alive` is parsed and checked; holding models is the model manager's."""

import asyncio
import json
import time
from collections.abc import Callable
from typing import Literal

from fastapi.responses import StreamingResponse

from pagedserve.entrypoints.openai.chat_translation import (
    chat_request,
    defined,
    renamed,
    start_chat,
    validated,
)
from pagedserve.entrypoints.openai.ollama_models import OllamaModels
from pagedserve.entrypoints.openai.ollama_options import (
    NAMES,
    context_bound,
    output_fields,
    sampling_fields,
    thinking_switch,
)
from pagedserve.entrypoints.openai.ollama_replies import OllamaReply, answer, loaded
from pagedserve.entrypoints.openai.protocol_completion import CompletionRequest, CompletionResponse
from pagedserve.entrypoints.openai.protocol_ollama import (
    OllamaChatRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaGenerationRequest,
    OllamaMessage,
)
from pagedserve.entrypoints.openai.protocol_pooling import EmbeddingRequest
from pagedserve.entrypoints.openai.request_bounds import RequestBounds
from pagedserve.entrypoints.openai.serving_chat import OpenAIServingChat
from pagedserve.entrypoints.openai.serving_completion import OpenAIServingCompletion
from pagedserve.entrypoints.openai.serving_pooling import OpenAIServingPooling
from pagedserve.errors import InvalidRequestError

# Inside, every answer is streamed with its usage so far (one path for streamed and whole answers).
_STREAMED = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


class OllamaServing:
    def __init__(
        self,
        models: OllamaModels,
        chat: OpenAIServingChat,
        completion: OpenAIServingCompletion,
        pooling: OpenAIServingPooling,
        bounds: RequestBounds,
    ) -> None:
        self.models = models
        self.chat = chat
        self.completion = completion
        self.pooling = pooling
        self.bounds = bounds

    async def chat_reply(self, request: OllamaChatRequest) -> dict[str, object] | StreamingResponse:
        """Raises InvalidRequestError naming the field before anything reaches the engine."""
        started_ns = time.monotonic_ns()
        name = self.models.name(request.model)
        if not request.messages:
            return loaded(request.model, "message")
        messages = [_chat_message(message, f"messages[{i}]") for i, message in enumerate(request.messages)]
        body: dict[str, object] = {"model": name, "messages": messages, "tools": request.tools}
        last = request.messages[-1]
        if last.role == "assistant" and not last.tool_calls:
            # Ollama's prefill: the answer continues the final assistant message.
            body.update(continue_final_message=True, add_generation_prompt=False)
        return await self._chat(request, started_ns, body)

    async def generate(self, request: OllamaGenerateRequest) -> dict[str, object] | StreamingResponse:
        """Raises InvalidRequestError naming the field before anything reaches the engine."""
        started_ns = time.monotonic_ns()
        name = self.models.name(request.model)
        self._check_generate(request)
        if not request.prompt:
            return loaded(request.model, "response")
        if request.raw:
            return await self._raw(request, name, started_ns)
        system = [{"role": "system", "content": request.system}] if request.system else []
        body: dict[str, object] = {
            "model": name,
            "messages": [*system, {"role": "user", "content": request.prompt}],
        }
        return await self._chat(
            request, started_ns, body, {"suffix": request.suffix} if request.suffix else {}
        )

    async def embed(self, request: OllamaEmbedRequest) -> dict[str, object]:
        """Each input's vector, normalized (as Ollama's); `truncate` cuts inputs to the context."""
        started_ns = time.monotonic_ns()
        self.bounds.check_pooling(1 if isinstance(request.input, str) else len(request.input), "input")
        embedding = EmbeddingRequest(
            model=self.models.name(request.model),
            input=request.input,
            dimensions=request.dimensions,
            normalize=True,
            truncate_prompt_tokens=-1 if request.truncate else None,
        )
        try:
            response = await self.pooling.embeddings(embedding)
        except InvalidRequestError as error:
            raise renamed(error, {"truncate_prompt_tokens": "truncate"}) from error
        return {
            "model": request.model,
            "embeddings": [data.embedding for data in response.data],
            "total_duration": time.monotonic_ns() - started_ns,
            "load_duration": 0,
            "prompt_eval_count": response.usage.prompt_tokens,
        }

    async def embeddings(self, request: OllamaEmbeddingsRequest) -> dict[str, object]:
        """The older route: one prompt, its vector as the model pools it (an empty prompt: none)."""
        name = self.models.name(request.model)
        if not request.prompt:
            return {"embedding": []}
        response = await self.pooling.embeddings(EmbeddingRequest(model=name, input=request.prompt))
        return {"embedding": response.data[0].embedding}

    def _check_generate(self, request: OllamaGenerateRequest) -> None:
        refusals = {
            "images": "this model takes no images (vision models are not served yet)",
            "context": "`context` is deprecated: send the conversation to /api/chat",
            "template": "Ollama's Go templates are not run: start the server with --chat-template",
        }
        for field, reason in refusals.items():
            if getattr(request, field):
                raise InvalidRequestError(f"{field}: {reason}.", param=field)
        if request.suffix and "suffix" not in self._template():
            raise InvalidRequestError(
                "suffix: this model's chat template has no fill-in-the-middle slot (`suffix`).",
                param="suffix",
            )
        if request.raw and request.think is not None:
            raise InvalidRequestError(
                "think: a raw prompt skips the chat template, which switches thinking on or off.",
                param="think",
            )

    def _template(self) -> str:
        template = self.chat.chat_template or getattr(self.chat.tokenizer, "chat_template", None)
        return template if isinstance(template, str) else ""

    async def _chat(
        self,
        request: OllamaGenerationRequest,
        started_ns: int,
        body: dict[str, object],
        template_kwargs: dict[str, object] | None = None,
    ) -> dict[str, object] | StreamingResponse:
        """`template_kwargs`: variables for the chat template besides `think`'s switch."""
        kwargs = {
            **(template_kwargs or {}),
            **thinking_switch(request, self.chat.reasoning.parser is not None),
        }
        fields = {
            **sampling_fields(request.options),
            **output_fields(request),
            "chat_template_kwargs": kwargs or None,
        }
        chat = chat_request(defined({**body, **fields, **_STREAMED}), NAMES)
        self.bounds.check_chat_template(chat)
        chat.max_tokens = await self._within_context(
            request, chat.max_tokens, lambda: len(self.chat.render(chat))
        )
        chunks = await start_chat(self.chat, self.bounds, chat, NAMES)
        reply = OllamaReply(request.model, _kind(request), started_ns)
        return await answer(reply, chunks, reply.feed_chat, request.stream)

    async def _within_context(
        self, request: OllamaGenerationRequest, max_tokens: int | None, count_prompt: Callable[[], int]
    ) -> int | None:
        """max_tokens under options.num_ctx. The prompt is counted (in a thread: templating and tokenizing)
        only when num_ctx bounds more than the model's context does."""
        num_ctx = request.options.num_ctx if request.options else None
        if num_ctx is None or num_ctx >= self.chat.max_model_len:
            return max_tokens
        return context_bound(num_ctx, await asyncio.to_thread(count_prompt), max_tokens)

    async def _raw(
        self, request: OllamaGenerateRequest, name: str, started_ns: int
    ) -> dict[str, object] | StreamingResponse:
        """The prompt as it is, through completions (no template)."""
        fields = {"max_tokens": None, **sampling_fields(request.options), **output_fields(request)}
        completion = validated(
            CompletionRequest, {"model": name, "prompt": request.prompt, **_STREAMED, **fields}, NAMES
        )
        try:
            self.bounds.check_completion(completion)
            completion.max_tokens = await self._within_context(
                request,
                completion.max_tokens,
                lambda: len(self.completion.engine.input_processor.tokenize(request.prompt)[1]),
            )
            result = await self.completion.generate(completion)
        except InvalidRequestError as error:
            raise renamed(error, NAMES) from error
        assert not isinstance(result, CompletionResponse), "the translated requests are streamed"
        reply = OllamaReply(request.model, "response", started_ns)
        return await answer(reply, result, reply.feed_completion, request.stream)


def _chat_message(message: OllamaMessage, field: str) -> dict[str, object]:
    """One Ollama message as a chat message: an assistant's tool calls with their arguments as JSON text
    (and ids, which Ollama's have not), a tool message's tool_name as its name."""
    if message.images:
        raise InvalidRequestError(
            f"{field}.images: this model takes no images (vision models are not served yet).",
            param=f"{field}.images",
        )
    chat: dict[str, object] = {"role": message.role, "content": message.content}
    if message.thinking is not None:
        chat["reasoning"] = message.thinking
    if message.tool_calls:
        chat["tool_calls"] = [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": call.function.name, "arguments": json.dumps(call.function.arguments)},
            }
            for i, call in enumerate(message.tool_calls)
        ]
    if message.tool_name is not None:
        chat["name"] = message.tool_name
    return chat


def _kind(request: OllamaGenerationRequest) -> Literal["message", "response"]:
    return "message" if isinstance(request, OllamaChatRequest) else "response"
