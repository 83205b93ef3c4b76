"""Tool-call parsers for `--enable-auto-tool-choice --tool-call-parser NAME` (vLLM's names)."""

from collections.abc import Mapping
from typing import Literal, get_args

from pagedserve.entrypoints.openai.tool_parsers.base import ExtractedToolCalls, ParsedToolCall, ToolParser
from pagedserve.entrypoints.openai.tool_parsers.deepseek import DeepSeekV3ToolParser, DeepSeekV31ToolParser
from pagedserve.entrypoints.openai.tool_parsers.granite import GraniteToolParser
from pagedserve.entrypoints.openai.tool_parsers.hermes import HermesToolParser
from pagedserve.entrypoints.openai.tool_parsers.kimi_k2 import KimiK2ToolParser
from pagedserve.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser
from pagedserve.entrypoints.openai.tool_parsers.mistral import MistralToolParser
from pagedserve.entrypoints.openai.tool_parsers.openai import OpenAIToolParser
from pagedserve.entrypoints.openai.tool_parsers.phi4_mini import Phi4MiniJsonToolParser
from pagedserve.entrypoints.openai.tool_parsers.pythonic import PythonicToolParser
from pagedserve.entrypoints.openai.tool_parsers.qwen3_coder import Qwen3CoderToolParser
from pagedserve.errors import ConfigError
from pagedserve.utils.user_json import JsonObject

# --tool-call-parser choices
ToolCallParserName = Literal[
    "deepseek_v3",
    "deepseek_v31",
    "granite",
    "hermes",
    "kimi_k2",
    "llama3_json",
    "mistral",
    "openai",
    "phi4_mini_json",
    "pythonic",
    "qwen3_coder",
]
TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "deepseek_v3": DeepSeekV3ToolParser,
    "deepseek_v31": DeepSeekV31ToolParser,
    "granite": GraniteToolParser,
    "hermes": HermesToolParser,
    "kimi_k2": KimiK2ToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "openai": OpenAIToolParser,
    "phi4_mini_json": Phi4MiniJsonToolParser,
    "pythonic": PythonicToolParser,
    "qwen3_coder": Qwen3CoderToolParser,
}

assert set(get_args(ToolCallParserName)) == set(TOOL_PARSERS), "the flag's choices are the registry's names"


def get_tool_parser(name: str, functions: Mapping[str, JsonObject] | None = None) -> ToolParser:
    """A parser for one output; `functions`: the request's tools (name -> parameters schema)."""
    if name not in TOOL_PARSERS:
        raise ConfigError(f"--tool-call-parser {name!r} is unknown; choose one of {', '.join(TOOL_PARSERS)}.")
    return TOOL_PARSERS[name](functions)


__all__ = [
    "ExtractedToolCalls",
    "ParsedToolCall",
    "TOOL_PARSERS",
    "ToolCallParserName",
    "ToolParser",
    "get_tool_parser",
]
