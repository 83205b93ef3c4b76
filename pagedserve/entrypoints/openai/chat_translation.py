"""What the Responses API, Anthropic's Messages API and the Ollama API share: each is a translator over
chat completions. A request becomes a ChatCompletionRequest (always streamed inside, so one path makes both the streamed
and the whole answer, and a cancel can stop it between chunks); its chunks become the API's events."""

import json
from collections.abc import AsyncGenerator, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from pagedserve.entrypoints.openai.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from pagedserve.entrypoints.openai.request_bounds import RequestBounds
from pagedserve.entrypoints.openai.serving_chat import OpenAIServingChat
from pagedserve.errors import InvalidRequestError

RequestT = TypeVar("RequestT", bound=BaseModel)


def named_event(event_type: str, data: Mapping[str, Any]) -> str:
    """One server-sent event with its `event:` line (both APIs name their events)."""
    return f"event: {event_type}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def defined(fields: dict[str, object]) -> dict[str, object]:
    """`fields` without the ones left unset (None): the chat request's defaults apply to those."""
    return {key: value for key, value in fields.items() if value is not None}


def json_object(arguments: str) -> dict[str, object]:
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


def chat_request(body: dict[str, Any], names: Mapping[str, str]) -> ChatCompletionRequest:
    """The translated request as chat completions' model. Raises InvalidRequestError naming the field."""
    return validated(ChatCompletionRequest, body, names)


def validated(model: type[RequestT], body: dict[str, Any], names: Mapping[str, str]) -> RequestT:
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
