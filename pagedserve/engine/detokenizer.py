"""Incremental detokenization and stop strings (the engine core sees only token ids)."""
from typing import Any

# Prompt tokens kept as context so the first output token decodes with its leading space.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Turns token ids into text as they arrive; holds back bytes of an incomplete character."""

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool,
                 stop: list[str], include_stop_str_in_output: bool) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = stop
        self.include_stop = include_stop_str_in_output
        self.tokens = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.tokens)
        self.output_text = ""
        # NOTE: a stop string may begin in text already handed out and end in later text, and then it must
        # not have been shown: unfinished outputs hold back len(longest stop) - 1 characters. With
        # include_stop_str_in_output the cut is after the stop string, never before what was shown.
        self.stop_buffer_length = max(map(len, stop)) - 1 if stop and not include_stop_str_in_output else 0
        self._sent_offset = 0  # characters of output_text already returned as deltas

    def _decode(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=self.skip_special_tokens))

    def update(self, new_token_ids: list[int]) -> str | None:
        """Append tokens to `output_text`. Returns the stop string matched (text truncated at it), if any."""
        start = len(self.output_text)
        for token in new_token_ids:
            self.tokens.append(token)
            prefix = self._decode(self.tokens[self.prefix_offset:self.read_offset])
            text = self._decode(self.tokens[self.prefix_offset:])
            if len(text) > len(prefix) and not text.endswith("\ufffd"):
                self.output_text += text[len(prefix):]
                self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
        return self._check_stop(start)

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The text to show now: everything (delta=False) or only what is new since the previous delta
        call, minus the stop-string hold-back while the sample is unfinished."""
        end = len(self.output_text) - (0 if finished else self.stop_buffer_length)
        if not delta:
            return self.output_text[:max(end, 0)]
        start = self._sent_offset
        if end <= start:
            return ""
        self._sent_offset = end
        return self.output_text[start:end]

    def _check_stop(self, new_text_start: int) -> str | None:
        for stop in self.stop:
            # Only the new text, plus enough before it for a stop string spanning the boundary.
            index = self.output_text.find(stop, max(0, new_text_start - len(stop) + 1))
            if index >= 0:
                self.output_text = self.output_text[:index + (len(stop) if self.include_stop else 0)]
                return stop
        return None
