"""Hostile input against one real server (started once for the module, with an API key and small input
bounds): every numeric field at its extremes (Ollama's /api fields too), every input bound, every route
with and without the key, and a 5 MB prompt that must not delay /health. Every answer is 200 or a 4xx
with an error body in its API's shape, and the engine still serves afterwards."""

import json
import threading
import time

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_utils import API_SERVER, RemoteServer

from pagedserve.entrypoints.openai.auth import PROBE_PATHS
from pagedserve.entrypoints.openai.protocol_ollama import OllamaOptions

API_KEY = "hostile-key"
MODEL = "tiny"
BODY_LIMIT = 6_000_000  # bytes: the 5 MB prompt passes and is tokenized; 7 MB is refused unread
BOUNDS = {
    "max-prompts-per-request": 4,
    "max-samples-per-request": 8,
    "max-chat-messages": 8,
    "max-stop-strings": 4,
    "max-stop-string-length": 16,
    "max-stop-token-ids": 8,
    "max-logit-bias-entries": 8,
    "max-request-body-bytes": BODY_LIMIT,
}
CHAT = [{"role": "user", "content": "Hi"}]
BASE = {
    "/v1/completions": {"prompt": "Hello", "max_tokens": 2},
    "/v1/chat/completions": {"messages": CHAT, "max_tokens": 2},
}


@pytest.fixture(scope="module")
def server(tiny_llama: str):
    args = [
        "--model",
        tiny_llama,
        "--served-model-name",
        MODEL,
        "--kv-cache-memory",
        "4MiB",
        "--uvicorn-log-level",
        "warning",
        "--api-key",
        API_KEY,
        "--metrics-require-api-key",
    ]
    for flag, value in BOUNDS.items():
        args += [f"--{flag}", str(value)]
    server = RemoteServer(API_SERVER, args, api_key=API_KEY)
    yield server
    server.stop()


def post(server: RemoteServer, path: str, body: object, timeout: float = 60) -> httpx.Response:
    # NOTE: json.dumps writes NaN and Infinity as JSON extensions, as many clients do.
    return httpx.post(
        server.base_url + path,
        content=json.dumps(body),
        timeout=timeout,
        headers={**server.headers(), "Content-Type": "application/json"},
    )


def assert_served_or_refused(response: httpx.Response, param: str | None = None) -> None:
    """200, or a 4xx with an OpenAI error body (naming `param` when given)."""
    if response.status_code == 200:
        return
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    error = response.json()["error"]
    assert error["code"] == response.status_code and error["message"] and error["type"]
    if param is not None:  # pydantic's param names the item too: logit_bias.0
        assert error["param"].split(".")[0] == param, error


def assert_still_serves(server: RemoteServer) -> None:
    response = server.client().completions.create(
        model=MODEL, prompt="Hello", max_tokens=3, temperature=0.8, seed=1
    )
    assert response.choices[0].finish_reason == "length" and response.usage.completion_tokens == 3
    assert server.proc.poll() is None


def test_seed_and_top_k_that_killed_the_engine(server: RemoteServer) -> None:
    client = server.client()
    for seed in (10**14, 2**63 - 1, -(2**63)):
        response = client.completions.create(
            model=MODEL, prompt="Hello", max_tokens=3, temperature=1.0, seed=seed
        )
        assert response.usage.completion_tokens == 3
    for field, value in (("seed", 2**63), ("seed", -(2**63) - 1), ("top_k", 2**63), ("top_k", 2**64 - 1)):
        response = post(
            server, "/v1/completions", {**BASE["/v1/completions"], "temperature": 1, field: value}
        )
        assert response.status_code == 400 and "9223372036854775807" in response.json()["error"]["message"]
        assert_served_or_refused(response, field)
    big_top_k = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=2, extra_body={"top_k": 10**9}
    )
    assert big_top_k.usage.completion_tokens == 2  # above the vocabulary: every token, as top_k=0
    assert_still_serves(server)


NUMERIC_FIELDS = {
    "/v1/completions": [
        "n",
        "best_of",
        "max_tokens",
        "min_tokens",
        "top_k",
        "top_p",
        "min_p",
        "temperature",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logprobs",
        "seed",
        "truncate_prompt_tokens",
        "timeout",
        "length_penalty",
    ],
    "/v1/chat/completions": [
        "n",
        "max_tokens",
        "max_completion_tokens",
        "min_tokens",
        "top_k",
        "top_p",
        "min_p",
        "temperature",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "top_logprobs",
        "seed",
        "truncate_prompt_tokens",
        "timeout",
    ],
}
EXTREMES = st.sampled_from(
    [
        2**63,
        -(2**63),
        2**63 - 1,
        2**64,
        -1,
        0,
        1,
        2,
        0.5,
        1e-300,
        1e300,
        float("nan"),
        float("inf"),
        float("-inf"),
        2.5,
        "7",
        "abc",
        None,
        True,
        [1] * 10_000,
        {"a": 1},
    ]
)
ROUTE_AND_FIELD = st.sampled_from([(path, name) for path, names in NUMERIC_FIELDS.items() for name in names])


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(route_and_field=ROUTE_AND_FIELD, value=EXTREMES, temperature=st.sampled_from([0.0, 1.0]))
def test_numeric_field_extremes(
    server: RemoteServer, route_and_field: tuple[str, str], value: object, temperature: float
) -> None:
    path, field = route_and_field
    extra = (
        {"logprobs": True}
        if field == "top_logprobs"
        else {"use_beam_search": True}
        if field == "length_penalty"
        else {}
    )
    body = {**BASE[path], "temperature": temperature, **extra, field: value}
    assert_served_or_refused(post(server, path, body))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    key=st.sampled_from(["0", "-1", "49151", "49152", str(2**63), str(2**64), "1.5", "x", ""]),
    value=st.sampled_from([-100, 100, 100.5, -1e300, float("nan"), float("inf"), "5", None]),
    path=st.sampled_from(list(BASE)),
)
def test_logit_bias_extremes(server: RemoteServer, key: str, value: object, path: str) -> None:
    assert_served_or_refused(post(server, path, {**BASE[path], "logit_bias": {key: value}}), "logit_bias")


# Ollama's fields (/api/chat, /api/generate): every option, and the top-level ones. num_predict is left
# out (its unbounded values generate to the end of the context); its bounds are test_ollama_api.py's.
OLLAMA_FIELDS = [
    *(("options", name) for name in OllamaOptions.model_fields if name != "num_predict"),
    ("", "keep_alive"),
    ("", "think"),
    ("", "format"),
]


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    field=st.sampled_from(OLLAMA_FIELDS),
    value=EXTREMES,
    path=st.sampled_from(["/api/chat", "/api/generate"]),
)
def test_ollama_field_extremes(
    server: RemoteServer, field: tuple[str, str], value: object, path: str
) -> None:
    where, name = field
    options: dict[str, object] = {"num_predict": 2, **({name: value} if where else {})}
    body = {"model": MODEL, "messages": CHAT, "prompt": "Hi", "stream": False, "options": options}
    response = post(server, path, body if where else {**body, name: value})
    if response.status_code == 200:
        assert response.json()["done"] is True
        return
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    error = response.json()["error"]  # Ollama's shape: the message alone, naming the field
    assert isinstance(error, str) and name in error, error


def test_still_serves_after_the_sweeps(server: RemoteServer) -> None:
    assert_still_serves(server)


BOUND_CASES = [  # path, extra body fields, param, the flag named in the message
    ("/v1/completions", {"prompt": ["a"] * 5}, "prompt", "--max-prompts-per-request"),
    ("/v1/completions", {"prompt": [[1, 2]] * 5}, "prompt", "--max-prompts-per-request"),
    ("/v1/completions", {"prompt": ["a"] * 3, "n": 3}, "n", "--max-samples-per-request"),
    ("/v1/completions", {"prompt": ["a"] * 2, "n": 1, "best_of": 5}, "n", "--max-samples-per-request"),
    ("/v1/chat/completions", {"messages": CHAT * 9}, "messages", "--max-chat-messages"),
    ("/tokenize", {"messages": CHAT * 9}, "messages", "--max-chat-messages"),
    ("/v1/completions", {"stop": ["x"] * 5}, "stop", "--max-stop-strings"),
    ("/v1/chat/completions", {"stop": "x" * 17}, "stop", "--max-stop-string-length"),
    ("/v1/completions", {"stop_token_ids": [5] * 9}, "stop_token_ids", "--max-stop-token-ids"),
    (
        "/v1/chat/completions",
        {"logit_bias": {str(i): 1 for i in range(9)}},
        "logit_bias",
        "--max-logit-bias-entries",
    ),
]


@pytest.mark.parametrize("path,extra,param,flag", BOUND_CASES)
def test_input_bounds(server: RemoteServer, path: str, extra: dict, param: str, flag: str) -> None:
    response = post(server, path, {**BASE.get(path, {}), **extra})
    assert response.status_code == 400, response.text
    assert_served_or_refused(response, param)
    assert flag in response.json()["error"]["message"]


def test_at_the_bounds_is_served(server: RemoteServer) -> None:
    body = {
        "prompt": ["a"] * 4,
        "n": 2,
        "max_tokens": 2,
        "stop": ["x" * 16] * 4,
        "stop_token_ids": [5] * 8,
        "logit_bias": {str(i): 1 for i in range(8)},
    }
    response = post(server, "/v1/completions", body)
    assert response.status_code == 200 and len(response.json()["choices"]) == 8
    assert post(server, "/v1/chat/completions", {"messages": CHAT * 8, "max_tokens": 2}).status_code == 200


def test_body_size_is_refused_unread(server: RemoteServer) -> None:
    body = json.dumps({"prompt": "a" * 7_000_000}).encode()
    declared = httpx.post(
        server.base_url + "/v1/completions",
        content=body,
        timeout=60,
        headers={**server.headers(), "Content-Type": "application/json"},
    )

    def chunks():  # no Content-Length: the server counts what arrives
        for start in range(0, len(body), 1 << 20):
            yield body[start : start + (1 << 20)]

    streamed = httpx.post(
        server.base_url + "/v1/completions",
        content=chunks(),
        timeout=60,
        headers={**server.headers(), "Content-Type": "application/json"},
    )
    for response in (declared, streamed):
        assert response.status_code == 413
        assert "--max-request-body-bytes" in response.json()["error"]["message"]
    assert_still_serves(server)


def test_health_answers_while_a_5mb_prompt_is_tokenized(server: RemoteServer) -> None:
    """The prompt is tokenized in a thread (seconds here): /health never waits for it. truncate_prompt_tokens
    keeps its last 8 tokens, so it is answered."""
    prompt = "hello world, this is a prompt. " * (5_000_000 // 31)
    result: list[httpx.Response] = []
    sender = threading.Thread(
        target=lambda: result.append(
            post(
                server,
                "/v1/completions",
                {"prompt": prompt, "max_tokens": 2, "truncate_prompt_tokens": 8},
                300,
            )
        )
    )
    sender.start()
    time.sleep(1.0)  # the body is sent and parsed: tokenizing has begun
    latencies = []
    while sender.is_alive():
        start = time.monotonic()
        assert httpx.get(server.base_url + "/health", timeout=5).status_code == 200
        latencies.append(time.monotonic() - start)
        time.sleep(0.1)
    sender.join()
    assert len(latencies) >= 3, "the 5 MB prompt was done before /health was asked: nothing overlapped"
    assert max(latencies) < 1.0, latencies
    assert result[0].status_code == 200, result[0].text
    assert result[0].json()["usage"]["prompt_tokens"] == 8


def test_every_route_needs_the_key_but_the_probes(server: RemoteServer) -> None:
    schema = httpx.get(server.base_url + "/openapi.json", headers=server.headers(), timeout=10).json()
    # The schema's routes, plus the routes FastAPI and the dashboard keep out of it.
    routes = {(method.upper(), path) for path, methods in schema["paths"].items() for method in methods}
    routes |= {
        ("GET", path)
        for path in (
            "/openapi.json",
            "/docs",
            "/docs/oauth2-redirect",
            "/redoc",
            "/dashboard",
            "/health",
            "/ready",
            "/metrics",
            "/nonexistent",
        )
    }
    assert {("POST", "/tokenize"), ("POST", "/reset_prefix_cache"), ("GET", "/dashboard/state")} <= routes
    assert {("HEAD", "/"), ("GET", "/api/version"), ("POST", "/api/chat"), ("GET", "/api/tags")} <= routes
    for method, path in sorted(routes):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            response = httpx.request(method, server.base_url + path, headers=headers, timeout=10)
            if path in PROBE_PATHS:
                assert response.status_code == 200, (method, path)
            elif path.startswith("/api/"):  # Ollama's API: {"error": message}
                assert response.status_code == 401, (method, path, response.status_code)
                assert "API key" in response.json()["error"]
            else:
                assert response.status_code == 401, (method, path, response.status_code)
                anthropic_shape = path.startswith("/v1/messages")  # Anthropic's Messages API
                expected = "authentication_error" if anthropic_shape else "AuthenticationError"
                assert response.json()["error"]["type"] == expected
        with_key = httpx.request(method, server.base_url + path, headers=server.headers(), timeout=10)
        assert with_key.status_code != 401, (method, path)
    metrics = httpx.get(server.base_url + "/metrics", headers=server.headers(), timeout=10)
    assert metrics.status_code == 200 and "pagedserve:" in metrics.text
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="wrong", max_retries=0).models.list()
    # Anthropic's header is taken as well.
    assert {
        ("POST", "/v1/messages"),
        ("POST", "/v1/responses"),
        ("DELETE", "/v1/responses/{response_id}"),
    } <= routes
    count = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    for key, status in ((API_KEY, 200), ("wrong", 401)):
        response = httpx.post(
            server.base_url + "/v1/messages/count_tokens", json=count, headers={"x-api-key": key}, timeout=10
        )
        assert response.status_code == status, response.text


LONE = "\ud800"  # a high surrogate without its low half: json.dumps sends the escape "\ud800"
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}
LONE_SURROGATE_CASES = [  # route, body fields, the field the error names
    ("/v1/completions", {"prompt": LONE}, "prompt"),
    ("/v1/completions", {"prompt": ["fine", "a" + LONE + "b"]}, "prompt[1]"),
    ("/v1/completions", {"stop": ["x", "\udfff"]}, "stop[1]"),
    ("/v1/completions", {"cache_salt": LONE}, "cache_salt"),
    ("/v1/completions", {"user": LONE}, "user"),
    ("/v1/completions", {"guided_regex": LONE}, "guided_regex"),
    ("/v1/completions", {"guided_choice": ["a", LONE]}, "guided_choice[1]"),
    ("/v1/completions", {"structured_outputs": {"grammar": LONE}}, "structured_outputs.grammar"),
    (
        "/v1/completions",
        {"guided_json": {"type": "object", "properties": {LONE: {"type": "string"}}}},
        'guided_json.properties["\\ud800"]',
    ),
    ("/v1/completions", {"logit_bias": {LONE: 1}}, 'logit_bias["\\ud800"]'),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONE}]}, "messages[0].content"),
    (
        "/v1/chat/completions",
        {"messages": [*CHAT, {"role": "assistant", "content": [{"type": "text", "text": LONE}]}]},
        "messages[1].content[0].text",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi", "name": LONE}]},
        "messages[0].name",
    ),
    (
        "/v1/chat/completions",
        {"tools": [WEATHER, {"type": "function", "function": {"name": "f", "description": LONE}}]},
        "tools[1].function.description",
    ),
    (
        "/v1/chat/completions",
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": LONE}}},
        "tool_choice.function.name",
    ),
    (
        "/v1/chat/completions",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"enum": [LONE]}},
            }
        },
        "response_format.json_schema.schema.enum[0]",
    ),
    ("/tokenize", {"prompt": LONE}, "prompt"),
    ("/tokenize", {"messages": [{"role": "user", "content": LONE}]}, "messages[0].content"),
    ("/detokenize", {"tokens": [1, 2], "model": LONE}, "model"),
]


@pytest.mark.parametrize("path,extra,param", LONE_SURROGATE_CASES)
def test_lone_surrogates_are_refused_naming_the_field(
    server: RemoteServer, path: str, extra: dict, param: str
) -> None:
    response = post(server, path, {**BASE.get(path, {}), **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and f"{param} holds a lone UTF-16 surrogate" in error["message"], error


def test_lone_surrogates_raw_in_utf8_and_valid_pairs(server: RemoteServer) -> None:
    """A surrogate's own UTF-8 bytes (which json.loads reads too) are refused the same way; a valid pair,
    escaped or not, is ordinary text."""
    raw = httpx.post(
        server.base_url + "/v1/completions",
        content=b'{"prompt": "a\xed\xa0\x80", "max_tokens": 2}',
        timeout=60,
        headers={**server.headers(), "Content-Type": "application/json"},
    )
    assert raw.status_code == 400 and raw.json()["error"]["param"] == "prompt", raw.text
    for prompt in (
        "\U0001f600 smile",
        "\ud83d\ude00 smile",
    ):  # the same text: json.dumps escapes it as a pair
        response = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 2})
        assert response.status_code == 200, response.text
    assert_still_serves(server)


@pytest.mark.parametrize("key", [" 5", "5 ", "+5", "-0", "\u0663", "\uff15", "5_0", "0x5", "5.0", "²"])
def test_logit_bias_keys_are_ascii_digits_only(server: RemoteServer, key: str) -> None:
    """int() reads all of these as a token id; JSON's keys are token ids in ASCII digits, nothing else."""
    for path in BASE:
        response = post(server, path, {**BASE[path], "logit_bias": {key: 1}})
        assert response.status_code == 400, (key, response.text)
        error = response.json()["error"]
        assert error["param"] == "logit_bias" and json.dumps(key) in error["message"], error
        assert "ASCII digits" in error["message"]
    assert (
        post(server, "/v1/completions", {**BASE["/v1/completions"], "logit_bias": {"5": 1}}).status_code
        == 200
    )


def test_duplicate_tool_names_are_refused(server: RemoteServer) -> None:
    other = {"type": "function", "function": {"name": "other"}}
    for choice in ("none", "required"):
        body = {**BASE["/v1/chat/completions"], "tools": [WEATHER, other, WEATHER], "tool_choice": choice}
        response = post(server, "/v1/chat/completions", body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "tools[2].function.name", error
        assert "'get_weather'" in error["message"] and "tools[0]" in error["message"]


def nested_schema(levels: int) -> dict:
    """Objects in objects, `levels` JSON levels deep (2 per object: "properties", then its schema)."""
    schema: dict = {"type": "string"}
    for _ in range((levels - 1) // 2):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


DEEP = nested_schema(501)  # 500 levels was a RecursionError (500) while the schema was walked
DEEP_TOOL = {"type": "function", "function": {"name": "deep", "parameters": DEEP}}
DEPTH_CASES = [  # path, extra body fields, param
    ("/v1/completions", {"guided_json": DEEP}, "structured_outputs.json"),
    ("/v1/completions", {"structured_outputs": {"json": DEEP}}, "structured_outputs.json"),
    (
        "/v1/chat/completions",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": DEEP}}},
        "structured_outputs.json",
    ),
    (
        "/v1/chat/completions",
        {"tools": [WEATHER, DEEP_TOOL], "tool_choice": "required"},
        "tools[1].function.parameters",
    ),
    ("/v1/chat/completions", {"tools": [DEEP_TOOL], "tool_choice": "none"}, "tools[0].function.parameters"),
    (
        "/v1/completions",
        {"guided_grammar": "root ::= " + "(" * 500 + '"a"' + ")" * 500},
        "structured_outputs.grammar",
    ),
]


@pytest.mark.parametrize("path,extra,param", DEPTH_CASES)
def test_deeply_nested_constraints_are_refused(
    server: RemoteServer, path: str, extra: dict, param: str
) -> None:
    response = post(server, path, {**BASE[path], **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and f"{param} is nested too deeply" in error["message"], error
    assert "more than the limit of" in error["message"]


def test_constraint_at_the_depth_limit_is_served(server: RemoteServer) -> None:
    body = {**BASE["/v1/completions"], "guided_json": nested_schema(100)}
    assert post(server, "/v1/completions", body).status_code == 200
    tool = {"type": "function", "function": {"name": "f", "parameters": nested_schema(98)}}
    body = {**BASE["/v1/chat/completions"], "tools": [tool], "tool_choice": "required"}
    assert post(server, "/v1/chat/completions", body).status_code == 200


def test_still_serves_after_the_unicode_key_and_depth_cases(server: RemoteServer) -> None:
    assert_still_serves(server)
