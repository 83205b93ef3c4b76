"""Ollama's API (/api/...) on the shared SmolLM2 server (conftest.py), driven by the official `ollama`
client and by the curl examples of Ollama's API documentation (JSON bodies sent without a JSON
Content-Type, as curl -d does): greedy answers equal to chat completions' and completions', the stream
equal to the whole answer with Ollama's counters in its last line, `format` with a pydantic schema, tool
calls both ways, options.num_ctx as a context bound, list / show / ps / pull / version and the probes (and
a clear 400 from the model-management routes), and bad
input as a 400 or 404 in Ollama's error shape naming the field while the server keeps serving. The
thinking and embedding routes are tested on their servers (test_reasoning_server.py,
test_pooling_server.py)."""

import json

import httpx
import ollama
import pytest
from gguf import GGUFReader, LlamaFileType
from pydantic import BaseModel
from server_utils import RemoteServer

from pagedserve import __version__

ASK = [{"role": "user", "content": "Say hello to Ada."}]
SYSTEM = {"role": "system", "content": "Be brief."}
RAW = "The capital of France is"
GREEDY = {"temperature": 0}
COUNTERS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _weather_call(city: str) -> dict:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": city}}}],
    }


# Two earlier calls: greedy SmolLM2 then answers the third question with a call too.
CALLS = [
    {"role": "user", "content": "Weather in Rome?"},
    _weather_call("Rome"),
    {"role": "user", "content": "Weather in Berlin?"},
    _weather_call("Berlin"),
    {"role": "user", "content": "Weather in Paris?"},
]


@pytest.fixture(scope="module")
def client(smol_server: RemoteServer) -> ollama.Client:
    return ollama.Client(host=smol_server.base_url, timeout=120)


def curl(server: RemoteServer, path: str, body: object) -> httpx.Response:
    """As `curl URL -d BODY`: JSON sent as form data, the way Ollama's documentation shows it."""
    return httpx.post(server.base_url + path, content=json.dumps(body), timeout=120)


def test_chat_and_generate_equal_chat_completions_and_the_stream_equals_the_whole(
    client: ollama.Client, smol_server: RemoteServer
) -> None:
    options = {**GREEDY, "num_predict": 4}
    whole = client.chat(model="smol", messages=[SYSTEM, *ASK], options=options)
    chat = smol_server.client().chat.completions.create(
        model="smol", messages=[SYSTEM, *ASK], max_tokens=4, temperature=0
    )
    assert whole.message.content == chat.choices[0].message.content
    assert (whole.done, whole.done_reason, whole.eval_count) == (True, "length", 4)
    assert whole.prompt_eval_count == chat.usage.prompt_tokens
    assert whole.total_duration >= whole.prompt_eval_duration + whole.eval_duration > 0
    parts = list(client.chat(model="smol:latest", messages=[SYSTEM, *ASK], options=options, stream=True))
    assert "".join(part.message.content for part in parts) == whole.message.content
    assert [part.done for part in parts] == [False] * (len(parts) - 1) + [True]
    assert all(parts[-1][name] is not None for name in COUNTERS) and parts[-1].eval_count == 4
    # /api/generate: the prompt (and system) through the same template.
    templated = client.generate(
        model="smol", prompt=ASK[0]["content"], system=SYSTEM["content"], options=options
    )
    assert (templated.response, templated.prompt_eval_count) == (
        whole.message.content,
        whole.prompt_eval_count,
    )


def test_raw_generate_equals_completions_and_stops(client: ollama.Client, smol_server: RemoteServer) -> None:
    options = {**GREEDY, "num_predict": 4}
    raw = client.generate(model="smol", prompt=RAW, raw=True, options=options)
    completion = smol_server.client().completions.create(
        model="smol", prompt=RAW, max_tokens=4, temperature=0
    )
    assert raw.response == completion.choices[0].text and raw.eval_count == 4
    stop = raw.response.strip()[:2]
    stopped = client.generate(model="smol", prompt=RAW, raw=True, options={**options, "stop": [stop]})
    assert stopped.response == raw.response[: raw.response.index(stop)] and stopped.done_reason == "stop"


def test_format_with_a_pydantic_schema(client: ollama.Client) -> None:
    class Pet(BaseModel):
        name: str
        age: int

    answer = client.chat(
        model="smol",
        messages=[{"role": "user", "content": "A pet as JSON."}],
        format=Pet.model_json_schema(),
        options={**GREEDY, "num_predict": 40},
    )
    assert answer.done_reason == "stop"
    Pet.model_validate_json(answer.message.content)


@pytest.mark.sampled
@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_both_ways(client: ollama.Client, smol_server: RemoteServer, stream: bool) -> None:
    """Earlier calls (message.tool_calls) go through the template as chat completions' tool_calls do, and
    the answer's call comes back parsed, its arguments an object (streamed: in a line of its own)."""
    ask = dict(model="smol", messages=CALLS, tools=[WEATHER], options={**GREEDY, "num_predict": 30})
    if stream:
        parts = list(client.chat(**ask, stream=True))
        calls = [call for part in parts for call in part.message.tool_calls or ()]
        content, answer = "".join(part.message.content for part in parts), parts[-1]
    else:
        answer = client.chat(**ask)
        calls, content = list(answer.message.tool_calls or ()), answer.message.content
    (call,) = calls
    assert (call.function.name, call.function.arguments) == ("get_weather", {"city": "Paris"})
    assert answer.done_reason == "stop" and not content
    openai_messages = [
        {
            **m,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": json.dumps(m["tool_calls"][0]["function"]["arguments"]),
                    },
                }
            ],
        }
        if "tool_calls" in m
        else m
        for m in CALLS
    ]
    chat = smol_server.client().chat.completions.create(
        model="smol", messages=openai_messages, tools=[WEATHER], max_tokens=1
    )
    assert answer.prompt_eval_count == chat.usage.prompt_tokens


def test_num_ctx_bounds_the_answer(client: ollama.Client, smol_server: RemoteServer) -> None:
    """options.num_ctx holds the prompt and the answer, templated or raw; a prompt that fills it is a 400."""
    for call, fields, tokenize in (
        (client.chat, {"messages": ASK}, {"messages": ASK}),
        (client.generate, {"prompt": RAW, "raw": True}, {"prompt": RAW}),
    ):
        prompt_tokens = httpx.post(smol_server.base_url + "/tokenize", json=tokenize, timeout=30).json()[
            "count"
        ]
        bounded = call(model="smol", **fields, options={**GREEDY, "num_ctx": prompt_tokens + 2})
        assert (bounded.prompt_eval_count, bounded.eval_count, bounded.done_reason) == (
            prompt_tokens,
            2,
            "length",
        )
        with pytest.raises(ollama.ResponseError, match="num_ctx") as refused:
            call(model="smol", **fields, options={"num_ctx": prompt_tokens})
        assert refused.value.status_code == 400


def test_list_show_ps_version_and_the_probes(
    client: ollama.Client, smol_server: RemoteServer, default_model: str
) -> None:
    # The file read with gguf's own reader: Ollama's parameter_size is its tensors' elements in millions
    # with two decimals (format.HumanNumber), its quantization_level the file type's name.
    reader = GGUFReader(default_model)
    parameters = sum(int(tensor.n_elements) for tensor in reader.tensors)
    file_type = LlamaFileType(reader.fields["general.file_type"].contents())
    assert (parameters, file_type) == (134_515_008, LlamaFileType.MOSTLY_Q4_1)
    details = {"parameter_size": "134.52M", "quantization_level": "Q4_1"}
    (listed,) = client.list().models
    assert listed.model == "smol" and listed.size > 0 and listed.details.format == "gguf"
    shown = client.show("smol")
    assert shown.capabilities == ["completion", "tools"] and "<tool_call>" in shown.template
    assert shown.modelinfo["llama.context_length"] == 1024
    assert shown.modelinfo["general.parameter_count"] == parameters
    (running,) = client.ps().models
    assert running.model == "smol" and running.size > 0 and running.context_length == 1024
    for described in (listed.details, shown.details, running.details):
        assert described is not None and described.model_dump(include=set(details)) == details
    assert httpx.get(smol_server.base_url + "/api/version", timeout=10).json() == {"version": __version__}
    # A served model is pulled already (whole, or streamed as one line); nothing else is managed here.
    assert client.pull("smol").status == "success"
    assert [p.status for p in client.pull("smol:latest", stream=True)] == ["success"]
    for manage in (
        lambda: client.copy("smol", "other"),
        lambda: client.delete("smol"),
        lambda: client.push("smol"),
    ):
        with pytest.raises(ollama.ResponseError) as refused:
            manage()
        assert refused.value.status_code == 400 and "--models-dir" in refused.value.error
    for method in ("GET", "HEAD"):
        response = httpx.request(method, smol_server.base_url + "/", timeout=10)
        assert response.status_code == 200 and response.text == (
            "Ollama is running" if method == "GET" else ""
        )


def test_the_documentations_curl_examples(smol_server: RemoteServer) -> None:
    lines = curl(
        smol_server,
        "/api/generate",
        {"model": "smol", "prompt": "Why is the sky blue?", "options": {"num_predict": 2}},
    )
    assert lines.headers["content-type"] == "application/x-ndjson"
    replies = [json.loads(line) for line in lines.text.splitlines()]
    assert [r["done"] for r in replies][-1] and all(name in replies[-1] for name in COUNTERS)
    chat = curl(
        smol_server,
        "/api/chat",
        {
            "model": "smol",
            "messages": [{"role": "user", "content": "why is the sky blue?"}],
            "stream": False,
            "options": {"num_predict": 2},
        },
    ).json()
    assert chat["message"]["role"] == "assistant" and chat["eval_count"] == 2
    for path, kind in (("/api/generate", {"prompt": ""}), ("/api/chat", {"messages": []})):
        loaded = curl(smol_server, path, {"model": "smol", **kind}).json()
        assert (loaded["done"], loaded["done_reason"]) == (True, "load")
    show = curl(smol_server, "/api/show", {"model": "smol"}).json()
    assert show["details"]["family"] == "llama"


BAD = [  # path, body fields, status, what the message names
    ("/api/chat", {"model": "../smol"}, 404, "../smol"),
    ("/api/chat", {"model": "/etc/passwd"}, 404, "/etc/passwd"),
    ("/api/generate", {"model": "nope:latest"}, 404, "nope:latest"),
    ("/api/show", {"model": "nope"}, 404, "nope"),
    ("/api/chat", {"keep_alive": "5 parsecs"}, 400, "keep_alive"),
    ("/api/chat", {"keep_alive": 1e300}, 400, "keep_alive"),
    ("/api/chat", {"keep_alive": True}, 400, "keep_alive"),
    ("/api/chat", {"options": {"num_ctx": -1}}, 400, "num_ctx"),
    ("/api/chat", {"options": {"num_predict": -3}}, 400, "num_predict"),
    ("/api/chat", {"options": {"num_predict": 2**63}}, 400, "num_predict"),
    ("/api/chat", {"options": {"mirostat": 2}}, 400, "options.mirostat"),
    ("/api/chat", {"options": {"repeat_last_n": 64}}, 400, "options.repeat_last_n"),
    ("/api/chat", {"options": {"temperature": "hot"}}, 400, "temperature"),
    ("/api/chat", {"options": {"top_k": 2**64}}, 400, "top_k"),
    ("/api/chat", {"options": {"top_p": 7}}, 400, "options.top_p"),
    ("/api/chat", {"options": {"stop": "x"}}, 400, "stop"),
    ("/api/chat", {"options": {"stop": ["x"] * 100}}, 400, "options.stop"),
    ("/api/chat", {"options": [1, 2]}, 400, "options"),
    ("/api/chat", {"messages": [{"role": "user", "content": "Hi", "images": ["aGk="]}]}, 400, "images"),
    ("/api/chat", {"messages": [{"role": "robot", "content": "Hi"}]}, 400, "role"),
    ("/api/chat", {"think": True}, 400, "think"),
    ("/api/chat", {"format": "yaml"}, 400, "format"),
    ("/api/chat", {"stream": "yes"}, 400, "stream"),
    ("/api/generate", {"prompt": "Hi", "context": [1, 2]}, 400, "context"),
    ("/api/generate", {"prompt": "Hi", "suffix": "end"}, 400, "suffix"),
    ("/api/generate", {"prompt": "Hi", "template": "{{ .Prompt }}"}, 400, "template"),
    ("/api/generate", {"prompt": "Hi", "images": ["aGk="]}, 400, "images"),
    ("/api/embed", {"input": "Hi"}, 400, "pooling"),
    ("/api/pull", {"model": "nope"}, 404, "nope"),
    ("/api/pull", {"model": None}, 400, "model"),
    ("/api/pull", {"model": 5}, 400, "model"),
    ("/api/pull", {"stream": "yes"}, 400, "stream"),
    ("/api/create", {"from": "smol"}, 400, "does not create"),
]


@pytest.mark.parametrize("path,fields,status,named", BAD, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD)])
def test_bad_input_in_ollamas_error_shape(
    smol_server: RemoteServer, path: str, fields: dict, status: int, named: str
) -> None:
    body = {"model": "smol", "messages": ASK, "options": {"num_predict": 1}, **fields}
    response = curl(smol_server, path, body)
    assert response.status_code == status, response.text
    assert list(response.json()) == ["error"] and named in response.json()["error"]


def test_still_serves_after_the_bad_input(client: ollama.Client) -> None:
    assert client.chat(model="smol", messages=ASK, options={"num_predict": 2}).eval_count == 2
