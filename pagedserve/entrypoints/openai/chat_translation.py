"""What the Responses API, Anthropic's Messages API and the Ollama API share: each is a translator over
chat completions. A request becomes a ChatCompletionRequest (always streamed inside, so one path makes both the streamed
and the whole answer, and a cancel can stop it between chunks); its chunks become the API's events."""

import json
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from pagedserve.entrypoints.openai.protocol_chat import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from pagedserve.entrypoints.openai.request_bounds import RequestBounds
from pagedserve.entrypoints.openai.serving_chat import OpenAIServingChat
from pagedserve.entrypoints.openai.tool_parsers.streaming import ToolCallDelta
from pagedserve.errors import InvalidRequestError
from pagedserve.utils.user_json import JsonObject, JsonValue, as_object, as_string

RequestT = TypeVar("RequestT", bound=BaseModel)
ValueT = TypeVar("ValueT")


def named_event(event_type: str, data: Mapping[str, JsonValue]) -> str:
    """One server-sent event with its `event:` line (both APIs name their events)."""
    return f"event: {event_type}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def defined(fields: Mapping[str, ValueT]) -> dict[str, ValueT]:
    """`fields` without the ones left unset (None): the chat request's defaults apply to those."""
    return {key: value for key, value in fields.items() if value is not None}


def json_object(arguments: str) -> JsonObject:
    """A tool call's arguments as an object: {} when they are not a JSON object (cut short by the token
    limit: the finish reason says so)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def renamed(error: InvalidRequestError, names: Mapping[str, str]) -> InvalidRequestError:
    """`error` naming the field as the translated API calls it: the chat request's `messages` is the
    Responses API's `input`, its `max_completion_tokens` the `max_output_tokens`, and so on."""
    param = error.param or ""
    head = param.split(".", 1)[0].split("[", 1)[0]
    if head not in names:
        return error
    sent = names[head]
    message = str(error).replace(head, sent, 1) if head in str(error) else f"{sent}: {error}"
    return InvalidRequestError(message, param=sent + param[len(head) :], status_code=error.status_code)


def chat_request(body: Mapping[str, object], names: Mapping[str, str]) -> ChatCompletionRequest:
    """The translated request as chat completions' model. Raises InvalidRequestError naming the field."""
    return validated(ChatCompletionRequest, body, names)


def validated(model: type[RequestT], body: Mapping[str, object], names: Mapping[str, str]) -> RequestT:
    """The translated request as `model` (chat's, or completions' for Ollama's raw prompts). Raises
    InvalidRequestError naming the field as the caller's API calls it."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise renamed(InvalidRequestError(f"{field}: {first['msg']}.", param=field), names) from exc


async def start_chat(
    chat: OpenAIServingChat,
    bounds: RequestBounds,
    request: ChatCompletionRequest,
    names: Mapping[str, str],
) -> AsyncGenerator[ChatCompletionChunk, None]:
    """The chunks of `request` (streamed, usage in the last). Raises InvalidRequestError naming the field
    as the caller's API calls it, before anything reaches the engine."""
    try:
        bounds.check_chat(request)
        result = await chat.generate(request)
    except InvalidRequestError as error:
        raise renamed(error, names) from error
    assert not isinstance(result, ChatCompletionResponse), "the translated requests are streamed"
    return result


def tool_call_delta(call: JsonObject) -> ToolCallDelta:
    """A chunk's `delta.tool_calls[i]` (ToolCallDelta.to_openai's JSON) read back: both APIs turn it into
    their own call item."""
    index, function = call["index"], as_object(call.get("function"))
    assert isinstance(index, int), "the chat server numbers its calls"
    return ToolCallDelta(
        index,
        as_string(call.get("id")) or None,
        as_string(function.get("name")),
        as_string(function.get("arguments")),
    )


@dataclass
class GrowingText:
    """The text of a streamed block or item, kept in its JSON (`holder[key]`) at each delta, so that what
    was sent so far is there to read without narrowing the JSON back to a string."""

    holder: JsonObject
    key: str
    text: str = ""

    def append(self, delta: str) -> None:
        self.text += delta
        self.holder[self.key] = self.text
