"""Chat completions with --reasoning-parser: each sample's text split into its reasoning and its content
(whole or streamed: pagedserve/reasoning/), and its reasoning tokens counted for usage. Tool calls are
parsed from the content alone, so a call written while thinking is no call. A harmony model's samples
(gpt-oss) are split by channel from their tokens, with or without a parser (harmony_channels.py)."""

from typing import TYPE_CHECKING, Protocol

from pagedserve.config.reasoning import ReasoningConfig
from pagedserve.core.thinking import Phase, Thinking, ThinkingState
from pagedserve.engine.tokenizer import AnyTokenizer
from pagedserve.entrypoints.openai.harmony_channels import HarmonyChannels
from pagedserve.reasoning import ReasoningParser, ReasoningStream, get_reasoning_parser

if TYPE_CHECKING:
    from openai_harmony import HarmonyEncoding


class OutputSplit(Protocol):
    """One sample's reasoning and content, fed its output in deltas (or all at once)."""

    @property
    def thought(self) -> bool: ...  # whether the output has a reasoning part (else `reasoning` is null)

    def feed(self, text: str, token_ids: list[int], finished: bool) -> tuple[str, str]: ...

    @property
    def num_reasoning_tokens(self) -> int: ...


class SampleReasoning:
    """One sample's split as its output arrives (text and token ids, in deltas or all at once)."""

    def __init__(
        self,
        stream: ReasoningStream,
        thinking: Thinking | None,
        state: ThinkingState | None,
        tokenizer: AnyTokenizer,
    ) -> None:
        self._stream = stream
        self._thinking = thinking
        self._state = state
        self._tokenizer = tokenizer
        self._num_tokens = 0
        self._reasoning: list[str] = []  # kept only to count it where tags are text (granite)

    def feed(self, text: str, token_ids: list[int], finished: bool) -> tuple[str, str]:
        """(reasoning, content) of this delta; `finished`: the last one (held-back text comes out)."""
        reasoning, content = self._stream.feed(text)
        if finished:
            tail_reasoning, tail_content = self._stream.finish()
            reasoning, content = reasoning + tail_reasoning, content + tail_content
        if self._thinking is not None and self._state is not None:
            for token in token_ids:
                self._state = self._thinking.after(self._state, token, self._num_tokens)
                self._num_tokens += 1
        elif reasoning:
            self._reasoning.append(reasoning)
        return reasoning, content

    @property
    def thought(self) -> bool:
        """Whether the output has a reasoning part (else `reasoning` is null)."""
        return self._stream.thought

    @property
    def num_reasoning_tokens(self) -> int:
        """The output's thinking tokens as the engine counts them for thinking_token_budget (tags
        excluded); where the tags are text, the reasoning's tokens."""
        if self._state is not None:
            return self._state.num_thinking_tokens
        text = "".join(self._reasoning)
        return len(self._tokenizer.encode(text, add_special_tokens=False)) if text else 0


class ChatReasoning:
    """The server's parser, and its tags' token ids (the engine's ReasoningConfig) where they are tokens.
    `harmony`: a harmony model's encoding (its samples are read by channel)."""

    def __init__(
        self,
        config: ReasoningConfig | None,
        tokenizer: AnyTokenizer,
        harmony: "HarmonyEncoding | None" = None,
    ) -> None:
        self.parser: ReasoningParser | None = None if config is None else get_reasoning_parser(config.parser)
        self._thinking = Thinking(config) if config is not None and config.tracks_thinking else None
        self._tokenizer = tokenizer
        self._harmony = harmony

    @property
    def reports_reasoning(self) -> bool:
        """Whether outputs are split (usage counts their reasoning tokens)."""
        return self.parser is not None or self._harmony is not None

    @property
    def enforces_budgets(self) -> bool:
        """Whether the engine can force the end of thinking (a parser whose tags are tokens)."""
        return self._thinking is not None

    def sample(self, prompt_token_ids: list[int]) -> OutputSplit | None:
        """A splitter for one sample of this prompt (None without a parser). The output starts in
        thinking as the engine decides from the prompt's tags (the text's where they are text)."""
        if self._harmony is not None:
            return HarmonyChannels(self._harmony)
        if self.parser is None:
            return None
        if self._thinking is None:
            stream = self.parser.stream(
                self.parser.starts_in_thinking(str(self._tokenizer.decode(prompt_token_ids)))
            )
            return SampleReasoning(stream, None, None, self._tokenizer)
        state = self._thinking.initial(prompt_token_ids, None)
        stream = self.parser.stream(state.phase is Phase.THINKING)
        return SampleReasoning(stream, self._thinking, state, self._tokenizer)
