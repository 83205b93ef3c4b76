"""The OpenAI-compatible server as a real process on 127.0.0.1, driven by the official openai client."""

import asyncio

import httpx
import openai
import pytest
from server_utils import API_SERVER, RemoteServer
from transformers import AutoTokenizer

from pagedserve import LLM, BeamSearchParams, SamplingParams

API_KEY = "test-key"
MODEL = "tiny"
PROMPTS = ["Hello, my name is", "The capital of France is", "1 2 3 4"]


@pytest.fixture(scope="module")
def server(tiny_llama: str):
    args = [
        "--model",
        tiny_llama,
        "--served-model-name",
        MODEL,
        "--kv-cache-memory",
        "4MiB",
        "--max-logprobs",
        "5",
        "--uvicorn-log-level",
        "warning",
    ]
    # The key comes from the environment (the server's --api-key default); stats every second.
    env = {"PAGEDSERVE_API_KEY": API_KEY, "PAGEDSERVE_LOG_STATS_INTERVAL": "1"}
    server = RemoteServer(API_SERVER, args, api_key=API_KEY, env=env)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    return server.client()


@pytest.fixture(scope="module")
def llm(tiny_llama: str) -> LLM:
    return LLM(tiny_llama, kv_cache_memory="4MiB")


def greedy(llm: LLM, prompts: list, max_tokens: int) -> list[str]:
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    return [o.outputs[0].text for o in outputs]


def test_models_health_version(server: RemoteServer, client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL] and models[0].max_model_len == 512
    for path in ("/health", "/version", "/metrics"):  # open without the API key
        assert httpx.get(server.base_url + path, timeout=10).status_code == 200
    assert httpx.get(server.base_url + "/version", timeout=10).json()["version"]
    # Sleep frees the model for every client: without --enable-sleep-mode its routes do not exist.
    for path in ("/sleep", "/wake_up"):
        assert httpx.post(server.base_url + path, headers=server.headers(), timeout=10).status_code == 404


def test_completions_greedy_equal_offline(client: openai.OpenAI, llm: LLM) -> None:
    response = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=16, temperature=0)
    assert [c.text for c in sorted(response.choices, key=lambda c: c.index)] == greedy(llm, PROMPTS, 16)
    ids = llm.get_tokenizer().encode(PROMPTS[0])
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=16, temperature=0)
    assert by_ids.choices[0].text == response.choices[0].text
    assert response.usage.prompt_tokens == sum(len(llm.get_tokenizer().encode(p)) for p in PROMPTS)
    offline = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    assert response.usage.completion_tokens == sum(len(o.outputs[0].token_ids) for o in offline)


def test_completion_stream_equals_full(client: openai.OpenAI) -> None:
    full = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=20, temperature=0)
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=PROMPTS[1],
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text, chunks
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_chat_greedy_equals_offline_streamed_and_not(client: openai.OpenAI, llm: LLM) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Count to three."},
    ]
    offline = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)[0]
    messages[-1]["content"] = [{"type": "text", "text": "Count to three."}]  # the same, as text parts
    response = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=12, temperature=0
    )
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == offline.outputs[0].text
    assert response.usage.prompt_tokens == len(offline.prompt_token_ids)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == offline.outputs[0].text
    assert chunks[-1].usage.total_tokens == response.usage.total_tokens


def test_n_samples_and_seed(client: openai.OpenAI) -> None:
    def sample(seed: int, n: int = 3) -> list[str]:
        response = client.completions.create(
            model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=1.0, n=n, seed=seed
        )
        assert sorted(c.index for c in response.choices) == list(range(n))
        return [c.text for c in sorted(response.choices, key=lambda c: c.index)]

    first = sample(7)
    assert sample(7) == first and len(set(first)) > 1
    assert sample(8) != first
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2, max_tokens=6, seed=3, stream=True
    )
    finished = {c.choices[0].index for c in stream if c.choices[0].finish_reason}
    assert finished == {0, 1}


def test_stop_strings(client: openai.OpenAI) -> None:
    common = dict(model=MODEL, prompt=PROMPTS[2], max_tokens=16, temperature=0)
    base = client.completions.create(**common).choices[0].text
    stop = base[len(base) // 2 :][:3]
    cut = base.index(stop)
    for stream in (False, True):
        kwargs = dict(common, stop=[stop], stream=stream)
        if stream:
            chunks = [c.choices[0] for c in client.completions.create(**kwargs)]
            text, last = "".join(c.text for c in chunks), chunks[-1]
        else:
            last = client.completions.create(**kwargs).choices[0]
            text = last.text
        assert text == base[:cut] and last.finish_reason == "stop"
        assert last.model_extra["stop_reason"] == stop
    included = client.completions.create(**common, stop=stop, extra_body={"include_stop_str_in_output": True})
    assert included.choices[0].text == base[: cut + len(stop)]


def test_completion_logprobs_and_echo(client: openai.OpenAI) -> None:
    common = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=5, temperature=0)
    response = client.completions.create(**common, logprobs=2)
    logprobs = response.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 5
    assert "".join(logprobs.tokens) == response.choices[0].text
    for value, top in zip(logprobs.token_logprobs, logprobs.top_logprobs):
        assert value <= 0 and 2 <= len(top) <= 3 and max(top.values()) >= value
    echoed = client.completions.create(**common, logprobs=1, echo=True).choices[0]
    assert echoed.text == PROMPTS[0] + response.choices[0].text
    assert echoed.logprobs.token_logprobs[0] is None and len(echoed.logprobs.tokens) > 5


def test_echo_with_max_tokens_0_scores_the_prompt(client: openai.OpenAI, llm: LLM) -> None:
    """vLLM's prompt scoring: echo, logprobs and max_tokens 0 return the prompt with its logprobs (the
    first None) and generate nothing, streamed or not. It was a 400."""
    ids = llm.get_tokenizer().encode(PROMPTS[1])
    offline = llm.generate(
        {"prompt_token_ids": ids}, SamplingParams(max_tokens=1, prompt_logprobs=1), use_tqdm=False
    )[0].prompt_logprobs
    common = dict(model=MODEL, prompt=PROMPTS[1], max_tokens=0, echo=True, logprobs=1)
    scored = client.completions.create(**common)
    (choice,) = scored.choices
    assert choice.text == PROMPTS[1] and scored.usage.completion_tokens == 0
    assert len(choice.logprobs.tokens) == len(ids) and choice.logprobs.token_logprobs[0] is None
    expected = [entry[token].logprob for entry, token in zip(offline[1:], ids[1:])]
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(expected, abs=1e-5)
    streamed = [c.choices[0] for c in client.completions.create(**common, stream=True) if c.choices]
    assert "".join(c.text for c in streamed) == PROMPTS[1]
    assert [v for c in streamed for v in c.logprobs.token_logprobs] == choice.logprobs.token_logprobs


def _offsets_index_the_text(text: str, tokens: list[str], offsets: list[int]) -> None:
    """Each offset is where its token starts in `text`; a token the text left out (a special token under
    skip_special_tokens) takes no room there."""
    position = 0
    for token, offset in zip(tokens, offsets, strict=True):
        assert offset == position, (text, tokens, offsets)
        if text.startswith(token, position):
            position += len(token)
        else:
            assert token.startswith("<") and token.endswith(">"), (token, text)
    assert position == len(text)


def test_echo_text_offsets_skip_special_tokens_left_out_of_the_text(
    client: openai.OpenAI, tiny_llama: str
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    (hello,) = tokenizer.encode("Hello", add_special_tokens=False)
    repo, im_start = tokenizer.convert_tokens_to_ids(["<repo_name>", "<|im_start|>"])
    # Special tokens in the prompt (ids) and in the output (forced by logit_bias).
    common = dict(
        model=MODEL,
        prompt=[repo, hello, im_start, hello],
        max_tokens=2,
        temperature=0,
        logprobs=1,
        echo=True,
        logit_bias={str(repo): 100},
    )
    skipped = client.completions.create(**common).choices[0]
    assert skipped.text == "HelloHello"
    assert skipped.logprobs.text_offset == [0, 0, 5, 5, 10, 10]
    _offsets_index_the_text(skipped.text, skipped.logprobs.tokens, skipped.logprobs.text_offset)
    kept = client.completions.create(**common, extra_body={"skip_special_tokens": False}).choices[0]
    assert kept.text == "HelloHello<repo_name><repo_name>"  # NOTE: the echoed prompt is decoded without them
    assert kept.logprobs.text_offset == [0, 0, 5, 5, 10, 21]
    streamed_text, streamed_offsets = "", []
    for chunk in client.completions.create(**common, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed_text += chunk.choices[0].text
            streamed_offsets += chunk.choices[0].logprobs.text_offset
    assert (streamed_text, streamed_offsets) == (skipped.text, skipped.logprobs.text_offset)
    # Special tokens written in a text prompt are in the echoed text: they take their room.
    written = client.completions.create(
        **{**common, "prompt": "<repo_name>Hello", "logit_bias": None}
    ).choices[0]
    assert written.text.startswith("<repo_name>Hello") and written.logprobs.text_offset[:2] == [0, 11]
    _offsets_index_the_text(written.text, written.logprobs.tokens, written.logprobs.text_offset)


def test_streamed_text_offsets_equal_the_whole_responses_when_text_is_held_back(
    client: openai.OpenAI,
) -> None:
    """A stop string whose start the output ends with holds that text back to the end of the stream: its
    tokens' logprobs wait with it, so the streamed offsets are the whole response's."""
    common = dict(model=MODEL, prompt="Hello, my name is", max_tokens=6, temperature=0, logprobs=0)
    whole = client.completions.create(**common).choices[0]
    stop = whole.text[-3:] + "\u2603"  # never hit, but its start is the output's last characters
    held = client.completions.create(**common, stop=[stop]).choices[0]
    assert (held.text, held.logprobs.text_offset) == (whole.text, whole.logprobs.text_offset)
    text, offsets, tokens = "", [], []
    for chunk in client.completions.create(**common, stop=[stop], stream=True):
        if chunk.choices:
            text += chunk.choices[0].text
            if chunk.choices[0].logprobs:
                offsets += chunk.choices[0].logprobs.text_offset
                tokens += chunk.choices[0].logprobs.tokens
    assert (text, offsets, tokens) == (whole.text, whole.logprobs.text_offset, whole.logprobs.tokens)


def test_chat_logprobs(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, logprobs=True, top_logprobs=3
    )
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens == 4
    for entry in content:
        values = [top.logprob for top in entry.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True) and entry.logprob <= values[0]


def post(server: RemoteServer, path: str, body: object, key: str | None = API_KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if isinstance(body, str):
        return httpx.post(
            server.base_url + path,
            content=body,
            timeout=30,
            headers={**headers, "Content-Type": "application/json"},
        )
    return httpx.post(server.base_url + path, json=body, headers=headers, timeout=30)


BAD_REQUESTS = [  # (path, body, status, param, words in the message)
    (
        "/v1/completions",
        {"prompt": "hi", "max_tokens": 600},
        400,
        "max_tokens",
        "maximum context length is 512",
    ),
    ("/v1/completions", {"prompt": "hi " * 600}, 400, "prompt", "maximum context length"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000},
        400,
        "max_tokens",
        "maximum context length",
    ),
    ("/v1/completions", {"prompt": "hi", "temperature": -1}, 400, "temperature", "non-negative"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature", "valid number"),
    (
        "/v1/completions",
        {"prompt": "hi", "bad_words": ["x"]},
        400,
        "bad_words",
        "not supported by this server",
    ),
    ("/v1/completions", {"prompt": "hi", "priority": 1}, 400, "priority", "--scheduling-policy priority"),
    ("/v1/completions", {"max_tokens": 3}, 400, "prompt", "Field required"),
    ("/v1/completions", '{"prompt": ', 400, "body", "not valid JSON"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 6}, 400, "logprobs", "--max-logprobs"),
    ("/v1/completions", {"prompt": [1, 2, 10**6]}, 400, "prompt", "out of vocabulary"),
    ("/v1/completions", {"prompt": []}, 400, "prompt", "empty"),
    (
        "/v1/completions",
        {"prompt": "hi", "stream_options": {"include_usage": True}},
        400,
        "stream_options",
        "stream",
    ),
    ("/v1/completions", {"prompt": "hi", "model": "gpt-4"}, 404, "model", "does not exist"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages", "at least one"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "robot", "content": "x"}]},
        400,
        "messages[0].role",
        "robot",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "messages[0].content",
        "text parts",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
        400,
        "top_logprobs",
        "logprobs",
    ),
    (
        "/v1/chat/completions",
        {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
        404,
        "model",
        "nope",
    ),
    (
        "/v1/completions",
        {"prompt": "hi", "use_beam_search": True, "top_k": 5},
        400,
        "top_k",
        "cannot be combined with beam search",
    ),
    (
        "/v1/completions",
        {"prompt": "hi", "use_beam_search": True, "stop": ["."]},
        400,
        "stop",
        "cannot be combined with beam search",
    ),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens", "0 only with echo"),
    ("/v1/completions", {"prompt": "hi", "echo": "yes"}, 400, "echo", "echo"),
]


def test_errors_are_openai_style_and_never_reach_the_engine(server: RemoteServer) -> None:
    before = server.metrics()
    for path, body, status, param, words in BAD_REQUESTS:
        response = post(server, path, body)
        assert response.status_code == status, (body, response.text)
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
        assert error["param"] == param and words in error["message"], (body, error)
    after = server.metrics()
    for name in (
        "pagedserve:prompt_tokens_total",
        "pagedserve:request_queue_time_seconds_count",
        'pagedserve:request_success_total{finished_reason="abort"}',
    ):
        assert after[name] == before[name], name


def test_client_raises_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=1000)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])


def test_api_key(server: RemoteServer) -> None:
    for key in (None, "wrong"):
        for path, body in (("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions", {"messages": []})):
            response = post(server, path, body, key=key)
            assert response.status_code == 401 and response.json()["error"]["type"] == "AuthenticationError"
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        assert httpx.get(server.base_url + "/v1/models", headers=headers, timeout=10).status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="wrong", max_retries=0).models.list()


def test_tokenize_detokenize(server: RemoteServer, llm: LLM) -> None:
    tokens = post(server, "/tokenize", {"prompt": PROMPTS[0]}).json()
    assert tokens["tokens"] == llm.get_tokenizer().encode(PROMPTS[0]) and tokens["max_model_len"] == 512
    assert post(server, "/detokenize", {"tokens": tokens["tokens"]}).json()["prompt"] == PROMPTS[0]
    chat = post(server, "/tokenize", {"messages": [{"role": "user", "content": "Hi"}]}).json()
    offline = llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=1), use_tqdm=False)
    assert chat["tokens"] == offline[0].prompt_token_ids
    assert post(server, "/detokenize", {"tokens": [10**7]}).status_code == 400


def kv_idle(server: RemoteServer) -> bool:
    metrics = server.metrics()
    return (
        metrics["pagedserve:num_requests_running"] == 0 and metrics["pagedserve:kv_cache_usage_perc"] == 0.0
    )


def test_disconnect_aborts_and_frees_blocks(server: RemoteServer) -> None:
    body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 400, "ignore_eos": True, "stream": True}
    aborted = server.metrics()['pagedserve:request_success_total{finished_reason="abort"}']
    with httpx.stream(
        "POST", server.base_url + "/v1/completions", json=body, headers=server.headers(), timeout=30
    ) as response:
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
        busy = server.metrics()
        assert busy["pagedserve:num_requests_running"] == 1 and busy["pagedserve:kv_cache_usage_perc"] > 0
    server.wait_for(lambda: kv_idle(server), 10, "the stream's blocks to be freed")
    # Not streamed: the client gives up (read timeout) and the server aborts the request as well.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.base_url + "/v1/completions",
            json={**body, "stream": False},
            headers=server.headers(),
            timeout=httpx.Timeout(30, read=0.5),  # well under 400 tokens' generation time
        )
    server.wait_for(lambda: kv_idle(server), 10, "the non-streamed request's blocks to be freed")
    after = server.metrics()
    assert after['pagedserve:request_success_total{finished_reason="abort"}'] == aborted + 2
    assert after["pagedserve:generation_tokens_total"] < 2 * 400


def test_32_concurrent_streams(server: RemoteServer, llm: LLM) -> None:
    prompts = [f"Request number {i} says" for i in range(32)]
    expected = greedy(llm, prompts, 12)

    async def run_all() -> list[tuple[str, str | None]]:
        client = server.async_client()

        async def one(prompt: str) -> tuple[str, str | None]:
            stream = await client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True
            )
            text, reason = "", None
            async for chunk in stream:
                text += chunk.choices[0].text
                reason = chunk.choices[0].finish_reason or reason
            return text, reason

        return await asyncio.wait_for(asyncio.gather(*(one(p) for p in prompts)), timeout=120)

    results = asyncio.run(run_all())
    assert [text for text, _ in results] == expected
    assert all(reason in ("stop", "length") for _, reason in results)
    metrics = server.metrics()
    assert metrics["pagedserve:time_to_first_token_seconds_count"] >= 32
    assert metrics["pagedserve:inter_token_latency_seconds_count"] > 0


def test_stats_log_line(server: RemoteServer) -> None:
    server.wait_for(lambda: "Avg generation throughput" in server.log(), 5, "the stats log line")
    line = next(line for line in server.log().splitlines() if "Avg generation throughput" in line)
    for words in ("Avg prompt throughput", "Running:", "Waiting:", "KV cache usage:", "Preemptions:"):
        assert words in line


def test_prefix_cache_metrics_reset_and_salt(server: RemoteServer, client: openai.OpenAI) -> None:
    prompt = " ".join(PROMPTS) * 6  # several full blocks

    def hits_after(**extra: object) -> float:
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0, extra_body=extra)
        return server.metrics()["pagedserve:prefix_cache_hits_total"]

    first = hits_after()
    assert hits_after() > first and server.metrics()["pagedserve:prefix_cache_queries_total"] > 0
    assert (
        httpx.post(server.base_url + "/reset_prefix_cache", headers=server.headers(), timeout=10).status_code
        == 200
    )
    hits = hits_after()
    assert hits == hits_after(cache_salt="tenant-a") < hits_after(cache_salt="tenant-a")


def test_best_of_and_beam_search(server: RemoteServer, client: openai.OpenAI, llm: LLM) -> None:
    best = client.completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=6, n=2, best_of=4, seed=5, temperature=1.0
    )
    assert sorted(c.index for c in best.choices) == [0, 1]
    beams = client.completions.create(
        model=MODEL,
        prompt=PROMPTS[0],
        max_tokens=6,
        n=2,
        best_of=3,
        extra_body={"use_beam_search": True, "ignore_eos": True},
    )
    offline = llm.beam_search(PROMPTS[0], BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True))[0]
    num_prompt = len(llm.get_tokenizer().encode(PROMPTS[0]))
    expected = [
        llm.get_tokenizer().decode(s.tokens[num_prompt:], skip_special_tokens=True)
        for s in offline.sequences[:2]
    ]
    assert [c.text for c in sorted(beams.choices, key=lambda c: c.index)] == expected
    for body in (
        {"best_of": 3, "n": 2, "stream": True},
        {"use_beam_search": True, "stream": True},
        {"best_of": 1, "n": 2},
    ):
        response = post(server, "/v1/completions", {"prompt": "hi", **body})
        assert response.status_code == 400 and response.json()["error"]["param"] in ("stream", "best_of"), (
            body
        )


def test_the_queue_is_bounded_with_default_flags(server: RemoteServer, llm: LLM) -> None:
    """No queue flag given: the server still bounds its queue, twice what the engine holds at once."""
    engine = llm.llm_engine
    num_blocks = engine.engine_core.kv_cache_config.num_blocks - 1
    block_size = engine.engine_core.kv_cache_config.block_size
    max_requests = 2 * min(engine.config.scheduler.max_num_seqs, num_blocks)
    assert (
        f"Queue: at most {max_requests} requests and {2 * num_blocks * block_size} prompt tokens wait for "
        "the engine"
    ) in server.log()


def test_cache_config_info(server: RemoteServer, llm: LLM) -> None:
    info = [name for name in server.metrics() if name.startswith("pagedserve:cache_config_info")]
    assert len(info) == 1 and server.metrics()[info[0]] == 1.0
    blocks = llm.llm_engine.engine_core.kv_cache_config.num_blocks - 1  # the same sizing as the server's
    for label in (
        'block_size="16"',
        'cache_dtype="float32"',
        f'num_gpu_blocks="{blocks}"',
        'enable_prefix_caching="True"',
    ):
        assert label in info[0], info[0]
