"""Incremental detokenization and stop strings (the engine core sees only token ids)."""

import logging
from collections import deque
from typing import Protocol

from tokenizers.decoders import DecodeStream

from pagedserve.engine.tokenizer import AnyTokenizer

logger = logging.getLogger(__name__)

# Prompt tokens kept as context so the first output token decodes with its leading space.
_CONTEXT_TOKENS = 5


class _TokenDecoder(Protocol):
    def step(self, token: int) -> str:
        """The text `token` completes (empty while a character's bytes are incomplete)."""
        ...


class WindowDecoder:
    """Any tokenizer: decodes a short window twice per token and keeps what the new token added. Holds
    back output while it ends in an incomplete character (U+FFFD)."""

    def __init__(self, tokenizer: AnyTokenizer, context: list[int], skip_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.tokens = list(context)
        self.prefix_offset = 0
        self.read_offset = len(self.tokens)

    def _decode(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=self.skip_special_tokens))

    def step(self, token: int) -> str:
        self.tokens.append(token)
        prefix = self._decode(self.tokens[self.prefix_offset : self.read_offset])
        text = self._decode(self.tokens[self.prefix_offset :])
        if len(text) <= len(prefix) or text.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
        return text[len(prefix) :]


class StreamDecoder:
    """Fast tokenizers: the `tokenizers` library's own DecodeStream (one decode of a few tokens per step,
    in Rust), as vLLM v1 does. Falls back to the window decoder if the stream rejects a token sequence."""

    def __init__(self, tokenizer: AnyTokenizer, context: list[int], skip_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.backend = tokenizer.backend_tokenizer
        # NOTE: a prompt ending inside a character (a byte token) would make the stream hold that piece
        # back and emit it, with prompt text before it, as the first output: the context stops before it.
        while context and str(tokenizer.decode(context, skip_special_tokens=skip_special_tokens)).endswith(
            "\ufffd"
        ):
            context = context[:-1]
        # The window a fallback would need (a bounded deque: no list rebuilt per token).
        self.context = deque(context, maxlen=2 * _CONTEXT_TOKENS)
        self.stream: DecodeStream | None = DecodeStream(
            ids=list(context), skip_special_tokens=skip_special_tokens
        )
        self.fallback: WindowDecoder | None = None

    def step(self, token: int) -> str:
        if self.stream is not None:
            try:
                text = self.stream.step(self.backend, token)
                self.context.append(token)
                return text or ""
            except Exception as error:  # noqa: BLE001 (the stream raises plain exceptions on bad prefixes)
                logger.warning(
                    "DecodeStream failed (%s); decoding this request with the window decoder", error
                )
                self.stream = None
                self.fallback = WindowDecoder(self.tokenizer, list(self.context), self.skip_special_tokens)
        assert self.fallback is not None
        return self.fallback.step(token)


def make_token_decoder(
    tokenizer: AnyTokenizer, context: list[int], skip_special_tokens: bool
) -> _TokenDecoder:
    if getattr(tokenizer, "is_fast", False) and hasattr(tokenizer, "backend_tokenizer"):
        return StreamDecoder(tokenizer, context, skip_special_tokens)
    return WindowDecoder(tokenizer, context, skip_special_tokens)


class IncrementalDetokenizer:
    """Turns token ids into text and applies stop strings. Without stop strings, tokens are decoded when
    their text is asked for (`get_next_output_text`): a request that shows its text only at the end
    (final-only outputs) runs its decoder over all its tokens then, one tight loop, instead of a call
    chain per request per step; the decoder steps are the same, so the text is too."""

    def __init__(
        self,
        tokenizer: AnyTokenizer,
        prompt_token_ids: list[int],
        skip_special_tokens: bool,
        stop: list[str],
        include_stop_str_in_output: bool,
    ) -> None:
        self.decoder = make_token_decoder(tokenizer, prompt_token_ids[-_CONTEXT_TOKENS:], skip_special_tokens)
        self.stop = stop
        self.include_stop = include_stop_str_in_output
        self._text = ""
        self._undecoded: list[int] = []  # tokens not yet through the decoder (no stop strings)
        # NOTE: a stop string may begin in text already handed out and end in later text, and then it must
        # not have been shown: unfinished outputs hold back len(longest stop) - 1 characters. With
        # include_stop_str_in_output the cut is after the stop string, never before what was shown.
        self.stop_buffer_length = max(map(len, stop)) - 1 if stop and not include_stop_str_in_output else 0
        self._sent_offset = 0  # characters of output_text already returned as deltas

    @property
    def output_text(self) -> str:
        """Every token's text so far (up to a stop string)."""
        if self._undecoded:
            step = self.decoder.step
            self._text += "".join([step(token) for token in self._undecoded])
            self._undecoded = []
        return self._text

    def update(self, new_token_ids: list[int]) -> tuple[str, int] | None:
        """Append tokens to `output_text`, one at a time. On a stop string: the text is truncated at it,
        and the result is (the stop string, how many of `new_token_ids` are the request's: up to the one
        that completed it). Tokens after it (accepted drafts of a speculative step) are not the request's,
        exactly as without speculation."""
        if not self.stop:  # NOTE: the common case: decoded when the text is asked for
            self._undecoded += new_token_ids
            return None
        for num_kept, token in enumerate(new_token_ids, 1):
            start = len(self._text)
            self._text += self.decoder.step(token)
            stop = self._check_stop(start)
            if stop is not None:
                return stop, num_kept
        return None

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The text to show now: everything (delta=False) or only what is new since the previous delta
        call, minus the stop-string hold-back while the sample is unfinished."""
        text = self.output_text
        end = len(text) - (0 if finished else self.stop_buffer_length)
        if not delta:
            return text[: max(end, 0)]
        start = self._sent_offset
        if end <= start:
            return ""
        self._sent_offset = end
        return text[start:end]

    def _check_stop(self, new_text_start: int) -> str | None:
        """The stop string that occurs first in the text (the first listed among those at the same place),
        searched in the new text plus enough before it for a stop string spanning the boundary."""
        found = [
            (index, stop)
            for stop in self.stop
            if (index := self._text.find(stop, max(0, new_text_start - len(stop) + 1))) >= 0
        ]
        if not found:
            return None
        index, stop = min(found, key=lambda match: match[0])
        self._text = self._text[: index + (len(stop) if self.include_stop else 0)]
        return stop
