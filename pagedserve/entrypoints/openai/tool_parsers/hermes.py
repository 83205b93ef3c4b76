"""Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call."""

import json
import re

from pagedserve.entrypoints.openai.tool_parsers.base import ParsedToolCall, ToolParser, call_from_json

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class HermesToolParser(ToolParser):
    start = "<tool_call>"

    def parse_calls(self, tool_text: str) -> list[ParsedToolCall] | None:
        calls = self.complete_calls(tool_text)
        last_open = tool_text.rfind(self.start)
        if last_open > tool_text.rfind("</tool_call>"):
            # NOTE: the output ended inside a block (EOS before the closing tag): its call counts if whole.
            call = _json_call(tool_text[last_open + len(self.start) :])
            if call is not None:
                calls.append(call)
        return calls or None

    def complete_calls(self, tool_text: str) -> list[ParsedToolCall]:
        calls = [_json_call(body) for body in _BLOCK.findall(tool_text)]
        return [call for call in calls if call is not None]


def _json_call(body: str) -> ParsedToolCall | None:
    try:
        return call_from_json(json.loads(body))
    except json.JSONDecodeError:
        return None
