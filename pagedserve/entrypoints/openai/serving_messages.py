"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API as a translator over chat
completions (chat_translation.py). `system` and the content blocks become chat messages (`tool_use` an
assistant's tool_calls, `tool_result` tool messages; earlier `thinking` is left out, as chat templates
drop it); `tools`, `tool_choice` (auto / any = required / tool = named / none), `stop_sequences`,
`max_tokens`, `temperature`, `top_p`, `top_k` and `thinking` (the template's `enable_thinking`) the chat
request's fields. The chunks come back as content blocks (text, thinking, tool_use) and stream events."""

import asyncio
import json
from collections.abc import AsyncGenerator

from fastapi.responses import StreamingResponse

from pagedserve.entrypoints.openai.chat_translation import (
    GrowingText,
    chat_request,
    defined,
    json_object,
    named_event,
    start_chat,
    tool_call_delta,
)
from pagedserve.entrypoints.openai.errors import anthropic_error_body, exception_message, exception_status
from pagedserve.entrypoints.openai.protocol_chat import ChatCompletionChunk
from pagedserve.entrypoints.openai.protocol_messages import (
    AnthropicMessage,
    CountTokensRequest,
    MessagesRequest,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from pagedserve.entrypoints.openai.request_bounds import RequestBounds
from pagedserve.entrypoints.openai.responses_events import item_id
from pagedserve.entrypoints.openai.serving_chat import OpenAIServingChat
from pagedserve.entrypoints.openai.tool_parsers.streaming import ToolCallDelta
from pagedserve.errors import InvalidRequestError
from pagedserve.utils.user_json import JsonObject, JsonValue

# The chat request's fields as the Messages API names them (for errors).
_NAMES = {
    "max_completion_tokens": "max_tokens",
    "stop": "stop_sequences",
    "chat_template_kwargs": "thinking",
    "thinking_token_budget": "thinking.budget_tokens",
}
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class AnthropicServingMessages:
    def __init__(self, chat: OpenAIServingChat, bounds: RequestBounds) -> None:
        self.chat = chat
        self.bounds = bounds

    async def create(self, request: MessagesRequest) -> "JsonObject | StreamingResponse":
        """Raises InvalidRequestError naming the field before anything reaches the engine."""
        body = _chat_body(request)
        body |= {
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "max_completion_tokens": request.max_tokens,
            "stop": None if request.stop_sequences is None else [*request.stop_sequences],
            "temperature": request.temperature,
            "top_p": request.top_p,
            "top_k": request.top_k,
            "user": request.metadata.user_id if request.metadata else None,
        }
        budget = request.thinking.budget_tokens if request.thinking else None
        if budget is not None and budget >= request.max_tokens:
            raise InvalidRequestError(
                f"thinking.budget_tokens ({budget}) must be less than max_tokens ({request.max_tokens}).",
                param="thinking.budget_tokens",
            )
        if budget is not None and self.chat.reasoning.enforces_budgets:
            # NOTE: Claude clients send a budget whatever the model: one that does not think (no
            # --reasoning-parser) answers as it would without it, as the chat field would be refused.
            body["thinking_token_budget"] = budget
        chunks = await start_chat(self.chat, self.bounds, chat_request(defined(body), _NAMES), _NAMES)
        builder = MessageBuilder(request.model)
        if request.stream:
            return StreamingResponse(_events(builder, chunks), media_type="text/event-stream")
        try:
            async for chunk in chunks:
                builder.feed(chunk)
        finally:
            await chunks.aclose()
        builder.finish()
        return builder.message

    async def count_tokens(self, request: CountTokensRequest) -> dict[str, int]:
        chat = chat_request(defined(_chat_body(request)), _NAMES)
        self.chat.check_model(chat.model)
        self.bounds.check_chat_template(chat)
        return {"input_tokens": len(await asyncio.to_thread(self.chat.render, chat))}


async def _events(
    builder: "MessageBuilder", chunks: AsyncGenerator[ChatCompletionChunk, None]
) -> AsyncGenerator[str, None]:
    """The stream: message_start, each block's start / deltas / stop, message_delta, message_stop; an
    error midway as Anthropic's `error` event."""
    try:
        async for chunk in chunks:
            for event in builder.feed(chunk):
                yield event
        for event in builder.finish():
            yield event
    except Exception as exc:
        yield named_event("error", anthropic_error_body(exception_message(exc), exception_status(exc)[0]))
    finally:
        await chunks.aclose()


def _chat_body(request: CountTokensRequest) -> JsonObject:
    """The conversation, tools and thinking as chat request fields."""
    messages: list[JsonObject] = []
    if request.system is not None:
        system = request.system if isinstance(request.system, str) else _joined(request.system)
        messages.append({"role": "system", "content": system})
    for message in request.messages:
        messages += _chat_messages(message)
    body: JsonObject = {"model": request.model, "messages": [*messages]}
    if messages and messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
        # Anthropic's prefill: the answer continues the final assistant turn's text.
        body.update(continue_final_message=True, add_generation_prompt=False)
    if request.tools is not None:
        body["tools"] = [
            {
                "type": "function",
                "function": defined(
                    {"name": t.name, "description": t.description, "parameters": t.input_schema}
                ),
            }
            for t in request.tools
        ]
    choice = request.tool_choice
    if choice is not None:
        if choice.type == "tool" and choice.name is None:
            raise InvalidRequestError(
                'tool_choice.name: a tool_choice of type "tool" needs the name of the tool.',
                param="tool_choice.name",
            )
        named: JsonObject = {"type": "function", "function": {"name": choice.name}}
        body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(choice.type, named)
        if choice.disable_parallel_tool_use:
            body["parallel_tool_calls"] = False
    if request.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": request.thinking.type == "enabled"}
    return body


def _chat_messages(message: AnthropicMessage) -> list[JsonObject]:
    """One Anthropic message as chat messages: tool results first (each a tool message), then the text
    (and an assistant's tool calls)."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    results: list[JsonObject] = [
        {"role": "tool", "tool_call_id": block.tool_use_id, "content": _result_text(block)}
        for block in message.content
        if isinstance(block, ToolResultBlock)
    ]
    text = _joined([block for block in message.content if isinstance(block, TextBlock)])
    calls: list[JsonValue] = [
        {
            "id": block.id,
            "type": "function",
            "function": {"name": block.name, "arguments": json.dumps(block.input)},
        }
        for block in message.content
        if isinstance(block, ToolUseBlock)
    ]
    if not text and not calls and results:
        return results
    main: JsonObject = {"role": message.role, "content": (text or None) if calls else text}
    if calls:
        main["tool_calls"] = calls
    return [*results, main]


def _joined(blocks: list[TextBlock]) -> str:
    return "".join(block.text for block in blocks)


def _result_text(block: ToolResultBlock) -> str:
    if block.content is None or isinstance(block.content, str):
        return block.content or ""
    return _joined(block.content)


class MessageBuilder:
    """Chat chunks -> the Message (`message`) and its stream events (returned by each step)."""

    def __init__(self, model: str) -> None:
        self.message: JsonObject = {
            "id": item_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        self.blocks: list[JsonObject] = []  # `message["content"]`, which holds the same blocks
        self.started = False
        self.open: JsonValue = None  # the type of the block receiving deltas
        self.text = GrowingText({}, "text")  # the open text (or thinking) block's text
        self.calls: dict[int, JsonObject] = {}  # chat's tool-call index -> its tool_use block
        self.arguments: dict[int, str] = {}  # chat's tool-call index -> its arguments so far
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None

    def feed(self, chunk: ChatCompletionChunk) -> list[str]:
        events: list[str] = []
        if chunk.usage is not None:
            details = chunk.usage.prompt_tokens_details
            cached = 0 if details is None else details.cached_tokens
            # NOTE: Anthropic's input_tokens leave out what was read from the cache: the prompt is their sum.
            self.message["usage"] = {
                "input_tokens": chunk.usage.prompt_tokens - cached,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": cached,
                "output_tokens": chunk.usage.completion_tokens,
            }
        if not self.started:
            self.started = True
            start = {**self.message, "content": []}
            events.append(named_event("message_start", {"type": "message_start", "message": start}))
        for choice in chunk.choices:
            reasoning = getattr(choice.delta, "reasoning", None)  # with --reasoning-parser
            if reasoning:
                events += self._text("thinking", reasoning)
            if choice.delta.content:
                events += self._text("text", choice.delta.content)
            for call in choice.delta.tool_calls or ():
                events += self._call(tool_call_delta(call))
            if choice.finish_reason is not None:
                self.finish_reason, self.stop_reason = choice.finish_reason, choice.stop_reason
        return events

    def finish(self) -> list[str]:
        events = self._close()
        stop_sequence = self.stop_reason if isinstance(self.stop_reason, str) else None
        reason = "stop_sequence" if stop_sequence else _STOP_REASONS.get(self.finish_reason or "", "end_turn")
        if reason == "end_turn" and self.calls:
            reason = "tool_use"  # a forced (named) call too, which chat reports as "stop"
        self.message.update(stop_reason=reason, stop_sequence=stop_sequence)
        for index, block in self.calls.items():
            block["input"] = json_object(self.arguments[index])
        delta: JsonObject = {"stop_reason": reason, "stop_sequence": stop_sequence}
        # NOTE: the whole usage, as Anthropic's deltas carry it: message_start went out before the engine
        # said what it found in the prefix cache.
        usage = self.message["usage"]
        return [
            *events,
            named_event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}),
            named_event("message_stop", {"type": "message_stop"}),
        ]

    def _start(self, block: JsonObject) -> list[str]:
        events = self._close()
        self.open = block["type"]
        self.blocks.append(block)
        self.message["content"] = [*self.blocks]
        event: JsonObject = {
            "type": "content_block_start",
            "index": len(self.blocks) - 1,
            "content_block": dict(block),
        }
        return [*events, named_event("content_block_start", event)]

    def _delta(self, delta: JsonObject) -> str:
        event: JsonObject = {"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta}
        return named_event("content_block_delta", event)

    def _text(self, kind: str, text: str) -> list[str]:
        """Text of a text block or of a thinking block."""
        events: list[str] = []
        if self.open != kind:
            block: JsonObject = (
                {"type": "text", "text": ""} if kind == "text" else {"type": "thinking", "thinking": ""}
            )
            if kind == "thinking":
                block["signature"] = ""  # nothing signs it: a later turn's thinking is not checked
            events += self._start(block)
            self.text = GrowingText(block, kind)
        self.text.append(text)
        delta: JsonObject = (
            {"type": "text_delta", "text": text}
            if kind == "text"
            else {"type": "thinking_delta", "thinking": text}
        )
        return [*events, self._delta(delta)]

    def _call(self, call: ToolCallDelta) -> list[str]:
        events: list[str] = []
        if call.index not in self.calls:
            block: JsonObject = {
                "type": "tool_use",
                "id": call.id or item_id("toolu"),
                "name": call.name or "",
                "input": {},
            }
            events += self._start(block)
            self.calls[call.index] = block
            self.arguments[call.index] = ""
        if call.arguments:
            self.arguments[call.index] += call.arguments
            events.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
        return events

    def _close(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        event: JsonObject = {"type": "content_block_stop", "index": len(self.blocks) - 1}
        return [named_event("content_block_stop", event)]
