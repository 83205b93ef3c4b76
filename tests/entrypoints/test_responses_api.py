"""The Responses API (POST /v1/responses, GET / DELETE /v1/responses/{id}, /cancel) on the shared SmolLM2
server (conftest.py), driven by the official openai client: greedy text equal to chat completions',
the official stream events in order, .parse with a pydantic model, function tools and the follow-up turn
with function_call_output, stored responses scoped to the key and bounded (counted in /metrics), hostile
values refused with a 400 naming the field while the server keeps serving."""

import json
import math

import httpx
import openai
import pytest
from pydantic import BaseModel, Field
from server_utils import RemoteServer

from pagedserve.entrypoints.openai.response_store import ResponseStore, StoredResponse
from pagedserve.errors import InvalidRequestError

ASK = "Say hello to Ada."
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    },
}


def _client(server: RemoteServer, key: str = "key-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def client(smol_server: RemoteServer) -> openai.OpenAI:
    return _client(smol_server)


def test_text_equals_chat_and_the_follow_up_continues(
    client: openai.OpenAI, smol_server: RemoteServer
) -> None:
    first = client.responses.create(
        model="smol", instructions="Be brief.", input=ASK, max_output_tokens=4, temperature=0
    )
    chat = client.chat.completions.create(
        model="smol",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": ASK}],
        max_tokens=4,
        temperature=0,
    )
    assert first.output_text == chat.choices[0].message.content
    assert first.usage.input_tokens == chat.usage.prompt_tokens
    assert first.usage.output_tokens == chat.usage.completion_tokens == 4
    assert (first.status, first.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert client.responses.retrieve(first.id).output_text == first.output_text

    follow = client.responses.create(
        model="smol", input="And to Bob?", previous_response_id=first.id, max_output_tokens=3, temperature=0
    )
    history = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And to Bob?"},
    ]
    chat = client.chat.completions.create(model="smol", messages=history, max_tokens=3, temperature=0)
    assert follow.output_text == chat.choices[0].message.content  # instructions are not carried over
    assert follow.previous_response_id == first.id

    other = _client(smol_server, "key-b")  # another key sees none of key-a's responses
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as error:
        other.responses.create(model="smol", input="x", previous_response_id=first.id, max_output_tokens=1)
    assert error.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(first.id)
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_stream_events_in_the_official_order(client: openai.OpenAI) -> None:
    whole = client.responses.create(model="smol", input=ASK, max_output_tokens=3, temperature=0, store=False)
    with client.responses.stream(model="smol", input=ASK, max_output_tokens=3, temperature=0) as stream:
        events = list(stream)
    types = [event.type for event in events]
    assert types[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # cut at max_output_tokens, as OpenAI reports it
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-1].response.output_text
    with pytest.raises(openai.NotFoundError):  # store false: nothing kept
        client.responses.retrieve(whole.id)


class City(BaseModel):
    name: str = Field(max_length=12)


def test_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    parsed = client.responses.parse(
        model="smol", input="Name a big city.", text_format=City, max_output_tokens=16, temperature=0
    )
    assert isinstance(parsed.output_parsed, City), parsed.output_text


@pytest.mark.sampled
@pytest.mark.parametrize("stateless", [False, True])
def test_function_tools_and_the_follow_up_turn(client: openai.OpenAI, stateless: bool) -> None:
    """The turn after a call: continued from the stored response, or sent whole as items."""
    ask = "What is the weather in Paris?"
    call_turn = client.responses.create(
        model="smol",
        input=ask,
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=30,
        temperature=0,
        store=not stateless,
    )
    (call,) = call_turn.output
    assert (call.type, call.name, call.status) == ("function_call", "get_weather", "completed")
    assert isinstance(json.loads(call.arguments)["city"], str)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 25 C"}
    turn = (
        {"input": [{"role": "user", "content": ask}, call.model_dump(exclude_none=True), result]}
        if stateless
        else {"input": [result], "previous_response_id": call_turn.id}
    )
    answer = client.responses.create(
        model="smol", **turn, tools=[WEATHER], tool_choice="none", max_output_tokens=3, temperature=0
    )
    assert answer.output[0].type == "message" and answer.output_text


def test_cancel_stops_a_response_in_progress(client: openai.OpenAI, smol_server: RemoteServer) -> None:
    stream = client.responses.create(
        model="smol", input=ASK, max_output_tokens=500, temperature=0, stream=True
    )
    created = next(iter(stream))
    cancelled = False
    for event in stream:
        if event.type == "response.output_text.delta" and not cancelled:
            assert client.responses.cancel(created.response.id).status == "cancelled"
            cancelled = True
    assert event.type == "response.completed" and event.response.status == "cancelled"
    assert event.response.usage is not None and event.response.usage.output_tokens < 500
    assert client.responses.retrieve(created.response.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError):  # ended: nothing to cancel
        client.responses.cancel(created.response.id)


def test_stored_responses_are_bounded_and_counted(client: openai.OpenAI, smol_server: RemoteServer) -> None:
    ids = [
        client.responses.create(model="smol", input=f"Count {i}", max_output_tokens=1).id for i in range(3)
    ]
    metrics = smol_server.metrics()
    assert metrics["pagedserve:stored_responses"] == 2  # --max-stored-responses 2 (conftest.py)
    assert metrics["pagedserve:stored_responses_bytes"] > 0
    with pytest.raises(openai.NotFoundError):  # the least recently used went first
        client.responses.retrieve(ids[0])
    assert client.responses.retrieve(ids[-1]).id == ids[-1]


NAN = math.nan
HOSTILE = [  # field, value, the field the error names
    ("input", 7, "input"),
    ("input", [], "input"),
    ("input", [{"type": "image", "url": "x"}], "input[0].type"),
    ("input", [{"role": "wizard", "content": "x"}], "input[0].role"),
    ("input", [{"role": "user", "content": [{"type": "input_image"}]}], "input[0].content[0]"),
    ("input", [{"type": "function_call_output", "output": "x"}], "input[0].call_id"),
    ("input", [{"role": "user", "content": "x"}] * 2000, "input"),
    ("instructions", ["x"], "instructions"),
    ("max_output_tokens", -1, "max_output_tokens"),
    ("max_output_tokens", 0, "max_output_tokens"),
    ("max_output_tokens", 2**63, "max_output_tokens"),
    ("max_output_tokens", 2**64, "max_output_tokens"),
    ("max_output_tokens", 10**6, "max_output_tokens"),
    ("max_output_tokens", "8", "max_output_tokens"),
    ("temperature", NAN, "temperature"),
    ("temperature", -1, "temperature"),
    ("temperature", "hot", "temperature"),
    ("top_p", math.inf, "top_p"),
    ("top_p", 7, "top_p"),
    ("stream", "yes", "stream"),
    ("store", 1, "store"),
    ("background", True, "background"),
    ("previous_response_id", "", "previous_response_id"),
    ("previous_response_id", "r" * 100_000, "previous_response_id"),
    ("previous_response_id", "resp_nonexistent", "previous_response_id"),
    ("metadata", {"k": 1}, "metadata.k"),
    ("metadata", {f"k{i}": "v" for i in range(17)}, "metadata"),
    ("metadata", {"k": "v" * 513}, "metadata"),
    ("tools", [{"type": "web_search"}], "tools[0]"),
    ("tools", "get_weather", "tools"),
    ("tool_choice", {"type": "function"}, "tool_choice"),
    ("tool_choice", "required", "tool_choice"),  # without tools
    ("parallel_tool_calls", "no", "parallel_tool_calls"),
    ("text", {"format": {"type": "json_schema", "name": "x"}}, "text.format.schema"),
    ("text", {"format": {"type": "xml"}}, "text.format.type"),
    ("reasoning", {"effort": "extreme"}, "reasoning.effort"),
    ("reasoning", {"effort": NAN}, "reasoning.effort"),
    ("truncation", "auto", "truncation"),
]


@pytest.mark.parametrize("field,value,param", HOSTILE, ids=[f"{c[0]}-{i}" for i, c in enumerate(HOSTILE)])
def test_hostile_values_get_a_400_naming_the_field(
    smol_server: RemoteServer, field: str, value: object, param: str
) -> None:
    body = {"model": "smol", "input": "Hi", "max_output_tokens": 2, field: value}
    response = httpx.post(
        f"{smol_server.base_url}/v1/responses",
        content=json.dumps(body),
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    expected = 404 if value == "resp_nonexistent" else 400
    assert response.status_code == expected, response.text
    error = response.json()["error"]
    assert error["param"] == param or error["param"].startswith(param + "."), error  # .str: a union's
    assert param.split(".")[0].split("[")[0] in error["message"], error


@pytest.mark.parametrize("response_id", ["%00", "..%2F..%2Fetc", "%FF%FE", str(2**64), "NaN", "r" * 50_000])
def test_hostile_ids_on_the_stored_routes_are_404(smol_server: RemoteServer, response_id: str) -> None:
    url = f"{smol_server.base_url}/v1/responses/{response_id}"
    for method, path in (("GET", url), ("DELETE", url), ("POST", url + "/cancel")):
        response = httpx.request(method, path, timeout=60)
        assert response.status_code == 404, (method, response.text[:200])
        assert len(response.text) < 2_000  # the id is echoed cut short


def test_still_serves_after_the_hostile_values(client: openai.OpenAI) -> None:
    assert client.responses.create(model="smol", input=ASK, max_output_tokens=2, store=False).output_text


def test_the_store_bounds_count_and_bytes_least_recently_used_first() -> None:
    store = ResponseStore(max_responses=3, max_bytes=2_000)
    for name in "abc":
        store.put("key-a", name, StoredResponse({"id": name}))
    store.get("key-a", "a")  # a is now the most recently used: b goes first
    store.put("key-a", "d", StoredResponse({"id": "d"}))
    assert len(store) == 3
    with pytest.raises(InvalidRequestError):
        store.get("key-a", "b")
    with pytest.raises(InvalidRequestError) as error:
        store.get("key-b", "a")  # another key's
    assert error.value.status_code == 404
    big = StoredResponse({"id": "big"}, [{"role": "user", "content": "x" * 1_950}])
    assert big.size() < 2_000 < big.size() + 3 * StoredResponse({"id": "a"}).size()
    store.put("key-a", "big", big)  # over the byte bound with the others: they go, oldest first
    assert store.get("key-a", "big") is big and store.num_bytes <= 2_000 and len(store) < 4
    with pytest.raises(InvalidRequestError):  # c, the least recently used, went first
        store.get("key-a", "c")
    store.put("key-a", "huge", StoredResponse({"id": "huge"}, [{"content": "x" * 3_000}]))
    with pytest.raises(InvalidRequestError):  # larger than the bound alone: not kept
        store.get("key-a", "huge")
    assert store.delete("key-a", "big") and not store.delete("key-a", "big")
