"""Kimi K2: `<|tool_calls_section_begin|>`, then per call `<|tool_call_begin|>functions.NAME:INDEX
<|tool_call_argument_begin|>{arguments}<|tool_call_end|>`, then `<|tool_calls_section_end|>`. The call's
id is what the model wrote before its arguments (`functions.NAME:INDEX`), as vLLM returns it: Kimi's chat
template writes it back with the tool's result."""

import re

from pagedserve.entrypoints.openai.tool_parsers.base import ParsedToolCall, make_call
from pagedserve.entrypoints.openai.tool_parsers.blocks import BlockToolParser

_ARGUMENTS = "<|tool_call_argument_begin|>"
_CALL_ID = re.compile(r"(?:functions\.)?([\w.\-]+):\d+")


class KimiK2ToolParser(BlockToolParser):
    start = "<|tool_calls_section_begin|>"
    open = "<|tool_call_begin|>"
    close = "<|tool_call_end|>"

    def parse_block(self, body: str) -> ParsedToolCall | None:
        call_id, sep, arguments = body.partition(_ARGUMENTS)
        call_id = call_id.strip()
        match = _CALL_ID.fullmatch(call_id)
        return make_call(match.group(1), arguments, call_id) if sep and match else None
