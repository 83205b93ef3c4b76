"""What every tool parser does: model text -> (content, tool calls), and the same as a stream of deltas.
Whatever the model wrote, a parser never raises: a call's `arguments` are valid JSON, or the text is content."""

import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

from pagedserve.entrypoints.openai.unicode_text import has_lone_surrogate
from pagedserve.utils.user_json import JsonObject, JsonValue


@dataclass
class ParsedToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI's function.arguments
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


@dataclass
class ExtractedToolCalls:
    """`content`: the text outside the tool calls (None when there is none)."""

    content: str | None
    tool_calls: list[ParsedToolCall]


def load_json(text: str) -> JsonValue:
    """json.loads for text a model wrote: ValueError (never RecursionError) when it is no JSON value."""
    try:
        value: JsonValue = json.loads(text)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc
    return value


def arguments_json(arguments: object) -> str | None:
    """function.arguments as OpenAI sends it: JSON text (a model may emit an object, or a string of JSON).
    None when it is no JSON: text that does not parse, NaN or Infinity (1e999), a value JSON has no form
    for (a Python set or bytes), or a lone surrogate (the "\\ud800" escape)."""
    try:
        if isinstance(arguments, str):
            arguments = load_json(arguments)
        text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return None
    return None if has_lone_surrogate(text) else text


def make_call(name: object, arguments: object, call_id: str | None = None) -> ParsedToolCall | None:
    """A call of function `name` (a non-empty string the model wrote) with `arguments` (a value, or JSON
    text), or None when either is not one (see arguments_json). `call_id`: the id the model gave it."""
    if not isinstance(name, str) or not name or has_lone_surrogate(name):
        return None
    text = arguments_json(arguments)
    if text is None:
        return None
    return ParsedToolCall(name, text) if call_id is None else ParsedToolCall(name, text, call_id)


def call_from_json(obj: object, arguments_key: str = "arguments") -> ParsedToolCall | None:
    """{"name": ..., "arguments"/"parameters": {...}} -> a call, or None if `obj` is not one."""
    if not isinstance(obj, dict):
        return None
    return make_call(obj.get("name"), obj.get(arguments_key, obj.get("parameters", obj.get("arguments", {}))))


class ToolParser(ABC):
    """`start`: the text that opens the tool-call part of an output (content before it is plain text).
    Subclasses implement `parse_calls` on the tool-call part; `complete_calls` may return the calls that
    are already closed while the output is still streaming (default: none until the end). `functions`:
    the request's tools (name -> JSON schema of the parameters), for a format whose arguments are text
    typed by the schema."""

    start: str

    def __init__(self, functions: Mapping[str, JsonObject] | None = None) -> None:
        self.functions: Mapping[str, JsonObject] = functions or {}

    def extract(self, text: str) -> ExtractedToolCalls:
        """The whole output -> content and tool calls. Text that does not parse stays content."""
        index = self.find_start(text)
        if index < 0:
            return ExtractedToolCalls(text, [])
        calls = self.parse_calls(text[index:])
        if calls is None:
            return ExtractedToolCalls(text, [])
        # NOTE: trailing whitespace before the calls is dropped (streaming holds it back the same way).
        return ExtractedToolCalls(text[:index].rstrip() or None, calls)

    def find_start(self, text: str) -> int:
        return text.find(self.start)

    @abstractmethod
    def parse_calls(self, tool_text: str) -> list[ParsedToolCall] | None:
        """The calls in the tool-call part (from `start` on), or None if it is not valid."""

    def complete_calls(self, tool_text: str) -> list[ParsedToolCall]:
        return []
