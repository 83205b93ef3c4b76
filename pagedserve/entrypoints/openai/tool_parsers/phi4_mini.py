"""Phi-4-mini: `functools[` then the rest of a JSON array of {"name": ..., "arguments": {...}}, as its chat
template asks (`functools[{"name": "f", "arguments": {...}}, ...]`)."""

from pagedserve.entrypoints.openai.tool_parsers.json_array import JsonArrayToolParser


class Phi4MiniJsonToolParser(JsonArrayToolParser):
    # NOTE: with its bracket: a mention of Python's functools in the prose stays content and streams.
    start = "functools["

    def payload(self, tool_text: str) -> str:
        return tool_text[len(self.start) - 1 :]
