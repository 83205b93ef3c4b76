"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) on the shared SmolLM2 server
(conftest.py), driven by the official anthropic client: greedy text equal to chat completions', the
stream's event types in order and equal to the whole answer, stop sequences, a forced tool call and the
tool_result turn after it, thinking accepted, count_tokens equal to the prompt's usage, and hostile
values refused in Anthropic's error shape naming the field while the server keeps serving."""

import json
import math

import anthropic
import httpx
import openai
import pytest
from server_utils import RemoteServer

ASK = [{"role": "user", "content": "Say hello to Ada."}]
GREEDY = {"temperature": 0}  # the client has no temperature argument: sent as an extra field
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def client(smol_server: RemoteServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=smol_server.base_url, api_key="any", timeout=120, max_retries=0)


def test_text_equals_chat_and_the_stream_equals_the_whole(
    client: anthropic.Anthropic, smol_server: RemoteServer
) -> None:
    whole = client.messages.create(
        model="smol", system="Be brief.", messages=ASK, max_tokens=4, extra_body=GREEDY
    )
    chat = smol_server.client().chat.completions.create(
        model="smol",
        messages=[{"role": "system", "content": "Be brief."}, *ASK],
        max_tokens=4,
        temperature=0,
    )
    (block,) = whole.content
    assert block.type == "text" and block.text == chat.choices[0].message.content
    assert (whole.stop_reason, whole.usage.output_tokens) == ("max_tokens", 4)
    # Anthropic's usage: the prompt is the tokens read from the (prefix) cache and the others. Asked
    # again, every whole block but the last token's is read from the cache.
    prompt = chat.usage.prompt_tokens
    assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens == prompt
    again = client.messages.create(model="smol", system="Be brief.", messages=ASK, max_tokens=1).usage
    assert (again.cache_read_input_tokens, again.cache_creation_input_tokens) == ((prompt - 1) // 16 * 16, 0)
    assert again.input_tokens + again.cache_read_input_tokens == prompt and again.cache_read_input_tokens > 0
    counted = client.messages.count_tokens(model="smol", system="Be brief.", messages=ASK)
    assert counted.input_tokens == chat.usage.prompt_tokens

    with client.messages.stream(
        model="smol",
        system=[{"type": "text", "text": "Be brief."}],
        messages=ASK,
        max_tokens=4,
        extra_body=GREEDY,
    ) as stream:
        types = [event.type for event in stream if event.type != "text"]  # "text": the helper's own
        final = stream.get_final_message()
    assert types[:2] == ["message_start", "content_block_start"]
    assert set(types[2:-3]) == {"content_block_delta"}
    assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert final.content[0].text == block.text and final.usage.output_tokens == 4
    # The stream's usage is the whole answer's, its cache reads included (message_delta carries them).
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens) == (
        again.input_tokens,
        again.cache_read_input_tokens,
    )


def test_stop_sequences(client: anthropic.Anthropic) -> None:
    text = client.messages.create(model="smol", messages=ASK, max_tokens=5, extra_body=GREEDY).content[0].text
    word = text.split()[1]
    stopped = client.messages.create(
        model="smol", messages=ASK, max_tokens=5, stop_sequences=[word], extra_body=GREEDY
    )
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", word)
    assert stopped.content[0].text == text[: text.index(word)]


@pytest.mark.sampled
@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_call_and_the_tool_result_turn(client: anthropic.Anthropic, stream: bool) -> None:
    """Streamed, the client rebuilds the call's input from input_json_delta events."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced = dict(
        model="smol",
        messages=ask,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        max_tokens=30,
        extra_body=GREEDY,
    )
    if stream:
        with client.messages.stream(**forced) as events:
            called = events.get_final_message()
    else:
        called = client.messages.create(**forced)
    (use,) = called.content
    assert (use.type, use.name, called.stop_reason) == ("tool_use", "get_weather", "tool_use")
    assert isinstance(use.input["city"], str)
    answer = client.messages.create(
        model="smol",
        messages=[
            *ask,
            {"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny"}]},
        ],
        tools=[WEATHER],
        tool_choice={"type": "none"},
        max_tokens=3,
        extra_body=GREEDY,
    )
    assert answer.content[0].type == "text" and answer.content[0].text


def test_thinking_is_accepted_and_its_budget_checked(client: anthropic.Anthropic) -> None:
    plain = client.messages.create(model="smol", messages=ASK, max_tokens=2, extra_body=GREEDY)
    thought = client.messages.create(
        model="smol",
        messages=ASK,
        max_tokens=2,
        thinking={"type": "enabled", "budget_tokens": 1},
        extra_body=GREEDY,
    )
    # SmolLM2's template has no enable_thinking switch: the same answer (a reasoning model's would think).
    assert thought.content[0].text == plain.content[0].text
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        client.messages.create(
            model="smol", messages=ASK, max_tokens=8, thinking={"type": "enabled", "budget_tokens": 8}
        )


NAN = math.nan
HOSTILE = [  # field, value, the field the error message names
    ("model", 5, "model"),
    ("messages", [], "messages"),
    ("messages", "hi", "messages"),
    ("messages", [{"role": "system", "content": "x"}], "messages"),
    ("messages", [{"role": "user", "content": [{"type": "image", "source": {}}]}], "messages"),
    ("messages", [{"role": "user", "content": [{"type": "tool_result"}]}], "tool_use_id"),
    ("messages", [{"role": "user", "content": "x"}] * 2000, "messages"),
    ("system", 7, "system"),
    ("max_tokens", None, "max_tokens"),
    ("max_tokens", 0, "max_tokens"),
    ("max_tokens", -1, "max_tokens"),
    ("max_tokens", 2**63, "max_tokens"),
    ("max_tokens", 2**64, "max_tokens"),
    ("max_tokens", 10**6, "max_tokens"),
    ("max_tokens", "5", "max_tokens"),
    ("temperature", NAN, "temperature"),
    ("temperature", -1, "temperature"),
    ("top_p", math.inf, "top_p"),
    ("top_k", -1, "top_k"),
    ("top_k", 2**64, "top_k"),
    ("top_k", 1.5, "top_k"),
    ("stop_sequences", "stop", "stop_sequences"),
    ("stop_sequences", [""], "stop_sequences"),
    ("stop_sequences", ["x"] * 100, "stop_sequences"),
    ("stream", "yes", "stream"),
    ("tools", [{"name": "f"}], "input_schema"),
    ("tools", [{"name": "", "input_schema": {}}], "name"),
    ("tool_choice", {"type": "tool"}, "tool_choice.name"),
    ("tool_choice", {"type": "sometimes"}, "tool_choice"),
    ("tool_choice", {"type": "tool", "name": "nope"}, "tool_choice"),
    ("thinking", {"type": "enabled", "budget_tokens": 0}, "budget_tokens"),
    ("thinking", {"type": "enabled", "budget_tokens": 2**64}, "budget_tokens"),
    ("thinking", {"type": "enabled", "budget_tokens": NAN}, "budget_tokens"),
    ("thinking", {"type": "maybe"}, "thinking"),
    ("metadata", {"user_id": "u" * 1000}, "user_id"),
]


@pytest.mark.parametrize("field,value,named", HOSTILE, ids=[f"{c[0]}-{i}" for i, c in enumerate(HOSTILE)])
def test_hostile_values_get_a_400_in_anthropics_shape(
    smol_server: RemoteServer, field: str, value: object, named: str
) -> None:
    body = {"model": "smol", "messages": ASK, "max_tokens": 2, field: value}
    if value is None:
        del body[field]
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        response = httpx.post(
            smol_server.base_url + path,
            content=json.dumps(body),
            headers={"Content-Type": "application/json"},
            timeout=60,
        )
        if path.endswith("count_tokens") and response.status_code == 200:
            continue  # a sampling field count_tokens does not take
        assert response.status_code == 400, (path, response.text)
        error = response.json()
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
        assert named in error["error"]["message"], error


def test_unknown_model_is_a_404_in_anthropics_shape(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as error:
        client.messages.create(model="claude-nope", messages=ASK, max_tokens=2)
    assert error.value.body["error"]["type"] == "not_found_error"


def test_still_serves_after_the_hostile_values(
    client: anthropic.Anthropic, smol_server: RemoteServer
) -> None:
    assert client.messages.create(model="smol", messages=ASK, max_tokens=2).content[0].text
    assert smol_server.client().completions.create(model="smol", prompt="Hi", max_tokens=1).choices
    with pytest.raises(openai.BadRequestError):  # the OpenAI routes keep OpenAI's shape
        smol_server.client().chat.completions.create(model="smol", messages=ASK, max_tokens=-1)
