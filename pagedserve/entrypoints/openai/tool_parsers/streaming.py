"""A tool parser over a stream: text deltas in, content deltas and OpenAI-style tool-call deltas out.
Reassembled, they equal `ToolParser.extract` of the whole text."""

from dataclasses import dataclass

from pagedserve.entrypoints.openai.tool_parsers.base import ParsedToolCall, ToolParser


@dataclass
class ToolCallDelta:
    """`delta.tool_calls[i]`, one entry per call index in a chunk (as OpenAI sends them: clients such as
    instructor read only `tool_calls[0]`). A call's first carries its id and name with the arguments so
    far, the next ones more arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, object]:
        function = (
            {"arguments": self.arguments}
            if self.name is None
            else {"name": self.name, "arguments": self.arguments}
        )
        delta: dict[str, object] = {"index": self.index, "function": function}
        if self.id is not None:
            delta.update(id=self.id, type="function")
        return delta


def call_delta(index: int, call: ParsedToolCall) -> ToolCallDelta:
    """A whole call as the one entry of its index."""
    return ToolCallDelta(index, call.id, call.name, call.arguments)


class ToolCallStreamer:
    """Content streams until the parser's start marker (a possible beginning of it, and trailing
    whitespace, are held back); after it, each call goes out as soon as the parser sees it closed, the
    rest when the output ends. If the tool part never parses, it goes out as content at the end."""

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.text = ""
        self.num_content_sent = 0
        self.num_calls_sent = 0

    def feed(self, delta: str, finished: bool) -> tuple[str, list[ToolCallDelta]]:
        self.text += delta
        start = self.parser.find_start(self.text)
        if finished:
            return self._finish(start)
        if start < 0:
            end = len(self.text) - _partial_marker_length(self.text, self.parser.start)
            return self._content_until(len(self.text[:end].rstrip())), []
        content = self._content_until(len(self.text[:start].rstrip()))
        return content, self._new_calls(self.parser.complete_calls(self.text[start:]))

    @property
    def has_tool_calls(self) -> bool:
        return self.num_calls_sent > 0

    def _finish(self, start: int) -> tuple[str, list[ToolCallDelta]]:
        extracted = self.parser.extract(self.text)
        if not extracted.tool_calls:
            return self._content_until(len(self.text)), []
        return self._content_until(len(self.text[:start].rstrip())), self._new_calls(extracted.tool_calls)

    def _content_until(self, end: int) -> str:
        if end <= self.num_content_sent:
            return ""
        content, self.num_content_sent = self.text[self.num_content_sent : end], end
        return content

    def _new_calls(self, calls: list[ParsedToolCall]) -> list[ToolCallDelta]:
        deltas = [call_delta(i, calls[i]) for i in range(self.num_calls_sent, len(calls))]
        self.num_calls_sent = max(self.num_calls_sent, len(calls))
        return deltas


def _partial_marker_length(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker` (it may become the marker)."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0
