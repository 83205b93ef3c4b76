"""What every tool parser does: model text -> (content, tool calls), and the same as a stream of deltas.
Whatever the model wrote, a parser never raises: a call's `arguments` are valid JSON, or the text is content."""

import json
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from pagedserve.entrypoints.openai.unicode_text import has_lone_surrogate
from pagedserve.utils.user_json import JsonValue


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


def call_from_json(obj: object, arguments_key: str = "arguments") -> ParsedToolCall | None:
    """{"name": ..., "arguments"/"parameters": {...}} -> a call, or None if `obj` is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or has_lone_surrogate(obj["name"]):
        return None
    arguments = arguments_json(obj.get(arguments_key, obj.get("parameters", obj.get("arguments", {}))))
    return None if arguments is None else ParsedToolCall(obj["name"], arguments)


class ToolParser(ABC):
    """`start`: the text that opens the tool-call part of an output (content before it is plain text).
    Subclasses implement `parse_calls` on the tool-call part; `complete_calls` may return the calls that
    are already closed while the output is still streaming (default: none until the end)."""

    start: str

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
