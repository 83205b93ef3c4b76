"""Mistral: `[TOOL_CALLS]` then a JSON array of {"name": ..., "arguments": {...}}."""

from pagedserve.entrypoints.openai.tool_parsers.json_array import JsonArrayToolParser


class MistralToolParser(JsonArrayToolParser):
    start = "[TOOL_CALLS]"
