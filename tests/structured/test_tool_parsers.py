"""The auto tool-call parsers on fixed model texts; streamed deltas reassembled equal the whole result; hostile
and random model text gives calls with valid JSON arguments or content, never an error. tool_choice
resolution: required with $refs, duplicate names."""

import json
import time

import jsonschema
import llguidance
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedserve.entrypoints.openai.chat_tools import ToolStreamer, resolve_chat_tools
from pagedserve.entrypoints.openai.tool_parsers import get_tool_parser
from pagedserve.entrypoints.openai.tool_parsers.streaming import ToolCallStreamer
from pagedserve.errors import ConfigError, InvalidRequestError
from pagedserve.structured_output.grammar import to_grammar
from pagedserve.structured_outputs_params import StructuredOutputsParams

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
    "qwen3_coder": [
        (
            "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n"
            "<parameter=zone>\nCET\n</parameter>\n</function>\n</tool_call>",
            "Let me check.",
            [("get_weather", {"city": "Paris", "days": "3"}), TIME],  # no tools given: every value is text
        ),
        ("<tool_call><function=get_time><parameter=zone>CET</parameter></function>", None, [TIME]),
        (
            "<tool_call><parameter=zone>CET</parameter></tool_call>",
            "<tool_call><parameter=zone>CET</parameter></tool_call>",
            [],
        ),
    ],
    "deepseek_v3": [
        (
            "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
            '{"city": "Paris", "days": 3}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>'
            'get_time\n```json\n{"zone": "CET"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
            "Checking.",
            [WEATHER, TIME],
        ),
        (
            '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n{"zone": "CET"}'
            "<｜tool▁call▁end｜>",
            '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n{"zone": "CET"}'
            "<｜tool▁call▁end｜>",
            [],  # no ```json fence: not V3's form
        ),
    ],
    "deepseek_v31": [
        (
            '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris", "days": 3}'
            '<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"zone": "CET"}<｜tool▁call▁end｜>'
            "<｜tool▁calls▁end｜>",
            None,
            [WEATHER, TIME],
        ),
        (
            'Sure.\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"zone": "CET"}',
            "Sure.",
            [TIME],
        ),
    ],
    "granite": [
        (
            '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
            '{"name": "get_time", "arguments": {"zone": "CET"}}]',
            None,
            [WEATHER, TIME],
        ),
        ("<|tool_call|>[{]", "<|tool_call|>[{]", []),
    ],
    "phi4_mini_json": [
        (
            'functools[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
            '{"name": "get_time", "arguments": {"zone": "CET"}}]',
            None,
            [WEATHER, TIME],
        ),
        (
            'With functools.partial: functools[{"name": "get_time", "parameters": {"zone": "CET"}}]',
            "With functools.partial:",
            [TIME],
        ),
    ],
    "kimi_k2": [
        (
            "<|tool_calls_section_begin|>\n<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
            '{"city": "Paris", "days": 3}<|tool_call_end|>\n<|tool_call_begin|>functions.get_time:1'
            '<|tool_call_argument_begin|>{"zone": "CET"}<|tool_call_end|>\n<|tool_calls_section_end|>',
            None,
            [WEATHER, TIME],
        ),
        (
            "<|tool_calls_section_begin|><|tool_call_begin|>get_time<|tool_call_argument_begin|>{}"
            "<|tool_call_end|>",
            "<|tool_calls_section_begin|><|tool_call_begin|>get_time<|tool_call_argument_begin|>{}"
            "<|tool_call_end|>",
            [],  # no :INDEX in the id
        ),
    ],
}
ALL = [(name, *case) for name, cases in CASES.items() for case in cases]


@pytest.mark.parametrize(("parser_name", "text", "content", "calls"), ALL)
def test_extract(parser_name: str, text: str, content: str | None, calls: list) -> None:
    extracted = get_tool_parser(parser_name).extract(text)
    assert extracted.content == content
    assert [(c.name, json.loads(c.arguments)) for c in extracted.tool_calls] == calls


def _streamed(streamer: ToolStreamer, text: str, chunk: int) -> tuple[str | None, list[tuple[str, str]]]:
    """`text` fed `chunk` characters at a time -> (content, [(name, arguments)])."""
    return _reassembled(streamer, [text[start : start + chunk] for start in range(0, len(text), chunk)])


def _reassembled(streamer: ToolStreamer, pieces: list[str]) -> tuple[str | None, list[tuple[str, str]]]:
    """`pieces` fed in turn -> (content, [(name, arguments)]), each feed's tool-call deltas checked for
    OpenAI's shape: one entry per call index, in index order, a call's first entry with its id, type and
    name (a client reading tool_calls[0] gets the whole piece)."""
    content, calls = "", {}
    for number, delta in enumerate(pieces, 1):
        piece, deltas = streamer.feed(delta, number == len(pieces))
        content += piece
        entries = [d.to_openai() for d in deltas]
        indexes = [entry["index"] for entry in entries]
        assert indexes == sorted(set(indexes)), entries
        for entry in entries:
            first = entry["index"] not in calls
            assert ("id" in entry) == first and ("name" in entry["function"]) == first, entry
            if first:  # NOTE: a Kimi K2 call's id is the model's (functions.NAME:INDEX)
                assert entry["type"] == "function" and entry["id"].startswith(("call_", "functions."))
                calls[entry["index"]] = (entry["function"]["name"], "")
            name, arguments = calls[entry["index"]]
            calls[entry["index"]] = (name, arguments + entry["function"]["arguments"])
    assert sorted(calls) == list(range(len(calls)))
    return content or None, [calls[i] for i in range(len(calls))]


@pytest.mark.parametrize("chunk", [1, 4, 17, 10**6])
@pytest.mark.parametrize(("parser_name", "text", "content", "calls"), ALL)
def test_streamed_deltas_reassemble_to_the_whole_result(
    parser_name: str, text: str, content: str | None, calls: list, chunk: int
) -> None:
    parser = get_tool_parser(parser_name)
    whole = parser.extract(text)
    assert _streamed(ToolCallStreamer(parser), text, chunk) == (
        whole.content,
        [(c.name, c.arguments) for c in whole.tool_calls],
    )


@settings(max_examples=150, deadline=None)
@given(case=st.sampled_from(ALL), cuts=st.lists(st.integers(0, 10**4), max_size=12))
def test_any_chunking_of_the_stream_gives_the_whole_result(case: tuple, cuts: list[int]) -> None:
    parser_name, text, _, _ = case
    bounds = sorted({0, len(text), *(cut % (len(text) + 1) for cut in cuts)})
    pieces = [text[start:end] for start, end in zip(bounds, bounds[1:])]
    whole = get_tool_parser(parser_name).extract(text)
    assert _reassembled(ToolCallStreamer(get_tool_parser(parser_name)), pieces) == (
        whole.content,
        [(c.name, c.arguments) for c in whole.tool_calls],
    )


TYPED_TOOL = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "temperature": {"type": "number"},
            "metric": {"type": "boolean"},
            "where": {"type": "object"},
            "hours": {"type": "array"},
            "note": {"type": ["string", "null"]},
            "count": {"type": ["integer", "null"]},
        },
    }
}


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("city", "3", "3"),
        ("city", " two words \n", " two words \n"),
        ("days", "3", 3),
        ("days", "-12", -12),
        ("days", "3.0", 3),
        ("days", "3.5", "3.5"),
        ("days", "three", "three"),
        ("days", "9" * 5000, "9" * 5000),  # past Python's int digits limit: stays text
        ("days", "1e999", "1e999"),
        ("days", str(2**64), 2**64),
        ("temperature", "21.5", 21.5),
        ("temperature", "20.0", 20),
        ("temperature", "NaN", "NaN"),
        ("temperature", "-inf", "-inf"),
        ("metric", "True", True),
        ("metric", "false", False),
        ("metric", "yes", "yes"),
        ("where", '{"lat": 1, "lon": [2]}', {"lat": 1, "lon": [2]}),
        ("where", "{broken", "{broken"),
        ("where", "[" * 100_000, "[" * 100_000),
        ("hours", "[1, 2]", [1, 2]),
        ("note", "null", None),
        ("count", "7", 7),
        ("unlisted", "7", "7"),
    ],
)
def test_qwen3_coder_values_are_typed_by_the_tool_schema(name: str, value: str, expected: object) -> None:
    text = f"<tool_call>\n<function=get_weather>\n<parameter={name}>\n{value}\n</parameter>\n</function>\n</tool_call>"
    (call,) = get_tool_parser("qwen3_coder", TYPED_TOOL).extract(text).tool_calls
    assert _strict_json(call.arguments) == {name: expected}


def test_qwen3_coder_unclosed_parameters_end_at_the_next_and_many_parse_in_linear_time() -> None:
    text = "<tool_call><function=get_weather><parameter=days>2<parameter=city>\nOslo\n</function></tool_call>"
    (call,) = get_tool_parser("qwen3_coder", TYPED_TOOL).extract(text).tool_calls
    assert json.loads(call.arguments) == {"days": 2, "city": "Oslo"}
    many = "<tool_call><function=f>" + "".join(f"<parameter=p{i}>{i}" for i in range(50_000)) + "</function>"
    start = time.monotonic()
    (call,) = get_tool_parser("qwen3_coder").extract(many).tool_calls
    assert len(json.loads(call.arguments)) == 50_000 and time.monotonic() - start < 2


def test_kimi_k2_call_ids_are_the_models() -> None:
    """Kimi's chat template writes a call's id back with its result: it must be the model's own."""
    text = CASES["kimi_k2"][0][0]
    calls = get_tool_parser("kimi_k2").extract(text).tool_calls
    assert [call.id for call in calls] == ["functions.get_weather:0", "functions.get_time:1"]


TWO_CALLS = (
    '[{"name": "get_weather", "parameters": {"city": "Oslo"}}, {"name": "get_time", "parameters": {}}]'
)
# tool_choice -> a text the model may write under it (two calls where it may make two)
CHOICE_TEXTS = [
    ({"type": "function", "function": {"name": "get_weather"}}, None, '{"city": "Paris"}'),
    ("required", None, TWO_CALLS),
    *((("auto", name, text) for name, text, _, calls in ALL if len(calls) == 2)),
]


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("chunk", [1, 10**6])
@pytest.mark.parametrize(("choice", "parser", "text"), CHOICE_TEXTS)
def test_every_tool_choice_streams_one_entry_per_call_index(
    choice: str | dict, parser: str | None, text: str, chunk: int, parallel: bool
) -> None:
    """Named, required and auto (each parser), parallel calls or not, token by token or in one chunk
    (where two calls stay two entries, in index order): the deltas reassemble to the whole output."""
    time_tool = {"type": "function", "function": {"name": "get_time", "parameters": {}}}
    tools = resolve_chat_tools([*TOOLS, time_tool], choice, parser, parallel)
    streamer = tools.streamer()
    assert streamer is not None
    whole = tools.output(text, "stop")
    content, calls = _streamed(streamer, text, chunk)
    assert content == whole.content and calls == [(c.name, c.arguments) for c in whole.tool_calls]
    assert len(calls) == (2 if parallel and not isinstance(choice, dict) else 1)


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


# Model text no parser may raise on (each was a RecursionError, TypeError or invalid JSON in `arguments`).
DEEP = 100_000
FLOOD = 5_000  # repeats of a marker (tens of characters each)
HOSTILE_TEXTS = {
    "hermes": [
        "<tool_call>" + "[" * DEEP,
        "<tool_call>" + "[" * DEEP + "</tool_call>",
        '<tool_call>{"name": "f", "arguments": ' + '{"a": ' * 5000 + "1" + "}" * 5001 + "</tool_call>",
        '<tool_call>{"name": "f", "arguments": {"a": NaN}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": {"a": 1e999}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": {"a": -Infinity}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": {"a": "\\ud800"}}</tool_call>',
        '<tool_call>{"name": "\\udfff", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": "not json"}</tool_call>',
        '<tool_call>{"name": "f", "arguments": "[1e999]"}</tool_call>',
    ],
    "llama3_json": [
        "[" * DEEP,
        "<|python_tag|>" + "[" * DEEP,
        '{"name": "f", "parameters": ' + "[" * DEEP,
        '{"name": "f", "parameters": {"a": NaN}}',
        '{"name": "f", "parameters": {"a": 1e999}}',
        '{"name": "f", "parameters": {"a": "\\udc00"}}',
    ],
    "mistral": [
        "[TOOL_CALLS]" + "[" * DEEP,
        "[TOOL_CALLS]" + "[" * DEEP + "]" * DEEP,
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": Infinity}}]',
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1e999}}]',
    ],
    "qwen3_coder": [
        "<tool_call>" + " " * DEEP,
        "<tool_call>" * FLOOD,
        "<tool_call><function=f>" + "<parameter=a>1" * FLOOD + "</tool_call>",  # no </function>
        "<tool_call><function=\ud800><parameter=a>1</parameter></function></tool_call>",
        "<tool_call><function=f><parameter=a>\ud800</parameter></function></tool_call>",
        "<tool_call><function=><parameter=a>1</parameter></function></tool_call>",
    ],
    "deepseek_v3": [
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n"
        + "[" * DEEP
        + "\n```",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{"a": NaN}\n```',
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json```<｜tool▁call▁end｜>",
    ],
    "deepseek_v31": [
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>" + "{" * DEEP,
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"a": 1e999}<｜tool▁call▁end｜>',
        "<｜tool▁calls▁begin｜>" + "<｜tool▁call▁begin｜>" * FLOOD,
    ],
    "granite": ["<|tool_call|>" + "[" * DEEP, '<|tool_call|>[{"name": "f", "arguments": {"a": Infinity}}]'],
    "phi4_mini_json": ["functools[" + "[" * DEEP, 'functools[{"name": "f", "arguments": "\\ud800"}]'],
    "kimi_k2": [
        "<|tool_calls_section_begin|>" + "<|tool_call_begin|>" * FLOOD,
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>"
        + "[" * DEEP
        + "<|tool_call_end|>",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions." + "a" * DEEP + "<|tool_call_end|>",
    ],
    "pythonic": [
        '[f(a=b"x")]',
        "[f(a={1, 2})]",
        "[f(a=1e999)]",
        "[f(a=-1e999)]",
        "[f(a=1j)]",
        "[f(a=...)]",
        "[f(a={[1]: 2})]",
        "[f(a={(1, 2): 3})]",
        "[f(**kwargs)]",
        '[f(a="\\ud800")]',
        "[f(a=" + "-" * DEEP + "1)]",
        "[f(a=" + "(" * DEEP + "1)]",
        "[f(a=1" + "+1" * DEEP + ")]",
        "[" * DEEP,
        "[f(a=1)]\x00",
        "[f(a=1), g(b=b'y')]",
    ],
}
HOSTILE = [(name, text) for name, texts in HOSTILE_TEXTS.items() for text in texts]


def _strict_json(text: str) -> object:
    """json.loads refusing NaN and Infinity (1e999 too), which JSON does not have."""

    def refuse(value: str) -> object:
        raise ValueError(f"not JSON: {value}")

    value = json.loads(text, parse_constant=refuse)
    json.dumps(value, allow_nan=False)  # 1e999 reads as inf: ValueError
    return value


def assert_calls_or_content(parser_name: str, text: str) -> None:
    """The parser's contract on any text: calls whose arguments are valid JSON (and, like their names,
    valid UTF-8), or else the text as content; streamed, the same without raising."""
    extracted = get_tool_parser(parser_name).extract(text)
    if not extracted.tool_calls:
        assert extracted.content == text
    for call in extracted.tool_calls:
        assert isinstance(call.name, str)
        call.name.encode(), call.arguments.encode()  # UnicodeEncodeError on a lone surrogate
        _strict_json(call.arguments)
    streamer = ToolCallStreamer(get_tool_parser(parser_name))
    for start in range(0, len(text), 997):
        streamer.feed(text[start : start + 997], start + 997 >= len(text))


@pytest.mark.parametrize(
    ("parser_name", "text"), HOSTILE, ids=[f"{n}-{i}" for i, (n, _) in enumerate(HOSTILE)]
)
def test_hostile_model_text_is_content_never_an_error(parser_name: str, text: str) -> None:
    assert_calls_or_content(parser_name, text)
    assert not get_tool_parser(parser_name).extract(text).tool_calls


def test_pythonic_literals_json_can_carry_still_parse() -> None:
    (call,) = get_tool_parser("pythonic").extract("[f(a=(1, 2), b={'k': None}, c=-2.5, d=True)]").tool_calls
    assert _strict_json(call.arguments) == {"a": [1, 2], "b": {"k": None}, "c": -2.5, "d": True}


def test_hermes_block_of_whitespace_parses_in_linear_time() -> None:
    """The block regex backtracked in cubic time: 5000 spaces after <tool_call> took half a minute."""
    text = "<tool_call>" + " " * 5000
    start = time.monotonic()
    assert get_tool_parser("hermes").extract(text).content == text
    assert time.monotonic() - start < 0.5


# Text a model might write around tool calls: markers, JSON and Python syntax, numbers JSON has no form for.
_FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "<|python_tag|>",
    "<function=f>",
    "<parameter=a>",
    "</parameter>",
    "</function>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "```json",
    "<|tool_call|>",
    "functools[",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "functions.f:0",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    '{"name": "f", "arguments": ',
    '{"name": "g", "parameters": ',
    "f(a=",
    "g()",
    "[",
    "]",
    "{",
    "}",
    "(",
    ")",
    ",",
    ":",
    ";",
    "=",
    '"',
    "'",
    "\\",
    "\\ud800",
    "1e999",
    "NaN",
    "-Infinity",
    "b'x'",
    "{1, 2}",
    "1j",
    "...",
    "null",
    "true",
    " ",
    "\n",
]
MODEL_TEXT = st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=5)), max_size=40).map("".join)


@settings(max_examples=300, deadline=None)
@given(parser_name=st.sampled_from(sorted(CASES)), text=MODEL_TEXT)
def test_any_model_text_gives_calls_with_json_arguments_or_content(parser_name: str, text: str) -> None:
    assert_calls_or_content(parser_name, text)


@settings(max_examples=100, deadline=None)
@given(
    parser_name=st.sampled_from(sorted(CASES)),
    prefix=st.sampled_from(sorted({get_tool_parser(name).start for name in CASES} | {"["})),
    depth=st.integers(1, 3000),
)
def test_nesting_at_any_depth_never_raises(parser_name: str, prefix: str, depth: int) -> None:
    assert_calls_or_content(
        parser_name, prefix + '{"name": "f", "arguments": ' + "[" * depth + "]" * depth + "}"
    )


DEFS_TOOL = {
    "type": "function",
    "function": {
        "name": "book",
        "parameters": {
            "type": "object",
            "properties": {
                "where": {"$ref": "#/$defs/Place"},
                "also": {"type": "array", "items": {"$ref": "#/$defs/Place"}, "maxItems": 2},
                "same_as": {"$ref": "#/properties/where"},
            },
            "required": ["where"],
            "$defs": {
                "Place": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                    "required": ["city"],
                }
            },
        },
    },
}


def test_required_tool_choice_keeps_refs_resolving() -> None:
    """Each tool's schema moves under the root's $defs with its refs rebased: `#/$defs/...` and other local
    pointers resolve as in the tool's own schema, and llguidance compiles the grammar."""
    other = {
        "type": "function",
        "function": {"name": "noop", "parameters": {"$defs": {"Place": {"type": "null"}}}},
    }
    schema = resolve_chat_tools([DEFS_TOOL, other, TOOLS[0]], "required", None).constraint.json
    assert not llguidance.LLMatcher.validate_grammar(to_grammar(StructuredOutputsParams(json=schema)))
    place = {"city": "Rome"}
    valid = [{"name": "book", "parameters": {"where": place, "also": [place], "same_as": place}}]
    jsonschema.validate(valid, schema)
    jsonschema.validate([{"name": "get_weather", "parameters": {"city": "Oslo"}}], schema)
    for wrong in (
        {"where": {"city": "Oslo"}},
        {"where": place, "also": [None]},
        {"where": place, "same_as": 1},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate([{"name": "book", "parameters": wrong}], schema)
    # The enum of a const/enum value is data: a "$ref" key in it is left as written.
    data = {"type": "object", "properties": {"a": {"const": {"$ref": "#/x"}}}}
    tool = {"type": "function", "function": {"name": "d", "parameters": data}}
    rebased = resolve_chat_tools([tool], "required", None).constraint.json["$defs"]["tool0"]
    assert rebased["properties"]["a"]["const"] == {"$ref": "#/x"}


def test_duplicate_tool_names_are_refused() -> None:
    with pytest.raises(
        InvalidRequestError, match=r"tools\[1\].function.name 'get_weather'.*tools\[0\]"
    ) as info:
        resolve_chat_tools([TOOLS[0], TOOLS[0]], "none", None)
    assert info.value.param == "tools[1].function.name"


REQUIRED_OUTPUTS = [
    "[",
    "{}",
    "[1, 2]",
    '[{"name": 3}]',
    '[{"name": "f", "parameters": {"a": NaN}}]',
    "[" * DEEP,
]


@pytest.mark.parametrize("text", REQUIRED_OUTPUTS, ids=range(len(REQUIRED_OUTPUTS)))
def test_required_output_that_is_no_list_of_calls_gives_no_calls(text: str) -> None:
    tools = resolve_chat_tools(TOOLS, "required", None)
    assert tools.output(text, "length").tool_calls == []
    (call,) = tools.output('[{"name": "get_weather", "parameters": {"city": "Paris"}}]', "stop").tool_calls
    assert call.name == "get_weather" and _strict_json(call.arguments) == {"city": "Paris"}
