"""Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call."""

from pagedserve.entrypoints.openai.tool_parsers.base import ParsedToolCall, call_from_json, load_json
from pagedserve.entrypoints.openai.tool_parsers.blocks import BlockToolParser


class HermesToolParser(BlockToolParser):
    start = open = "<tool_call>"
    close = "</tool_call>"

    def parse_block(self, body: str) -> ParsedToolCall | None:
        try:
            return call_from_json(load_json(body.strip()))
        except ValueError:
            return None
