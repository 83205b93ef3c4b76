"""Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call."""

from pagedserve.entrypoints.openai.tool_parsers.base import (
    ParsedToolCall,
    ToolParser,
    call_from_json,
    load_json,
)

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    start = _OPEN

    def parse_calls(self, tool_text: str) -> list[ParsedToolCall] | None:
        calls = self.complete_calls(tool_text)
        last_open = tool_text.rfind(_OPEN)
        if last_open > tool_text.rfind(_CLOSE):
            # NOTE: the output ended inside a block (EOS before the closing tag): its call counts if whole.
            call = _json_call(tool_text[last_open + len(_OPEN) :])
            if call is not None:
                calls.append(call)
        return calls or None

    def complete_calls(self, tool_text: str) -> list[ParsedToolCall]:
        calls = [_json_call(body) for body in _closed_blocks(tool_text)]
        return [call for call in calls if call is not None]


def _closed_blocks(text: str) -> list[str]:
    """The text inside each closed block. NOTE: found with str.find, in linear time: a regex with `\\s*`
    around `(.*?)` backtracks in cubic time over a block of whitespace (minutes for 8000 spaces)."""
    blocks, start = [], text.find(_OPEN)
    while start >= 0:
        end = text.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            break
        blocks.append(text[start + len(_OPEN) : end])
        start = text.find(_OPEN, end + len(_CLOSE))
    return blocks


def _json_call(body: str) -> ParsedToolCall | None:
    try:
        return call_from_json(load_json(body.strip()))
    except ValueError:
        return None
