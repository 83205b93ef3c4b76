"""IBM Granite 3.0: `<|tool_call|>` then a JSON array of {"name": ..., "arguments": {...}}."""

from pagedserve.entrypoints.openai.tool_parsers.json_array import JsonArrayToolParser


class GraniteToolParser(JsonArrayToolParser):
    start = "<|tool_call|>"
