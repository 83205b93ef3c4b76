"""Llama 3.x JSON tool calls: the output is `{"name": ..., "parameters": {...}}` (optionally after
`<|python_tag|>`), several separated by `;`."""

import json

from pagedserve.entrypoints.openai.tool_parsers.base import ParsedToolCall, ToolParser, call_from_json

_PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    start = _PYTHON_TAG  # what streaming holds back while it may be arriving; `{` is found by find_start

    def find_start(self, text: str) -> int:
        """Only an output that *is* tool calls: it starts (after whitespace) with the tag or with `{`."""
        stripped = text.lstrip()
        offset = len(text) - len(stripped)
        return offset if stripped.startswith((_PYTHON_TAG, "{")) else -1

    def parse_calls(self, tool_text: str) -> list[ParsedToolCall] | None:
        text = tool_text.strip().removeprefix(_PYTHON_TAG).strip()
        decoder, calls, index = json.JSONDecoder(), [], 0
        while index < len(text):
            try:
                obj, index = decoder.raw_decode(text, index)
            except (ValueError, RecursionError):  # not JSON, or nested past Python's recursion limit
                return None
            call = call_from_json(obj, arguments_key="parameters")
            if call is None:
                return None
            calls.append(call)
            index = _skip_separator(text, index)
        return calls or None


def _skip_separator(text: str, index: int) -> int:
    while index < len(text) and text[index] in " \t\n;":
        index += 1
    return index
