"""Structured outputs and tool calling through a real server (SmolLM2) and the official openai client:
schemas streamed and not, guided_* and structured_outputs fields, hostile constraints refused with 4xx
while the engine keeps serving, tool_choice required / named / auto (hermes), streamed tool calls as
instructor and the openai SDK's stream helper read them."""

import asyncio
import json
import os
import re
import sys
from typing import Literal

import httpx
import instructor
import jsonschema
import openai
import pytest
from instructor.dsl.partial import PartialLiteralMixin
from pydantic import BaseModel, Field
from server_utils import RemoteServer, forced_tool_call

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "structured"))
from schemas import SCHEMAS, prompt_for  # noqa: E402 - shared with tests/structured (the offline runs)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}},
            "required": ["zone"],
        },
    },
}
TOOLS = [WEATHER_TOOL, TIME_TOOL]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(smol_server: RemoteServer) -> RemoteServer:
    return smol_server  # conftest.py: shared with the Responses and Messages API tests


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    # NOTE: SmolLM2 writes whole JSON documents here: a longer bound than server.client()'s 60 s.
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", timeout=300, max_retries=0)


async def _schema_answer(client: openai.AsyncOpenAI, index: int, sampled: bool) -> tuple[str, str | None]:
    """(text, finish_reason) of one schema's request: greedy and whole, or sampled and streamed."""
    description, schema = SCHEMAS[index]
    kwargs = dict(
        model=None,
        messages=prompt_for(description),
        max_tokens=160,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    )
    if not sampled:
        whole = await client.chat.completions.create(**kwargs, temperature=0)
        return whole.choices[0].message.content, whole.choices[0].finish_reason
    text, finish = "", None
    async for chunk in await client.chat.completions.create(**kwargs, temperature=0.9, seed=3, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, finish


def test_every_schema_through_the_openai_client_greedy_whole_and_sampled_streamed(
    server: RemoteServer,
) -> None:
    """All the schemas at once (the engine batches them): greedy non-streamed and sampled streamed."""

    async def all_answers() -> list[tuple[str, str | None]]:
        async with openai.AsyncOpenAI(
            base_url=f"{server.base_url}/v1", api_key="none", timeout=1800, max_retries=0
        ) as client:
            runs = [(index, sampled) for index in range(len(SCHEMAS)) for sampled in (False, True)]
            return await asyncio.gather(*(_schema_answer(client, index, sampled) for index, sampled in runs))

    answers = asyncio.run(all_answers())
    for position, (text, finish) in enumerate(answers):
        description, schema = SCHEMAS[position // 2]
        assert finish == "stop", (description, "sampled" if position % 2 else "greedy", text)
        jsonschema.validate(json.loads(text), schema)


def test_guided_fields_on_completions_and_json_object_on_chat(client: openai.OpenAI) -> None:
    choice = client.completions.create(
        model=None,
        prompt="The sky is",
        max_tokens=10,
        temperature=0,
        extra_body={"guided_choice": ["blue", "green"]},
    )
    assert choice.choices[0].text in ("blue", "green")
    regex = client.completions.create(
        model=None, prompt="Call me at", max_tokens=20, extra_body={"guided_regex": r"\d{3}-\d{4}"}
    )
    assert re.fullmatch(r"\d{3}-\d{4}", regex.choices[0].text)
    grammar = client.completions.create(
        model=None,
        prompt="2 + 2 =",
        max_tokens=20,
        temperature=0,
        extra_body={"structured_outputs": {"grammar": 'root ::= num ("+" num)*\nnum ::= [0-9]+'}},
    )
    assert re.fullmatch(r"\d+(\+\d+)*", grammar.choices[0].text)
    obj = client.chat.completions.create(
        model=None,
        messages=prompt_for("a city and its country"),
        max_tokens=400,  # json_object is bounded (8 keys, 4 levels), so it closes well within this
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(obj.choices[0].message.content), dict)


def _nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


HOSTILE = [  # (extra body, status, words in the message)
    (
        {"guided_json": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(400)}}},
        413,
        "--max-structured-output-bytes",
    ),
    ({"guided_json": {"type": "array", "minItems": 3, "maxItems": 1}}, 400, "minItems"),
    ({"guided_json": {"type": "strange"}}, 400, "strange"),
    ({"guided_json": {"type": "string", "pattern": "(a|b"}}, 400, "regex"),
    ({"guided_regex": 12}, 400, "guided_regex"),
    ({"structured_outputs": {"json_object": "yes"}}, 400, "true or false"),  # once killed the engine
    ({"structured_outputs": {"regex": 5}}, 400, "a string"),
    ({"structured_outputs": {"json": True}}, 400, "JSON schema"),
    ({"guided_choice": []}, 400, "choice"),
    ({"guided_grammar": "root ::= (("}, 400, "GBNF"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "no"}}},
        400,
        "json_schema",
    ),
    ({"guided_json": {"type": "object"}, "guided_regex": "a"}, 400, "Only one output constraint"),
    ({"structured_outputs": {"json": {}, "regex": "a"}}, 400, "exactly one"),
    ({"structured_outputs": {"xml": "a"}}, 400, "xml"),
    ({"response_format": {"type": "yaml"}}, 400, "yaml"),
]


def test_hostile_constraints_get_4xx_and_the_engine_keeps_serving(
    server: RemoteServer, client: openai.OpenAI
) -> None:
    for extra, status, words in HOSTILE:
        body = {"messages": ASK, "max_tokens": 5, **extra}
        response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == status, (extra, response.text)
        assert words in response.json()["error"]["message"], (extra, response.text)
    # Deeply nested (within the size bound) and empty schemas compile in bounded time and are honoured.
    nested = _nested(40)
    deep = client.chat.completions.create(
        model=None, messages=ASK, max_tokens=200, temperature=0, extra_body={"guided_json": nested}
    )
    if deep.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(deep.choices[0].message.content), nested)
    empty = client.chat.completions.create(
        model=None, messages=ASK, max_tokens=60, temperature=0, extra_body={"guided_json": {}}
    )
    if empty.choices[0].finish_reason == "stop":
        json.loads(empty.choices[0].message.content)
    normal = client.chat.completions.create(model=None, messages=ASK, max_tokens=8, temperature=0)
    assert normal.choices[0].message.content and normal.usage.completion_tokens >= 1


def _valid_call(call, tools=TOOLS) -> dict:
    schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == call.function.name)
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, schema)
    return arguments


def test_tool_choice_required_and_named(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model=None, messages=ASK, max_tokens=1, temperature=0)
    required = client.chat.completions.create(
        model=None, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120, temperature=0
    )
    assert required.usage.prompt_tokens > plain.usage.prompt_tokens + 40, "the template rendered the tools"
    choice = required.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        _valid_call(call)
    for temperature in (0.0, 1.0):
        named = client.chat.completions.create(
            model=None,
            messages=ASK,
            tools=TOOLS,
            max_tokens=80,
            temperature=temperature,
            seed=1,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        )
        (call,) = named.choices[0].message.tool_calls
        assert call.function.name == "get_time" and call.id
        _valid_call(call)
    stream = client.chat.completions.create(
        model=None,
        messages=ASK,
        tools=TOOLS,
        max_tokens=80,
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        stream=True,
    )
    name, arguments = None, ""
    for chunk in stream:
        for delta_call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            name = delta_call.function.name or name
            arguments += delta_call.function.arguments or ""
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), WEATHER_TOOL["function"]["parameters"])


TRIP_TOOL = {
    "type": "function",
    "function": {
        "name": "book_trip",
        "description": "Book a trip to a city, through up to two others.",
        "parameters": {
            "type": "object",
            "properties": {
                "to": {"$ref": "#/$defs/City"},
                "via": {"type": "array", "items": {"$ref": "#/$defs/City"}, "maxItems": 2},
            },
            "required": ["to", "via"],
            "$defs": {
                "City": {
                    "type": "object",
                    "properties": {"name": {"enum": ["Paris", "Rome", "Oslo"]}},
                    "required": ["name"],
                }
            },
        },
    },
}
TRIP = [{"role": "user", "content": "Book me a trip to Rome through Paris."}]


def test_tool_choice_required_with_defs_and_refs(client: openai.OpenAI) -> None:
    """A tool whose parameters use $defs / $ref: its schema was nested under the call's object, where
    `#/$defs/City` no longer resolved (400 on a valid tool). Named and required both give valid calls."""
    for tools in ([TRIP_TOOL], [*TOOLS, TRIP_TOOL]):
        response = client.chat.completions.create(
            model=None, messages=TRIP, tools=tools, tool_choice="required", max_tokens=120, temperature=0
        )
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
        for call in choice.message.tool_calls:
            _valid_call(call, tools)
    named = client.chat.completions.create(
        model=None,
        messages=TRIP,
        tools=[*TOOLS, TRIP_TOOL],
        tool_choice={"type": "function", "function": {"name": "book_trip"}},
        max_tokens=80,
        temperature=0,
    )
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "book_trip" and _valid_call(call, [TRIP_TOOL])["to"]["name"]


HERMES_TEXT = (
    r'Checking\. <tool_call>\{"name": "get_weather", "arguments": '
    r'\{"city": "Paris", "unit": "celsius"\}\}</tool_call>'
)


def test_tool_choice_auto_with_the_hermes_parser_streamed_and_not(client: openai.OpenAI) -> None:
    # NOTE: the regex makes the model write a hermes tool call whatever it would say: the parser reads it.
    call = forced_tool_call(client, None, TOOLS, HERMES_TEXT)
    assert call.function.name == "get_weather" and _valid_call(call) == {"city": "Paris", "unit": "celsius"}
    # The call and its result in the history are accepted.
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    follow_up = client.chat.completions.create(
        model=None, messages=history, tools=TOOLS, tool_choice="none", max_tokens=10, temperature=0
    )
    assert follow_up.choices[0].message.content and not follow_up.choices[0].message.tool_calls


def _raw_tool_call_entries(server: RemoteServer, body: dict) -> list[list[dict]]:
    """The `delta.tool_calls` of each chunk of a streamed chat request, as the server sent them."""
    entries = []
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                entries += [c["delta"].get("tool_calls") or [] for c in json.loads(line[6:])["choices"]]
    return entries


@pytest.mark.sampled
@pytest.mark.parametrize(
    "choice, extra",
    [
        ({"type": "function", "function": {"name": "get_weather"}}, {}),
        ("required", {}),
        ("auto", {"guided_regex": HERMES_TEXT}),
    ],
    ids=["named", "required", "auto"],
)
def test_streamed_tool_calls_one_entry_per_call_index(
    server: RemoteServer, client: openai.OpenAI, choice: str | dict, extra: dict
) -> None:
    """Each chunk carries one entry per call index, the first with id, type, name and the arguments so
    far (two entries for index 0 in one chunk lost a client reading tool_calls[0] its arguments); they
    reassemble to the calls of the same request unstreamed."""
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": choice, "max_tokens": 80, "temperature": 0}
    whole = client.chat.completions.create(model=None, **body, extra_body=extra).choices[0].message
    calls: dict[int, dict] = {}
    for entries in _raw_tool_call_entries(server, {**body, **extra, "stream": True}):
        indexes = [entry["index"] for entry in entries]
        assert indexes == sorted(set(indexes)), entries
        for entry in entries:
            if entry["index"] not in calls:
                assert entry["type"] == "function" and entry["id"] and entry["function"]["name"], entry
                calls[entry["index"]] = {"name": entry["function"]["name"], "arguments": ""}
            calls[entry["index"]]["arguments"] += entry["function"]["arguments"]
    assert [calls[i] for i in sorted(calls)] == [
        {"name": c.function.name, "arguments": c.function.arguments} for c in whole.tool_calls
    ]


class Weather(BaseModel, PartialLiteralMixin):
    """PartialLiteralMixin: instructor's documented base for a model with a Literal field streamed as
    partials (a literal's partial string is left out until it is whole, not validated as '')."""

    city: str = Field(max_length=20)
    unit: Literal["celsius", "fahrenheit"]


def test_instructor_partial_streaming_and_the_openai_stream_helper(client: openai.OpenAI) -> None:
    """instructor's create_partial (TOOLS mode: a named tool_choice, read from tool_calls[0]) ends with
    the non-streamed result; the openai SDK's stream helper parses the same arguments."""
    model = client.models.list().data[0].id
    kwargs = dict(model=model, messages=ASK, max_tokens=80, temperature=0)
    patched = instructor.from_openai(client, mode=instructor.Mode.TOOLS)
    whole = patched.chat.completions.create(response_model=Weather, max_retries=0, **kwargs)
    partials = list(patched.chat.completions.create_partial(response_model=Weather, max_retries=0, **kwargs))
    assert len(partials) > 1 and partials[-1].model_dump() == whole.model_dump()
    tool = openai.pydantic_function_tool(Weather)
    choice = {"type": "function", "function": {"name": "Weather"}}
    with client.chat.completions.stream(tools=[tool], tool_choice=choice, **kwargs) as stream:
        argument_deltas = [e for e in stream if e.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert call.function.parsed_arguments.model_dump() == whole.model_dump()
    assert argument_deltas and all(e.arguments_delta for e in argument_deltas)
