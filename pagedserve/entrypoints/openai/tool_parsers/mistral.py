"""Mistral: `[TOOL_CALLS]` then a JSON array of {"name": ..., "arguments": {...}}."""

from pagedserve.entrypoints.openai.tool_parsers.base import (
    ParsedToolCall,
    ToolParser,
    call_from_json,
    load_json,
)


class MistralToolParser(ToolParser):
    start = "[TOOL_CALLS]"

    def parse_calls(self, tool_text: str) -> list[ParsedToolCall] | None:
        try:
            value = load_json(tool_text[len(self.start) :])
        except ValueError:
            return None
        objects = value if isinstance(value, list) else [value]
        calls = [call for call in map(call_from_json, objects) if call is not None]
        return calls if calls and len(calls) == len(objects) else None
