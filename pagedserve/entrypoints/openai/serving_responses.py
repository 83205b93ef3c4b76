"""POST /v1/responses (and GET / DELETE /v1/responses/{id}, POST .../cancel): the Responses API as a
translator over chat completions (chat_translation.py). `instructions`, the stored conversation of
`previous_response_id` and `input` become the messages; `tools` (function), `tool_choice`,
`parallel_tool_calls`, `text.format`, `reasoning.effort` (chat's `reasoning_effort`),
`max_output_tokens`, `temperature` and `top_p` the chat request's fields."""

import time
from collections.abc import AsyncGenerator

from fastapi.responses import StreamingResponse

from pagedserve.entrypoints.openai.chat_translation import chat_request, start_chat
from pagedserve.entrypoints.openai.errors import exception_message
from pagedserve.entrypoints.openai.protocol_chat import ChatCompletionChunk
from pagedserve.entrypoints.openai.protocol_responses import ResponsesRequest, TextConfig
from pagedserve.entrypoints.openai.request_bounds import RequestBounds
from pagedserve.entrypoints.openai.response_store import ResponseStore, StoredResponse
from pagedserve.entrypoints.openai.responses_events import ResponseBuilder, item_id
from pagedserve.entrypoints.openai.responses_input import input_messages, output_messages
from pagedserve.entrypoints.openai.serving_chat import OpenAIServingChat
from pagedserve.errors import InvalidRequestError
from pagedserve.utils.user_json import JsonObject, JsonValue

# The chat request's fields as the Responses API names them (for errors).
_NAMES = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "chat_template_kwargs": "reasoning",
}


class OpenAIServingResponses:
    def __init__(self, chat: OpenAIServingChat, bounds: RequestBounds, store: ResponseStore) -> None:
        self.chat = chat
        self.bounds = bounds
        self.store = store

    async def create(self, request: ResponsesRequest, scope: str) -> "JsonObject | StreamingResponse":
        """Raises InvalidRequestError naming the field before anything reaches the engine (404 for a
        previous_response_id this key has not stored)."""
        if request.background:
            raise InvalidRequestError(
                "background is not supported: send the request without it (stream it to see progress).",
                param="background",
            )
        conversation: list[JsonObject] = []
        if request.previous_response_id is not None:
            previous = self.store.get(scope, request.previous_response_id, "previous_response_id")
            conversation = list(previous.conversation)
        conversation += input_messages(request.input)
        if not conversation:
            raise InvalidRequestError("input is empty: send a string or a list of items.", param="input")
        instructions: list[JsonObject] = (
            [{"role": "system", "content": request.instructions}] if request.instructions else []
        )
        chunks = await start_chat(
            self.chat,
            self.bounds,
            chat_request(_chat_body(request, instructions + conversation), _NAMES),
            _NAMES,
        )
        response = _response(request, self.chat.model_name)
        stored = StoredResponse(response, conversation)
        if request.store:
            self.store.put(scope, stored.id, stored)  # in progress: GET and /cancel see it
        events = self._run(
            ResponseBuilder(response), chunks, stored, scope if request.store else None, request.stream
        )
        if request.stream:
            return StreamingResponse(events, media_type="text/event-stream")
        async for _ in events:
            pass
        return response

    async def _run(
        self,
        builder: ResponseBuilder,
        chunks: AsyncGenerator[ChatCompletionChunk, None],
        stored: StoredResponse,
        scope: str | None,
        stream: bool,
    ) -> AsyncGenerator[str, None]:
        """The events of the whole response; at the end the stored response (`scope` not None) is
        updated with its output, which a follow-up turn continues. An error ends a stream with
        response.failed, and is raised when not streaming (its status then answers)."""
        for event in builder.start():
            yield event
        try:
            async for chunk in chunks:
                if stored.cancelled.is_set():
                    last = builder.cancel()
                    break
                builder.response["model"] = chunk.model
                for event in builder.feed(chunk):
                    yield event
            else:
                last = builder.finish()
        except Exception as exc:  # e.g. the engine died
            last = builder.fail(exception_message(exc))
            if not stream:
                raise
        finally:
            await chunks.aclose()
        if scope is not None:
            stored.conversation += output_messages(builder.output)
            self.store.put(scope, stored.id, stored)
        for event in last:
            yield event

    def retrieve(self, scope: str, response_id: str) -> JsonObject:
        return self.store.get(scope, response_id).response

    def delete(self, scope: str, response_id: str) -> JsonObject:
        self.store.get(scope, response_id)  # raises the 404
        self.store.delete(scope, response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    def cancel(self, scope: str, response_id: str) -> JsonObject:
        """Stops a response still being generated; it keeps what it made so far. Raises
        InvalidRequestError for one that has ended."""
        stored = self.store.get(scope, response_id)
        if stored.response["status"] != "in_progress":
            raise InvalidRequestError(
                f"Response {response_id!r} has ended (status {stored.response['status']}): only a "
                "response in progress can be cancelled.",
                param="response_id",
            )
        stored.cancelled.set()
        return {**stored.response, "status": "cancelled"}


def _response(request: ResponsesRequest, model: str) -> JsonObject:
    """The Response object before any output."""
    text = request.text or TextConfig()
    return {
        "id": item_id("resp"),
        "object": "response",
        "created_at": time.time(),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": request.instructions,
        "metadata": {**(request.metadata or {})},
        "model": request.model or model,
        "output": [],
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": request.previous_response_id,
        "reasoning": request.reasoning.model_dump() if request.reasoning else None,
        "store": request.store,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "max_output_tokens": request.max_output_tokens,
        "text": {
            "format": text.format.model_dump(by_alias=True, exclude_none=True)
            if text.format
            else {"type": "text"}
        },
        "tool_choice": request.tool_choice or "auto",
        "tools": [*(request.tools or [])],
        "truncation": "disabled",
        "usage": None,
        "user": request.user,
    }


def _chat_body(request: ResponsesRequest, messages: list[JsonObject]) -> JsonObject:
    body: JsonObject = {
        "model": request.model,
        "messages": [*messages],
        "stream": True,
        # NOTE: usage in every chunk: a cancelled response still reports what it used.
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_completion_tokens": request.max_output_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "user": request.user,
        "tools": _chat_tools(request.tools),
        "tool_choice": _chat_tool_choice(request.tool_choice),
        "parallel_tool_calls": request.parallel_tool_calls,
        "response_format": _response_format(request.text),
        "reasoning_effort": request.reasoning.effort if request.reasoning else None,
    }
    return {key: value for key, value in body.items() if value is not None}


def _chat_tools(tools: list[JsonObject] | None) -> list[JsonValue] | None:
    """The Responses API's flat function tools in chat's form ({"type": "function", "function": ...})."""
    if tools is None:
        return None
    converted: list[JsonValue] = []
    for index, tool in enumerate(tools):
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise InvalidRequestError(
                f"tools[{index}] must be {{'type': 'function', 'name': ..., 'parameters': {{...}}}} "
                f"(only function tools are supported), got type {str(tool.get('type'))[:100]!r}.",
                param=f"tools[{index}]",
            )
        function = {
            key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None
        }
        converted.append({"type": "function", "function": function})
    return converted


def _chat_tool_choice(choice: "str | JsonObject | None") -> "str | JsonObject | None":
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise InvalidRequestError(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}.',
            param="tool_choice",
        )
    return {"type": "function", "function": {"name": choice["name"]}}


def _response_format(text: TextConfig | None) -> "JsonObject | None":
    """text.format as chat's response_format."""
    spec = text.format if text else None
    if spec is None or spec.type == "text":
        return None
    if spec.type == "json_object":
        return {"type": "json_object"}
    if spec.schema_ is None:
        raise InvalidRequestError(
            "text.format of type json_schema needs its schema: {'type': 'json_schema', 'name': ..., "
            "'schema': {...}}.",
            param="text.format.schema",
        )
    return {"type": "json_schema", "json_schema": {"name": spec.name or "response", "schema": spec.schema_}}
