"""Tool-call parsers for `--enable-auto-tool-choice --tool-call-parser NAME` (vLLM's names)."""

from typing import Literal, get_args

from pagedserve.entrypoints.openai.tool_parsers.base import ExtractedToolCalls, ParsedToolCall, ToolParser
from pagedserve.entrypoints.openai.tool_parsers.hermes import HermesToolParser
from pagedserve.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser
from pagedserve.entrypoints.openai.tool_parsers.mistral import MistralToolParser
from pagedserve.entrypoints.openai.tool_parsers.pythonic import PythonicToolParser
from pagedserve.errors import ConfigError

ToolCallParserName = Literal["hermes", "llama3_json", "mistral", "pythonic"]  # --tool-call-parser choices
TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "pythonic": PythonicToolParser,
}

assert set(get_args(ToolCallParserName)) == set(TOOL_PARSERS), "the flag's choices are the registry's names"


def get_tool_parser(name: str) -> ToolParser:
    if name not in TOOL_PARSERS:
        raise ConfigError(f"--tool-call-parser {name!r} is unknown; choose one of {', '.join(TOOL_PARSERS)}.")
    return TOOL_PARSERS[name]()


__all__ = [
    "ExtractedToolCalls",
    "ParsedToolCall",
    "TOOL_PARSERS",
    "ToolCallParserName",
    "ToolParser",
    "get_tool_parser",
]
