"""The Responses API's `input` and `instructions` as chat messages: a string is one user message; items
are messages (text parts), `function_call` (an assistant's call), `function_call_output` (a tool
message) and `reasoning` (left out: chat templates drop earlier turns' reasoning). Raises
InvalidRequestError naming `input[i]...` for anything else."""

from pagedserve.errors import InvalidRequestError
from pagedserve.utils.user_json import JsonObject, JsonValue

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text", "text")


def input_messages(items: str | list[JsonObject] | None) -> list[JsonObject]:
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[JsonObject] = []
    for index, item in enumerate(items):
        param = f"input[{index}]"
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, param))
        elif kind == "function_call":
            call: JsonObject = {
                "id": _string(item, "call_id", param),
                "type": "function",
                "function": {
                    "name": _string(item, "name", param),
                    "arguments": _string(item, "arguments", param),
                },
            }
            calls = (
                messages[-1].get("tool_calls") if messages and messages[-1]["role"] == "assistant" else None
            )
            if isinstance(calls, list) and calls:
                calls.append(call)  # parallel calls: one assistant turn
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _text(output, f"{param}.output")
            messages.append(
                {"role": "tool", "tool_call_id": _string(item, "call_id", param), "content": content}
            )
        elif kind != "reasoning":
            raise InvalidRequestError(
                f"{param}.type {str(kind)[:100]!r} is not supported: use message, function_call, "
                "function_call_output or reasoning.",
                param=f"{param}.type",
            )
    return messages


def output_messages(output: list[JsonObject]) -> list[JsonObject]:
    """A response's output items as the chat messages of the next turn."""
    return input_messages([item for item in output if item["type"] != "reasoning"])


def _message(item: JsonObject, param: str) -> JsonObject:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise InvalidRequestError(
            f"{param}.role must be user, assistant, system or developer, got {str(role)[:100]!r}.",
            param=f"{param}.role",
        )
    content = item.get("content")
    text = content if isinstance(content, str) else _text(content, f"{param}.content")
    return {"role": _ROLES[role], "content": text}


def _text(parts: JsonValue, param: str) -> str:
    """The text of a list of content parts (input_text / output_text)."""
    if not isinstance(parts, list):
        raise InvalidRequestError(f"{param} must be a string or a list of text parts.", param=param)
    texts = []
    for index, part in enumerate(parts):
        text = part.get("text") if isinstance(part, dict) and part.get("type") in _TEXT_PARTS else None
        if not isinstance(text, str):
            raise InvalidRequestError(
                f"{param}[{index}] must be {{'type': 'input_text', 'text': ...}} (only text is supported).",
                param=f"{param}[{index}]",
            )
        texts.append(text)
    return "".join(texts)


def _string(item: JsonObject, key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value and key != "arguments":
        raise InvalidRequestError(f"{param}.{key} must be a non-empty string.", param=f"{param}.{key}")
    return value
