"""Thinking models (--reasoning-parser): the parser's tags as the tokenizer's token ids, resolved once at
startup, for the engine core (where thinking ends: the grammar starts there, the budget forces it)."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedserve.config.model import ModelConfig
from pagedserve.errors import ConfigError
from pagedserve.reasoning import get_reasoning_parser
from pagedserve.utils.hf_tokenizer import load_hf_tokenizer, tokenizer_source

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class ReasoningConfig:
    """`think_start_token_id` / `think_end_token_id`: the parser's tags when each is one token of the
    tokenizer, else None (granite's plain-text tags: the output is split, but the engine core cannot see
    where thinking ends, so constraints apply from the first token and no budget can be enforced)."""

    parser: str
    think_start_token_id: int | None
    think_end_token_id: int | None
    thinks_by_default: bool  # a prompt with neither tag starts the output in thinking (deepseek_r1)
    default_thinking_token_budget: int | None = None  # for requests that set none (--thinking-token-budget)

    def __post_init__(self) -> None:
        budget = self.default_thinking_token_budget
        if budget is not None and budget < 0:
            raise ConfigError(f"--thinking-token-budget must be at least 0, got {budget}.")
        if budget is not None and self.think_end_token_id is None:
            raise ConfigError(
                f"--thinking-token-budget needs a reasoning parser whose end-of-thinking tag is one token; "
                f"{self.parser!r}'s is not in this tokenizer. Drop --thinking-token-budget."
            )

    @property
    def tracks_thinking(self) -> bool:
        """Whether the engine core can follow where thinking ends (both tags are single tokens)."""
        return self.think_start_token_id is not None and self.think_end_token_id is not None


def resolve_reasoning_config(
    parser_name: str | None, model: ModelConfig, default_budget: int | None
) -> ReasoningConfig | None:
    """The parser's tags looked up in the model's tokenizer; None without a parser."""
    if parser_name is None:
        if default_budget is not None:
            raise ConfigError("--thinking-token-budget needs --reasoning-parser (a thinking model's tags).")
        return None
    parser = get_reasoning_parser(parser_name)
    tokenizer = load_hf_tokenizer(tokenizer_source(model.model, model.tokenizer, model.gguf_file))
    start, end = (_single_token_id(tokenizer, tag) for tag in (parser.start, parser.end))
    return ReasoningConfig(parser.name, start, end, parser.thinks_by_default, default_budget)


def _single_token_id(tokenizer: "PreTrainedTokenizerBase", tag: str) -> int | None:
    encoded = tokenizer.encode(tag, add_special_tokens=False)
    return int(encoded[0]) if len(encoded) == 1 else None
