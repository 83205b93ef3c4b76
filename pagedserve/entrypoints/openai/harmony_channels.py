"""gpt-oss's output read by channel, token by token (openai-harmony's StreamableParser): the analysis
channel is the reasoning, the final channel (and commentary without a recipient: a preamble) the
content. A message to a recipient (`functions.<name>`: a tool call) goes on into the content whole, once
it has ended, as harmony writes it: the `openai` tool parser reads the calls from there. An output that
leaves harmony's grammar is content, as text, from the message where it did."""

from collections.abc import Sequence

from openai_harmony import HarmonyEncoding, HarmonyError, Role, StreamableParser

# <|return|>, <|call|> and <|end|>: the tokens that end a message.
_MESSAGE_ENDS = ("<|return|>", "<|call|>", "<|end|>")


class HarmonyChannels:
    """One sample's split as its tokens arrive; `feed` as SampleReasoning's (the text is not read)."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self._encoding = encoding
        self._parser = StreamableParser(encoding, Role.ASSISTANT)
        self._ends = {encoding.encode(end, allowed_special="all")[0] for end in _MESSAGE_ENDS}
        self._header: list[int] = []  # the tokens of the message being read, until its content starts
        self._left_grammar = False  # from then on, every token is content
        self._num_ended = 0  # the messages that have ended
        self.thought = False
        self.num_reasoning_tokens = 0

    def feed(self, text: str, token_ids: Sequence[int], finished: bool) -> tuple[str, str]:
        """(reasoning, content) that `token_ids` add; `finished`: the output ended (an unended message
        ends with it)."""
        reasoning: list[str] = []
        content: list[str] = []
        for token in token_ids:
            if self._left_grammar:
                self._header.append(token)
                continue
            try:
                self._parser.process(token)
            except HarmonyError:
                self._leave_grammar(token)
                continue
            delta = self._parser.last_content_delta
            if token in self._ends:
                self._header = []
                content.append(self._call_markup())
            elif delta is None:
                self._header.append(token)  # a header token (or part of a character)
            elif self._parser.current_recipient is not None:
                pass  # a call's arguments: the whole message goes on when it ends
            elif self._parser.current_channel == "analysis":
                self.thought = True
                self.num_reasoning_tokens += 1
                reasoning.append(delta)
            else:
                content.append(delta)
        if finished:
            content.append(self._finish())
        return "".join(reasoning), "".join(content)

    def _leave_grammar(self, token: int) -> None:
        self._left_grammar = True
        self._header.append(token)

    def _finish(self) -> str:
        """The end of the output: an unended message ends here; tokens not placed are content."""
        if not self._left_grammar:
            try:
                self._parser.process_eos()
            except HarmonyError:  # its header never ended
                self._left_grammar = True
            else:
                self._header = []
                return self._call_markup()  # "" when no message was open
        rest, self._header = self._header, []
        return str(self._encoding.decode(rest))

    def _call_markup(self) -> str:
        """The message that just ended, as harmony writes it, when it has a recipient (else "")."""
        messages = self._parser.messages
        if len(messages) == self._num_ended:
            return ""
        self._num_ended = len(messages)
        if messages[-1].recipient is None:
            return ""
        return str(self._encoding.decode(self._encoding.render(messages[-1])))
