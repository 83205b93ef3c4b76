"""A vLLM deployment moved over as written: VLLM_API_KEY, vLLM's request fields and flags (a Qwen3-Coder
tool-call parser among them), against a real server on 127.0.0.1 (the official openai client and httpx)."""

import json

import httpx
import openai
import pytest
from server_utils import API_SERVER, RemoteServer, forced_tool_call

API_KEY = "vllm-key"
NAMES = ("tiny", "tiny-alias")
ORIGIN = "https://app.example"
ASK = [{"role": "user", "content": "Hello"}]
# Shows what reaches the template: documents, an extra kwarg, and whether the last message is continued.
TEMPLATE = (
    "{% for d in documents or [] %}[doc {{ d.title }}]{% endfor %}"
    "{% if enable_thinking %}[thinking]{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% if not (continue_final_message and loop.last) %}</{{ m.role }}>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="module")
def server(tiny_llama: str, tmp_path_factory: pytest.TempPathFactory):
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(TEMPLATE)
    args = [
        "--model",
        tiny_llama,
        "--served-model-name",
        *NAMES,
        "--kv-cache-memory-bytes",
        str(4 * 2**20),
        "-tp",
        "1",
        "--max-logprobs",
        "5",
        "--chat-template",
        str(template),
        "--allowed-origins",
        json.dumps([ORIGIN]),
        "--trust-remote-code",
        "--enable-chunked-prefill",
        "--enable-log-requests",
        "--enable-prompt-tokens-details",
        "--max-chat-template-kwargs",
        "4",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "qwen3_coder",
        "--uvicorn-log-level",
        "warning",
    ]
    # Only vLLM's variable: the server must still require the key.
    env = {"VLLM_API_KEY": API_KEY, "PAGEDSERVE_API_KEY": ""}
    server = RemoteServer(API_SERVER, args, api_key=API_KEY, env=env)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    return server.client()


def post(server: RemoteServer, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, headers=server.headers(), timeout=60)


def rendered(server: RemoteServer, body: dict) -> str:
    """The prompt the chat template made of `body` (through /tokenize and /detokenize)."""
    tokens = post(server, "/tokenize", {"messages": ASK, **body})
    assert tokens.status_code == 200, tokens.text
    return post(server, "/detokenize", {"tokens": tokens.json()["tokens"]}).json()["prompt"]


def assert_bad_request(response: httpx.Response, param: str, words: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_vllm_api_key_is_required_and_probes_stay_open(server: RemoteServer) -> None:
    body = {"model": NAMES[0], "prompt": "hi", "max_tokens": 1}
    refused = httpx.post(server.base_url + "/v1/completions", json=body, timeout=60)
    assert refused.status_code == 401 and "VLLM_API_KEY" in refused.json()["error"]["message"]
    assert post(server, "/v1/completions", body).status_code == 200
    for path in ("/health", "/ping", "/ready", "/version", "/metrics"):
        assert httpx.get(server.base_url + path, timeout=10).status_code == 200, path
    assert httpx.post(server.base_url + "/ping", timeout=10).status_code == 200  # SageMaker's probe


def test_sagemaker_invocations_run_the_route_their_body_names(server: RemoteServer) -> None:
    """POST /invocations (vLLM's SageMaker route) answers as the route its body is for would: chat by
    `messages`, completions by `prompt` (streamed too), embeddings by `input` (a 400 on this generation
    model, as /v1/embeddings gives); behind the key; hostile bodies get a 400 and the server serves on."""
    chat = {"model": NAMES[0], "messages": ASK, "max_tokens": 4, "temperature": 0}
    completion = {"model": NAMES[0], "prompt": "hi", "max_tokens": 4, "temperature": 0}
    assert httpx.post(server.base_url + "/invocations", json=chat, timeout=60).status_code == 401
    for body, path, field in (
        (chat, "/v1/chat/completions", "choices"),
        (completion, "/v1/completions", "choices"),
    ):
        direct, routed = post(server, path, body), post(server, "/invocations", body)
        assert routed.status_code == direct.status_code == 200, routed.text
        assert routed.json()["object"] == direct.json()["object"]
        assert routed.json()[field][0] == direct.json()[field][0]
    streamed = post(server, "/invocations", {**completion, "stream": True})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.text.rstrip().endswith("data: [DONE]")
    embeddings = {"model": NAMES[0], "input": "hi"}
    assert (
        post(server, "/invocations", embeddings).json() == post(server, "/v1/embeddings", embeddings).json()
    )
    assert_bad_request(post(server, "/invocations", {**chat, "messages": 5}), "messages", "valid list")
    # SageMaker clients may send no JSON content type: the body is read as JSON all the same.
    untyped = httpx.post(
        server.base_url + "/invocations", content=json.dumps(chat), headers=server.headers(), timeout=60
    )
    assert untyped.status_code == 200 and untyped.json()["object"] == "chat.completion", untyped.text
    assert_bad_request(
        post(server, "/invocations", {**chat, "max_tokens": 2**64}), "max_tokens", "max_tokens"
    )
    for raw in (b"", b"not json", b"[1, 2]", b"{}", b"[" * 100_000, b'{"x": NaN}', b"\xff\xfe"):
        response = httpx.post(
            server.base_url + "/invocations", content=raw, headers=server.headers(), timeout=60
        )
        assert_bad_request(response, "body", "'messages' (/v1/chat/completions)")
    assert post(server, "/invocations", chat).status_code == 200


def test_cached_prompt_tokens_are_reported_by_every_api(client: openai.OpenAI) -> None:
    """usage.prompt_tokens_details.cached_tokens (chat, completions, whole or streamed) and the Responses
    API's input_tokens_details.cached_tokens: 0 for a prompt first seen, then every whole block of it
    (16 tokens) but the one holding its last token, which is always computed."""
    ask = [{"role": "user", "content": "Tell me about caches. " * 12}]
    text = "A prompt long enough for several blocks. " * 6

    def chat(stream: bool) -> tuple[int, int]:
        kwargs = dict(model=NAMES[0], messages=ask, max_tokens=1)
        if not stream:
            usage = client.chat.completions.create(**kwargs).usage
        else:
            chunks = client.chat.completions.create(
                **kwargs, stream=True, stream_options={"include_usage": True}
            )
            usage = [c.usage for c in chunks if c.usage][-1]
        return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens

    def completion() -> tuple[int, int]:
        usage = client.completions.create(model=NAMES[0], prompt=text, max_tokens=1).usage
        return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens

    def response() -> tuple[int, int]:
        usage = client.responses.create(model=NAMES[0], input=text, max_output_tokens=2).usage
        return usage.input_tokens, usage.input_tokens_details.cached_tokens

    for run, again in (
        (lambda: chat(False), lambda: chat(True)),
        (completion, completion),
        (response, response),
    ):
        num_prompt, cached = run()
        assert cached == 0 and num_prompt > 32
        num_prompt, cached = again()
        assert cached == (num_prompt - 1) // 16 * 16 > 0


def test_every_served_name_is_listed_and_accepted(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == list(NAMES)
    for name in NAMES:
        response = client.completions.create(model=name, prompt="hi", max_tokens=2)
        assert response.model == NAMES[0]
    with pytest.raises(openai.NotFoundError, match="tiny-alias"):
        client.completions.create(model="other", prompt="hi", max_tokens=2)


def test_cors_only_for_the_allowed_origins(server: RemoteServer) -> None:
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
    allowed = httpx.options(server.base_url + "/v1/completions", headers=preflight, timeout=10)
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.get(server.base_url + "/health", headers={"Origin": "https://evil.example"}, timeout=10)
    assert "access-control-allow-origin" not in other.headers


def test_chat_template_fields_reach_the_template(server: RemoteServer, client: openai.OpenAI) -> None:
    assert rendered(server, {}).endswith("<user>Hello</user><assistant>")
    assert "[thinking]" in rendered(server, {"chat_template_kwargs": {"enable_thinking": True}})
    assert "[doc A]" in rendered(server, {"documents": [{"title": "A", "text": "x"}]})
    developer = rendered(server, {"messages": [{"role": "developer", "content": "Be brief"}, *ASK]})
    assert "<system>Be brief</system>" in developer
    continued = rendered(
        server,
        {
            "messages": [*ASK, {"role": "assistant", "content": "Hi the"}],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    )
    assert continued.endswith("<assistant>Hi the")
    response = client.chat.completions.create(
        model=NAMES[1],
        messages=[{"role": "developer", "content": "Be brief"}, *ASK],
        max_tokens=3,
        extra_body={
            "chat_template_kwargs": {"enable_thinking": False},
            "documents": [{"title": "A", "text": "x"}],
            "parallel_tool_calls": False,
            "add_generation_prompt": True,
        },
    )
    assert response.choices[0].message.content is not None


def test_logprob_fields(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model=NAMES[0],
        messages=ASK,
        max_tokens=3,
        logprobs=True,
        top_logprobs=2,
        extra_body={"return_tokens_as_token_ids": True, "prompt_logprobs": 1},
    )
    tokens = chat.choices[0].logprobs.content
    assert all(t.token.startswith("token_id:") for t in tokens)
    assert all(top.token.startswith("token_id:") for t in tokens for top in t.top_logprobs)
    prompt_logprobs = chat.model_extra["prompt_logprobs"]
    assert prompt_logprobs[0] is None and len(prompt_logprobs) == chat.usage.prompt_tokens
    for entry in prompt_logprobs[1:]:  # the prompt's token first, then the top 1, each with its rank
        (chosen, *top) = entry.values()
        assert all(v["decoded_token"].startswith("token_id:") for v in entry.values())
        if top:  # the prompt's token is not the most likely one: some token ranks ahead of it
            assert top[0]["rank"] == 1 and chosen["rank"] > 1 and chosen["logprob"] <= top[0]["logprob"]
        else:
            assert chosen["rank"] == 1
    completion = client.completions.create(
        model=NAMES[0],
        prompt="Hello there",
        max_tokens=2,
        logprobs=1,
        extra_body={"return_tokens_as_token_ids": True, "prompt_logprobs": 2},
    )
    choice = completion.choices[0]
    assert all(t.startswith("token_id:") for t in choice.logprobs.tokens)
    assert choice.model_extra["prompt_logprobs"][0] is None
    assert len(choice.model_extra["prompt_logprobs"]) == completion.usage.prompt_tokens


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_continuous_usage_stats(server: RemoteServer, path: str) -> None:
    body = {"model": NAMES[0], "max_tokens": 4, "stream": True, "ignore_eos": True}
    body |= {"prompt": "hi"} if path == "/v1/completions" else {"messages": ASK}
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    with httpx.stream("POST", server.base_url + path, json=body, headers=server.headers(), timeout=60) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(line) for line in lines if line != "[DONE]"]
    assert all(chunk["usage"] is not None for chunk in chunks)
    generated = [chunk["usage"]["completion_tokens"] for chunk in chunks]
    assert generated == sorted(generated) and generated[-1] == 4


def test_unknown_fields_are_ignored_with_one_warning(server: RemoteServer, client: openai.OpenAI) -> None:
    for _ in range(2):
        client.completions.create(
            model=NAMES[0], prompt="hi", max_tokens=1, extra_body={"some_future_field": {"x": 1}}
        )
    chat = post(
        server,
        "/v1/chat/completions",
        {"messages": [{**ASK[0], "future_message_field": "r"}], "max_tokens": 1, "thing": 1},
    )
    assert chat.status_code == 200, chat.text
    RemoteServer.wait_for(lambda: "'thing'" in server.log(), 10, "the warning")
    assert server.log().count("Ignoring the request field 'some_future_field'") == 1
    assert "'future_message_field' of ChatMessage" in server.log()


HOSTILE = [
    ({"priority": 1}, "priority", "--scheduling-policy priority"),  # the server runs fcfs
    ({"priority": 2**63}, "priority", "less than"),
    ({"priority": 1.5}, "priority", "valid integer"),
    ({"priority": True}, "priority", "valid integer"),
    ({"logits_processors": ["x"]}, "logits_processors", "not supported by this server"),
    ({"chat_template_kwargs": "yes"}, "chat_template_kwargs", "valid dictionary"),
    (
        {"chat_template_kwargs": {f"k{i}": i for i in range(5)}},
        "chat_template_kwargs",
        "--max-chat-template-kwargs",
    ),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs", "may not set messages"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs", "may not set"),
    ({"documents": [{"title": 1}]}, "documents.0.title", "valid string"),
    ({"documents": [{"t": "x"}] * 1025}, "documents", "--max-chat-documents"),
    ({"parallel_tool_calls": "maybe"}, "parallel_tool_calls", "valid boolean"),
    ({"continue_final_message": True}, "continue_final_message", "add_generation_prompt"),
    ({"add_generation_prompt": [1]}, "add_generation_prompt", "valid boolean"),
    ({"return_tokens_as_token_ids": {"a": 1}}, "return_tokens_as_token_ids", "valid boolean"),
    ({"prompt_logprobs": 10**6}, "prompt_logprobs", "--max-logprobs"),
    ({"prompt_logprobs": -1}, "prompt_logprobs", "non-negative"),
    ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs", "cannot be streamed"),
    (
        {"stream_options": {"continuous_usage_stats": "x"}, "stream": True},
        "stream_options.continuous_usage_stats",
        "valid boolean",
    ),
    ({"messages": [{"role": "developer", "content": 5}]}, "messages.0.content.str", "valid string"),
]


@pytest.mark.parametrize("extra,param,words", HOSTILE)
def test_hostile_values_name_the_field(server: RemoteServer, extra: dict, param: str, words: str) -> None:
    response = post(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 1, **extra})
    assert_bad_request(response, param, words)


def test_openai_client_raises_bad_request_for_an_unsupported_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="bad_words"):
        client.chat.completions.create(model=NAMES[0], messages=ASK, extra_body={"bad_words": ["x"]})


def test_still_serves_after_the_hostile_values(client: openai.OpenAI, server: RemoteServer) -> None:
    response = client.chat.completions.create(model=NAMES[0], messages=ASK, max_tokens=2)
    assert response.usage.completion_tokens >= 1
    log = server.log()
    assert "Added request" in log  # --enable-log-requests: id, prompt tokens, sampling params
    assert "trust_remote_code" in log and "never runs a model's own Python code" in log


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
# What the tiny model is made to write (guided_regex): Qwen3-Coder's XML form, every value text.
QWEN3_CODER_TEXT = (
    r"Checking\.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    r"<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)


def test_qwen3_coder_tool_calls_typed_by_the_schema_whole_and_streamed(client: openai.OpenAI) -> None:
    call = forced_tool_call(client, NAMES[0], [WEATHER_TOOL], QWEN3_CODER_TEXT)
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}  # days: an integer


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    """No server: a tiny random model writes no tool calls, so the parser's output is given here."""
    from pagedserve.entrypoints.openai.chat_tools import resolve_chat_tools

    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in "ab"]
    text = "".join(f'<tool_call>{{"name": "{n}", "arguments": {{}}}}</tool_call>' for n in "ab")
    for parallel, names in ((True, ["a", "b"]), (False, ["a"])):
        tool_handling = resolve_chat_tools(tools, "auto", "hermes", parallel)
        assert [call.name for call in tool_handling.output(text, "stop").tool_calls] == names
        streamer = tool_handling.streamer()
        assert streamer is not None
        deltas = [
            d for part, last in ((text[:40], False), (text[40:], True)) for d in streamer.feed(part, last)[1]
        ]
        assert sorted({d.index for d in deltas}) == list(range(len(names)))
        required = resolve_chat_tools(tools, "required", None, parallel).constraint
        assert required is not None and required.json.get("maxItems") == (None if parallel else 1)
