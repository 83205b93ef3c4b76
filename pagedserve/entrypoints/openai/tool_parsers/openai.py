"""gpt-oss's tool calls (vLLM's `openai` parser): harmony messages to `functions.<name>` whose content is
the JSON arguments, `<|start|>assistant to=functions.f<|channel|>commentary <|constrain|>json<|message|>
{...}<|call|>`, as the model writes them and harmony_channels.py passes them on (the rest of the output
read by channel)."""

from openai_harmony import HarmonyError

from pagedserve.entrypoints.openai.harmony_encoding import harmony_encoding
from pagedserve.entrypoints.openai.tool_parsers.base import ParsedToolCall, ToolParser, make_call

_FUNCTIONS = "functions."


class OpenAIToolParser(ToolParser):
    start = "<|start|>assistant to="

    def parse_calls(self, tool_text: str) -> list[ParsedToolCall] | None:
        encoding = harmony_encoding()
        try:
            tokens = encoding.encode(tool_text, allowed_special="all")
            messages = encoding.parse_messages_from_completion_tokens(tokens, None)
        except HarmonyError:
            return None
        calls = []
        for message in messages:
            recipient = message.recipient or ""
            texts = [getattr(part, "text", "") for part in message.content]
            call = (
                make_call(recipient[len(_FUNCTIONS) :], "".join(texts))
                if recipient.startswith(_FUNCTIONS)
                else None
            )
            if call is None:
                return None
            calls.append(call)
        return calls

    def complete_calls(self, tool_text: str) -> list[ParsedToolCall]:
        # NOTE: harmony_channels.py passes a call on once it has ended: what has arrived is whole.
        return self.parse_calls(tool_text) or []
