"""Mistral: `[TOOL_CALLS]` then a JSON array of {"name": ..., "arguments": {...}}."""
import json

from pagedserve.entrypoints.openai.tool_parsers.base import ParsedToolCall, ToolParser, call_from_json


class MistralToolParser(ToolParser):
    start = "[TOOL_CALLS]"

    def parse_calls(self, tool_text: str) -> list[ParsedToolCall] | None:
        try:
            value = json.loads(tool_text[len(self.start):])
        except json.JSONDecodeError:
            return None
        calls = [call_from_json(obj) for obj in (value if isinstance(value, list) else [value])]
        return None if not calls or None in calls else calls
