"""The one rule every reasoning parser follows, for a whole output (`split`) and for a stream (`feed`).

An output is in one of two parts: thinking, then the answer ("content"). It starts in thinking when the
prompt left a think block open (its last tag is the start tag), or, when the prompt has no tag at all,
if the parser says its models think by default (deepseek_r1); otherwise it starts in the answer, unless
its very first characters are the start tag. Thinking ends at the first end tag; everything after it is
content, tags included. The tags that open and close thinking are dropped; every other character is
kept, in order, in one part or the other: an unclosed block is all reasoning, a stray or repeated tag
stays in the text around it. The parsers never raise."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningParser:
    """`start` / `end`: the tags around thinking; `thinks_by_default`: an output whose prompt has
    neither tag starts in thinking (a template that opens the block itself, DeepSeek-R1's)."""

    name: str
    start: str
    end: str
    thinks_by_default: bool = False

    def starts_in_thinking(self, prompt: str | None) -> bool:
        """Whether the output of `prompt` starts inside a think block: the prompt's last tag is the start
        tag (a template that opened it), not the end tag (one that closed it: enable_thinking false)."""
        last_start = -1 if prompt is None else prompt.rfind(self.start)
        last_end = -1 if prompt is None else prompt.rfind(self.end)
        if last_start == last_end == -1:
            return self.thinks_by_default
        return last_start > last_end

    def split(self, text: str, in_thinking: bool | None = None) -> tuple[str | None, str]:
        """(reasoning, content) of a whole output; reasoning is None when the output never thought.
        `in_thinking`: whether it starts inside a think block (None: `thinks_by_default`)."""
        stream = self.stream(in_thinking)
        reasoning, content = stream.feed(text)
        tail_reasoning, tail_content = stream.finish()
        return (reasoning + tail_reasoning if stream.thought else None), content + tail_content

    def stream(self, in_thinking: bool | None = None) -> "ReasoningStream":
        """A per-request splitter fed the output's text deltas in order."""
        return ReasoningStream(self, self.thinks_by_default if in_thinking is None else in_thinking)


class ReasoningStream:
    """Splits deltas as they come. Text that may still turn out to be a tag (a prefix of the start tag
    at the very beginning, a prefix of the end tag while thinking) is held back until the next delta
    tells, or until `finish()`. Whatever the chunking, the deltas add up to `ReasoningParser.split`."""

    def __init__(self, parser: ReasoningParser, in_thinking: bool) -> None:
        self._parser = parser
        self._thinking = in_thinking
        self._at_start = True  # a start tag is looked for only at the very beginning
        self._held = ""
        self.thought = in_thinking  # whether the output has a reasoning part

    def feed(self, delta: str) -> tuple[str, str]:
        """(reasoning delta, content delta) of the text `delta` adds."""
        text = self._held + delta
        self._held = ""
        reasoning, content = "", ""
        if self._at_start:
            start = self._parser.start
            if start.startswith(text) and len(text) < len(start):
                self._held = text  # could still become the start tag
                return "", ""
            self._at_start = False
            if text.startswith(start):
                text = text[len(start) :]
                self._thinking = self.thought = True
        if self._thinking:
            end = self._parser.end
            index = text.find(end)
            if index < 0:
                keep = _partial_suffix(text, end)
                self._held = text[len(text) - keep :]
                return text[: len(text) - keep], ""
            self._thinking = False
            reasoning, text = text[:index], text[index + len(end) :]
        content = text
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What was held back, once the output ended: a partial end tag is reasoning, a partial start tag
        content (or reasoning when the output started in thinking)."""
        held, self._held = self._held, ""
        return (held, "") if self._thinking else ("", held)


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag` (and is shorter than it)."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0
