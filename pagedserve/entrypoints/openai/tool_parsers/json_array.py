"""Formats that write a marker, then every call in one JSON array of {"name": ..., "arguments": {...}}
(Mistral, Granite, Phi-4-mini)."""

from pagedserve.entrypoints.openai.tool_parsers.base import (
    ParsedToolCall,
    ToolParser,
    call_from_json,
    load_json,
)


class JsonArrayToolParser(ToolParser):
    """`start`, then the JSON array (or one call object) up to the end of the output; `parameters` may
    stand for `arguments`. Every element must be a call, or the text is content."""

    def payload(self, tool_text: str) -> str:
        """The JSON text after the marker."""
        return tool_text[len(self.start) :]

    def parse_calls(self, tool_text: str) -> list[ParsedToolCall] | None:
        try:
            value = load_json(self.payload(tool_text))
        except ValueError:
            return None
        objects = value if isinstance(value, list) else [value]
        calls = [call for call in map(call_from_json, objects) if call is not None]
        return calls if calls and len(calls) == len(objects) else None
