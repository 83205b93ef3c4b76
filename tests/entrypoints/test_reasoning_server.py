"""A thinking model through a real server (--reasoning-parser qwen3, a tiny random Qwen3 with <think> and
</think> tokens) and the official openai client: message.reasoning and reasoning_content, the same text
streamed as deltas, usage.completion_tokens_details.reasoning_tokens, include_reasoning false,
enable_thinking false, the server's --thinking-token-budget and a request's own; the new fields' hostile
values are a 400 naming the field, the server serving after."""

import json
import math

import httpx
import pytest
from openai.types.chat import ChatCompletion
from server_utils import API_SERVER, RemoteServer

THINK, END = 49152, 49153  # conftest.add_think_tokens
DEFAULT_BUDGET = 3
ASK = [{"role": "user", "content": "Is it?"}]
# The bias makes every token <think>: the first opens the block, the budget closes it, and the answer is
# more of the same (plain text after </think>).
STEER = dict(model="think", messages=ASK, temperature=0, max_tokens=10, logit_bias={str(THINK): 100})


@pytest.fixture(scope="module")
def server(tiny_model_factory):
    args = ["--model", tiny_model_factory("qwen3-think"), "--served-model-name", "think"]
    args += ["--reasoning-parser", "qwen3", "--thinking-token-budget", str(DEFAULT_BUDGET)]
    args += ["--max-model-len", "128", "--num-gpu-blocks-override", "32", "--uvicorn-log-level", "warning"]
    server = RemoteServer(API_SERVER, args)
    yield server
    server.stop()


def test_reasoning_split_and_counted(server: RemoteServer) -> None:
    client = server.client()
    response = client.chat.completions.create(**STEER)
    message = response.choices[0].message
    # <think>, 3 thinking tokens (the server's budget), </think> forced, 5 answer tokens.
    assert message.reasoning == message.reasoning_content == "<think>" * DEFAULT_BUDGET
    assert message.content == "<think>" * 5
    assert response.usage.completion_tokens_details.reasoning_tokens == DEFAULT_BUDGET

    budget = client.chat.completions.create(**STEER, extra_body={"thinking_token_budget": 1})
    assert budget.choices[0].message.reasoning == "<think>"
    assert budget.usage.completion_tokens_details.reasoning_tokens == 1

    stream = client.chat.completions.create(**STEER, stream=True, stream_options={"include_usage": True})
    reasoning, content, usage = "", "", None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            reasoning += getattr(choice.delta, "reasoning", None) or ""
            content += choice.delta.content or ""
    assert (reasoning, content) == (message.reasoning, message.content)
    assert usage is not None and usage.completion_tokens_details.reasoning_tokens == DEFAULT_BUDGET


def test_include_reasoning_false_and_enable_thinking_false(server: RemoteServer) -> None:
    client = server.client()
    hidden = client.chat.completions.create(**STEER, extra_body={"include_reasoning": False})
    assert hidden.choices[0].message.reasoning is None and hidden.choices[0].message.content == "<think>" * 5
    # The template closes an empty block in the prompt: the whole output is the answer.
    plain = client.chat.completions.create(
        model="think",
        messages=ASK,
        temperature=0,
        max_tokens=6,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert plain.choices[0].message.reasoning is None and plain.choices[0].message.content
    assert plain.usage.completion_tokens_details.reasoning_tokens == 0


HOSTILE = (
    [
        ("thinking_token_budget", value)
        for value in (-1, 2**63, 2**64, "5", "", 1.5, math.nan, math.inf, [3], {"a": 1}, True)
    ]
    + [("include_reasoning", value) for value in ("yes", 1, None, [])]
    + [("chat_template_kwargs.enable_thinking", value) for value in ("no", 1, [True])]
)


@pytest.mark.parametrize("field,value", HOSTILE, ids=lambda x: repr(x)[:20])
def test_hostile_values_name_the_field(server: RemoteServer, field: str, value: object) -> None:
    body: dict = dict(model="think", messages=ASK, max_tokens=2)
    if field.startswith("chat_template_kwargs."):
        body["chat_template_kwargs"] = {field.split(".")[1]: value}
    else:
        body[field] = value
    response = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        content=json.dumps(body).encode(),  # NaN and Infinity as Python's json (and JS clients) write them
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"].startswith(field), response.text


def test_still_serves_after_the_sweep(server: RemoteServer) -> None:
    response = server.client().chat.completions.create(**STEER)
    assert response.choices[0].message.reasoning is not None


PREFILL = [*ASK, {"role": "assistant", "content": "<think>"}]  # an open thinking block to continue


def _continued(server: RemoteServer, **extra_body: object) -> ChatCompletion:
    """Chat completions' greedy answer (6 tokens) continuing PREFILL."""
    return server.client().chat.completions.create(
        model="think",
        messages=PREFILL,
        temperature=0,
        max_tokens=6,
        extra_body={"continue_final_message": True, "add_generation_prompt": False, **extra_body},
    )


def test_messages_carry_the_thinking_and_its_budget(server: RemoteServer) -> None:
    """The thinking model through Anthropic's client (a thinking block, then text; budget_tokens is
    the thinking budget; an assistant prefill opens the thinking), equal to chat completions' reasoning
    and content."""
    anthropic = pytest.importorskip("anthropic")
    chat = _continued(server, thinking_token_budget=2)
    expected = chat.choices[0].message
    assert expected.reasoning and chat.usage.completion_tokens_details.reasoning_tokens == 2
    messages = anthropic.Anthropic(base_url=server.base_url, api_key="none", max_retries=0).messages.create(
        model="think",
        messages=PREFILL,
        max_tokens=6,
        thinking={"type": "enabled", "budget_tokens": 2},
        extra_body={"temperature": 0},
    )
    assert [block.type for block in messages.content] == ["thinking", "text"]
    assert (messages.content[0].thinking, messages.content[1].text) == (expected.reasoning, expected.content)


def test_ollama_think_carries_the_thinking(server: RemoteServer) -> None:
    """Ollama's `think` through its client: message.thinking and content equal to chat completions'
    reasoning and content (an assistant prefill opens the thinking, Ollama's way of continuing a turn)."""
    ollama = pytest.importorskip("ollama")
    expected = _continued(server, chat_template_kwargs={"enable_thinking": True}).choices[0].message
    assert expected.reasoning
    answer = ollama.Client(host=server.base_url, timeout=60).chat(
        model="think", messages=PREFILL, think=True, options={"temperature": 0, "num_predict": 6}
    )
    assert (answer.message.thinking, answer.message.content) == (expected.reasoning, expected.content)
    assert ollama.Client(host=server.base_url).show("think").capabilities == ["completion", "thinking"]
