"""The reasoning parsers by name (vLLM's), each one's tags."""

from typing import Literal, get_args

from pagedserve.errors import ConfigError
from pagedserve.reasoning.parser import ReasoningParser

ReasoningParserName = Literal["deepseek_r1", "qwen3", "granite", "mistral", "openai_gptoss"]
REASONING_PARSERS: tuple[str, ...] = get_args(ReasoningParserName)

_PARSERS = {
    # DeepSeek-R1's template opens <think> in the prompt; older ones let the model write it.
    "deepseek_r1": ReasoningParser("deepseek_r1", "<think>", "</think>", thinks_by_default=True),
    # Qwen3 writes <think> itself; enable_thinking false puts an empty, closed block in the prompt.
    "qwen3": ReasoningParser("qwen3", "<think>", "</think>"),
    # Granite 3.x thinks in plain text when its template is given thinking=True.
    "granite": ReasoningParser("granite", "Here is my thought process:", "Here is my response:"),
    # Magistral: [THINK] and [/THINK] control tokens.
    "mistral": ReasoningParser("mistral", "[THINK]", "[/THINK]"),
    # gpt-oss: harmony's analysis channel, written as text. A harmony model's chat output is split by
    # channel from its tokens (entrypoints/openai/harmony_channels.py), whatever the parser.
    "openai_gptoss": ReasoningParser("openai_gptoss", "<|channel|>analysis<|message|>", "<|end|>"),
}


def get_reasoning_parser(name: str) -> ReasoningParser:
    """The parser named `name`. Raises ConfigError naming the choices."""
    parser = _PARSERS.get(name)
    if parser is None:
        raise ConfigError(
            f"reasoning parser {name!r} is not supported. Supported: {', '.join(REASONING_PARSERS)} "
            "(--reasoning-parser)."
        )
    return parser
