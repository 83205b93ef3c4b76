"""Formats that write each call as a block between an open and a close marker (Hermes, Qwen3-Coder,
DeepSeek, Kimi K2): the shared scan, in linear time, and resumed where the last one ended while the
output streams."""

from abc import abstractmethod
from collections.abc import Mapping

from pagedserve.entrypoints.openai.tool_parsers.base import ParsedToolCall, ToolParser
from pagedserve.utils.user_json import JsonObject


class BlockToolParser(ToolParser):
    """`start`: what opens the tool-call part; `open` / `close`: what encloses each call (after `start`,
    or `start` itself). Subclasses implement `parse_block` on the text inside one block. A block that does
    not parse is skipped; an output that ends inside a block (EOS before its close marker) keeps that call
    if its text parses whole."""

    open: str
    close: str

    def __init__(self, functions: Mapping[str, JsonObject] | None = None) -> None:
        super().__init__(functions)
        # NOTE: a streamed output grows between reads: each read resumes where the last one stopped (the
        # calls of the blocks closed so far, the block still open), so a stream is scanned once overall,
        # not once per delta. A text that does not extend the last one is read from its start.
        self._read = ""  # the last text read (a reference: no copy)
        self._calls: list[ParsedToolCall] = []  # of its closed blocks
        self._closed_end = 0  # where its last closed block ends
        self._open_block = -1  # where its unclosed block starts (-1: none)

    @abstractmethod
    def parse_block(self, body: str) -> ParsedToolCall | None:
        """The call in one block's text, or None if it is not one."""

    def parse_calls(self, tool_text: str) -> list[ParsedToolCall] | None:
        calls = self.complete_calls(tool_text)
        last_open = tool_text.rfind(self.open)
        if last_open >= self._closed_end:  # after the last closed block: the output ended inside it
            call = self.parse_block(tool_text[last_open + len(self.open) :])
            if call is not None:
                calls.append(call)
        return calls or None

    def complete_calls(self, tool_text: str) -> list[ParsedToolCall]:
        if not tool_text.startswith(self._read):
            self._read, self._calls, self._closed_end, self._open_block = "", [], 0, -1
        # NOTE: a marker may straddle the end of the last text read: the searches resume just before it.
        open_from = max(self._closed_end, len(self._read) - len(self.open) + 1)
        start = self._open_block if self._open_block >= 0 else tool_text.find(self.open, open_from)
        while start >= 0:
            # NOTE: str.find, not a regex: `\s*(.*?)\s*` backtracks in cubic time over a block of spaces.
            close_from = max(start + len(self.open), len(self._read) - len(self.close) + 1)
            end = tool_text.find(self.close, close_from)
            if end < 0:
                break
            call = self.parse_block(tool_text[start + len(self.open) : end])
            if call is not None:
                self._calls.append(call)
            self._closed_end = end + len(self.close)
            start = tool_text.find(self.open, self._closed_end)
        self._read, self._open_block = tool_text, start
        return list(self._calls)
