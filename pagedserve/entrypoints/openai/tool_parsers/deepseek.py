"""DeepSeek V3 and V3.1: the calls between `<｜tool▁calls▁begin｜>` and `<｜tool▁calls▁end｜>`, each one
`<｜tool▁call▁begin｜>` ... `<｜tool▁call▁end｜>` (the bars are fullwidth, the spaces U+2581):

- V3: `function<｜tool▁sep｜>NAME` then the arguments in a ```json fenced block;
- V3.1: `NAME<｜tool▁sep｜>{arguments}`."""

from pagedserve.entrypoints.openai.tool_parsers.base import ParsedToolCall, make_call
from pagedserve.entrypoints.openai.tool_parsers.blocks import BlockToolParser

_SEP = "<｜tool▁sep｜>"
_FENCE_OPEN, _FENCE_CLOSE = "```json", "```"


class _DeepSeekBlocks(BlockToolParser):
    start = "<｜tool▁calls▁begin｜>"
    open = "<｜tool▁call▁begin｜>"
    close = "<｜tool▁call▁end｜>"


class DeepSeekV3ToolParser(_DeepSeekBlocks):
    def parse_block(self, body: str) -> ParsedToolCall | None:
        kind, sep, rest = body.partition(_SEP)
        name, _, fenced = rest.partition("\n")
        fenced = fenced.strip()
        if kind.strip() != "function" or not sep or not fenced.startswith(_FENCE_OPEN):
            return None
        if not fenced.endswith(_FENCE_CLOSE) or len(fenced) < len(_FENCE_OPEN) + len(_FENCE_CLOSE):
            return None
        return make_call(name.strip(), fenced[len(_FENCE_OPEN) : -len(_FENCE_CLOSE)])


class DeepSeekV31ToolParser(_DeepSeekBlocks):
    def parse_block(self, body: str) -> ParsedToolCall | None:
        name, sep, arguments = body.partition(_SEP)
        return make_call(name.strip(), arguments) if sep else None
