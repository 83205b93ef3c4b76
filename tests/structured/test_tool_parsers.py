"""The auto tool-call parsers on fixed model texts; streamed deltas reassembled equal the whole result."""

import json

import pytest

from pagedserve.entrypoints.openai.chat_tools import resolve_chat_tools
from pagedserve.entrypoints.openai.tool_parsers import get_tool_parser
from pagedserve.entrypoints.openai.tool_parsers.streaming import ToolCallStreamer
from pagedserve.errors import ConfigError, InvalidRequestError

WEATHER = ("get_weather", {"city": "Paris", "days": 3})
TIME = ("get_time", {"zone": "CET"})

# parser -> (model text, expected content, expected calls)
CASES = {
    "hermes": [
        (
            'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
            '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>',
            "Let me check.",
            [WEATHER, TIME],
        ),
        ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}', None, [WEATHER]),
        ("No tools needed: it is sunny.", "No tools needed: it is sunny.", []),
        ("<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", []),
    ],
    "llama3_json": [
        ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}', None, [WEATHER]),
        (
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; '
            '{"name": "get_time", "parameters": {"zone": "CET"}}',
            None,
            [WEATHER, TIME],
        ),
        ('The answer is {"a": 1}.', 'The answer is {"a": 1}.', []),
    ],
    "mistral": [
        (
            '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
            '{"name": "get_time", "arguments": {"zone": "CET"}}]',
            None,
            [WEATHER, TIME],
        ),
        ('Sure. [TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "CET"}}]', "Sure.", [TIME]),
        ("[TOOL_CALLS] [broken", "[TOOL_CALLS] [broken", []),
    ],
    "pythonic": [
        ("[get_weather(city=\"Paris\", days=3), get_time(zone='CET')]", None, [WEATHER, TIME]),
        ("  [get_time(zone='CET')]", None, [TIME]),
        ("[1, 2, 3] are numbers", "[1, 2, 3] are numbers", []),
    ],
}
ALL = [(name, *case) for name, cases in CASES.items() for case in cases]


@pytest.mark.parametrize(("parser_name", "text", "content", "calls"), ALL)
def test_extract(parser_name: str, text: str, content: str | None, calls: list) -> None:
    extracted = get_tool_parser(parser_name).extract(text)
    assert extracted.content == content
    assert [(c.name, json.loads(c.arguments)) for c in extracted.tool_calls] == calls


@pytest.mark.parametrize("chunk", [1, 4, 17])
@pytest.mark.parametrize(("parser_name", "text", "content", "calls"), ALL)
def test_streamed_deltas_reassemble_to_the_whole_result(
    parser_name: str, text: str, content: str | None, calls: list, chunk: int
) -> None:
    parser = get_tool_parser(parser_name)
    streamer = ToolCallStreamer(parser)
    streamed_content, streamed_calls = "", {}
    for start in range(0, len(text), chunk):
        piece_content, deltas = streamer.feed(text[start : start + chunk], start + chunk >= len(text))
        streamed_content += piece_content
        for delta in (d.to_openai() for d in deltas):
            call = streamed_calls.setdefault(delta["index"], {"name": None, "arguments": ""})
            if "id" in delta:  # OpenAI's first delta of a call: id, type, name, empty arguments
                assert (
                    call["name"] is None
                    and delta["type"] == "function"
                    and delta["function"]["arguments"] == ""
                )
                call["name"] = delta["function"]["name"]
            call["arguments"] += delta["function"]["arguments"]
    whole = parser.extract(text)
    assert (streamed_content or None) == whole.content
    assert [streamed_calls[i]["name"] for i in sorted(streamed_calls)] == [c.name for c in whole.tool_calls]
    assert [streamed_calls[i]["arguments"] for i in sorted(streamed_calls)] == [
        c.arguments for c in whole.tool_calls
    ]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def test_tool_choice_resolution_and_errors() -> None:
    assert resolve_chat_tools(TOOLS, None, None).mode == "none"
    assert resolve_chat_tools(TOOLS, None, "hermes").mode == "auto"
    named = resolve_chat_tools(TOOLS, {"type": "function", "function": {"name": "get_weather"}}, None)
    assert named.constraint.json == TOOLS[0]["function"]["parameters"]
    assert resolve_chat_tools(TOOLS, "required", None).constraint.json["minItems"] == 1
    for tools, choice, parser, words in [
        (TOOLS, "auto", None, "--enable-auto-tool-choice"),
        (None, "required", None, "needs tools"),
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, None, "not in tools"),
        (TOOLS, "sometimes", None, "tool_choice must be"),
        ([{"type": "function"}], "required", None, r"tools\[0\] must be"),
    ]:
        with pytest.raises(InvalidRequestError, match=words):
            resolve_chat_tools(tools, choice, parser)
    with pytest.raises(ConfigError, match="hermes"):
        get_tool_parser("nope")
