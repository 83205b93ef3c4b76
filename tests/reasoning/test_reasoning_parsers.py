"""The reasoning parsers' one rule (pagedserve/reasoning/parser.py) on well-formed and malformed outputs,
whole and streamed in any chunking; and the chat path's composition with tool parsing: a call written
while thinking is no call."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedserve.entrypoints.openai.chat_tools import resolve_chat_tools
from pagedserve.errors import ConfigError
from pagedserve.reasoning import REASONING_PARSERS, get_reasoning_parser

QWEN3 = get_reasoning_parser("qwen3")
R1 = get_reasoning_parser("deepseek_r1")


@pytest.mark.parametrize(
    "parser,in_thinking,text,expected",
    [
        (QWEN3, None, "<think>plan</think>answer", ("plan", "answer")),
        (QWEN3, None, "answer only", (None, "answer only")),
        (QWEN3, None, "", (None, "")),
        (QWEN3, None, "<think>never closed", ("never closed", "")),
        (QWEN3, None, "<think>cut in a tag </thi", ("cut in a tag </thi", "")),
        (QWEN3, None, "<thi", (None, "<thi")),  # a partial start tag is text
        (QWEN3, None, " <think>late</think>x", (None, " <think>late</think>x")),  # not at the start
        (QWEN3, None, "stray</think>end", (None, "stray</think>end")),
        (QWEN3, True, "stray</think>end", ("stray", "end")),  # the prompt opened the block
        (QWEN3, None, "<think>a<think>b</think>c</think>d", ("a<think>b", "c</think>d")),
        (R1, None, "no tags at all", ("no tags at all", "")),  # R1 thinks by default
        (R1, None, "<think>x</think>y", ("x", "y")),
        (R1, False, "x</think>y", (None, "x</think>y")),  # the prompt closed the block
        (get_reasoning_parser("mistral"), None, "[THINK]hm[/THINK]ok", ("hm", "ok")),
        (
            get_reasoning_parser("granite"),
            None,
            "Here is my thought process: hm Here is my response: ok",
            (" hm ", " ok"),
        ),
    ],
)
def test_split(parser, in_thinking, text, expected) -> None:
    assert parser.split(text, in_thinking) == expected


def test_prompt_tags_decide_where_the_output_starts() -> None:
    assert QWEN3.starts_in_thinking("<|im_start|>assistant\n<think>\n")
    assert not QWEN3.starts_in_thinking("assistant\n<think>\n\n</think>\n\n")  # enable_thinking false
    assert not QWEN3.starts_in_thinking("no tags")
    assert R1.starts_in_thinking("no tags") and R1.starts_in_thinking(None)


def test_unknown_parser_names_the_choices_and_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"'nope' is not supported.*deepseek_r1.*--reasoning-parser"):
        get_reasoning_parser("nope")
    assert REASONING_PARSERS == ("deepseek_r1", "qwen3", "granite", "mistral", "openai_gptoss")


PIECES = ["<think>", "</think>", "<", "</", "<th", "think>", "a", "b c", "\n", "</think", "é"]


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.sampled_from(PIECES), max_size=12),
    cuts=st.lists(st.integers(0, 60), max_size=8),
    name=st.sampled_from(REASONING_PARSERS),
    in_thinking=st.sampled_from([None, True, False]),
)
def test_streaming_in_any_chunking_equals_split(parts, cuts, name, in_thinking) -> None:
    """Fed in any chunks, the deltas add up to split; nothing is lost but the two tags that open and
    close thinking, and nothing raises."""
    parser = get_reasoning_parser(name)
    text = "".join(parts)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    stream = parser.stream(in_thinking)
    reasoning, content = "", ""
    for start, end in zip(bounds, bounds[1:]):
        r, c = stream.feed(text[start:end])
        reasoning, content = reasoning + r, content + c
    r, c = stream.finish()
    reasoning, content = reasoning + r, content + c
    expected_reasoning, expected_content = parser.split(text, in_thinking)
    assert (reasoning if stream.thought else None, content) == (expected_reasoning, expected_content)
    dropped = len(text) - len(reasoning) - len(content)
    assert dropped in (0, len(parser.start), len(parser.end), len(parser.start) + len(parser.end))


def test_a_tool_call_inside_thinking_is_no_call() -> None:
    """The chat path parses tools on the content part only (serving_chat.py)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    tools = resolve_chat_tools([tool], "auto", "hermes", True)
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    _, content = QWEN3.split(f"<think>maybe {call}</think>no call")
    assert tools.output(content, "stop").tool_calls == []
    _, content = QWEN3.split(f"<think>so</think>{call}")
    assert [c.name for c in tools.output(content, "stop").tool_calls] == ["f"]
