"""LoRA adapters behind a real server on 127.0.0.1: --lora-modules (both forms), /v1/models with their
parent (and GET /v1/models/{id}), a request's `model` picking its adapter (tokens as the merged model's),
runtime load and unload (VLLM_ALLOW_RUNTIME_LORA_UPDATING) behind the API key, hostile bodies each a 4xx
that leaves the server serving, adapter folders deleted or rewritten while served (their requests fail,
nothing else), and vllm:lora_requests_info."""

import json
import shutil
import sys

import httpx
import openai
import pytest
from lora_adapters import ATTENTION, write_adapter
from server_utils import RemoteServer
from transformers import AutoConfig

API_KEY = "lora-key"
SERVE = [sys.executable, "-m", "pagedserve", "serve"]
PROMPT = [1, 5, 9, 200, 17, 44, 80, 3000]


@pytest.fixture(scope="module")
def adapters(tiny_model_factory, tmp_path_factory) -> dict[str, str]:
    base = tiny_model_factory("llama")
    config = AutoConfig.from_pretrained(base)
    folder = tmp_path_factory.mktemp("adapters")
    return {
        "base": base,
        "sql": write_adapter(str(folder / "sql"), config, 8, 16, seed=1),
        "chat": write_adapter(str(folder / "chat"), config, 4, 8, ATTENTION, seed=2),
        "late": write_adapter(str(folder / "late"), config, 8, 8, seed=3),
        "r16": write_adapter(str(folder / "r16"), config, 16, 16, seed=4),
    }


@pytest.fixture(scope="module")
def server(adapters):
    chat_json = json.dumps({"name": "chat", "path": adapters["chat"], "base_model_name": "base"})
    args = [adapters["base"], "--served-model-name", "base", "org/base", "--uvicorn-log-level", "warning"]
    args += ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8", "--kv-cache-memory", "8MiB"]
    args += ["--lora-modules", f"sql={adapters['sql']}", chat_json, "--api-key", API_KEY]
    server = RemoteServer(SERVE, args, api_key=API_KEY, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    yield server
    server.stop()


def post(server: RemoteServer, path: str, body: object, key: str | None = API_KEY) -> httpx.Response:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    return httpx.post(server.base_url + path, content=json.dumps(body), headers=headers, timeout=60)


def complete(server: RemoteServer, model: str) -> list[str]:
    response = server.client().completions.create(
        model=model, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=0, extra_body={"ignore_eos": True}
    )
    assert response.model == model
    return response.choices[0].logprobs.tokens


def offline(base: str, adapter: str | None, max_tokens: int = 8) -> list[str]:
    """The same request through LLM on one adapter at a time: the server's tokens must equal these."""
    from pagedserve import LLM, SamplingParams
    from pagedserve.lora.request import LoRARequest

    llm = LLM(base, enable_lora=True, max_lora_rank=8, kv_cache_memory="8MiB")
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    request = None if adapter is None else LoRARequest("x", 1, adapter)
    token_ids = llm.generate([PROMPT], params, use_tqdm=False, lora_request=request)[0].outputs[0].token_ids
    return [llm.get_tokenizer().decode([t]) for t in token_ids]


def test_models_list_and_requests_pick_their_adapter(server: RemoteServer, adapters) -> None:
    cards = {card.id: card for card in server.client().models.list().data}
    assert set(cards) == {"base", "org/base", "sql", "chat"}
    assert cards["sql"].parent == "base" and cards["sql"].root == adapters["sql"]
    assert getattr(cards["base"], "parent", None) is None
    got = {name: complete(server, name) for name in ("sql", "base", "chat")}
    assert got["sql"] == offline(adapters["base"], adapters["sql"])
    assert got["chat"] == offline(adapters["base"], adapters["chat"])
    assert got["base"] == offline(adapters["base"], None)
    assert len({tuple(tokens) for tokens in got.values()}) == 3
    chat = server.client().chat.completions.create(
        model="sql", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert chat.model == "sql" and chat.choices[0].message.content is not None
    missing = post(server, "/v1/completions", {"model": "nope", "prompt": "a", "max_tokens": 1})
    assert missing.status_code == 404 and "`sql`" in missing.text
    samples = server.metrics()
    assert any(name.startswith('vllm:lora_requests_info{max_lora="2"') for name in samples), samples


def test_models_retrieve_each_served_name(server: RemoteServer, adapters) -> None:
    """GET /v1/models/{id} (the openai client's models.retrieve): the card /v1/models lists, for base names
    with a slash (sent %2F-encoded by the client, or plain) and adapters; 404 in OpenAI's shape for an
    unknown id; 401 without the key."""
    client = server.client()
    listed = {card.id: card.model_dump(exclude={"created"}) for card in client.models.list().data}
    for name in ("base", "org/base", "sql", "chat"):
        card = client.models.retrieve(name)
        assert card.object == "model" and card.owned_by and card.created > 0
        assert card.model_dump(exclude={"created"}) == listed[name]
    plain = httpx.get(f"{server.base_url}/v1/models/org/base", headers=server.headers(), timeout=10)
    assert (
        plain.status_code == 200
        and plain.json()["id"] == "org/base"
        and plain.json()["root"] == adapters["base"]
    )
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("org/nope")
    error = missing.value.response.json()["error"]
    assert error["type"] == "NotFoundError" and error["param"] == "model" and "`org/base`" in error["message"]
    assert httpx.get(f"{server.base_url}/v1/models/sql", timeout=10).status_code == 401
    # Hostile ids: each a 404 in OpenAI's shape, a huge one not echoed whole; the server still serves.
    headers = {"Authorization": f"Bearer {server.api_key}"}
    for hostile in ["%00", "..%2F..%2Fetc%2Fpasswd", "%FF%FE", str(2**64), "NaN", "a" * 50_000]:
        reply = httpx.get(f"{server.base_url}/v1/models/{hostile}", headers=headers, timeout=10)
        assert reply.status_code == 404 and len(reply.text) < 2_000, (hostile[:20], reply.status_code)
    assert client.models.retrieve("sql").id == "sql"


def test_runtime_load_and_unload(server: RemoteServer, adapters) -> None:
    body = {"lora_name": "late", "lora_path": adapters["late"]}
    assert post(server, "/v1/load_lora_adapter", body, key=None).status_code == 401
    loaded = post(server, "/v1/load_lora_adapter", body)
    assert loaded.status_code == 200, loaded.text
    assert "late" in {card.id for card in server.client().models.list().data}
    assert complete(server, "late") == offline(adapters["base"], adapters["late"])
    again = post(server, "/v1/load_lora_adapter", {"lora_name": "late", "lora_path": adapters["late"]})
    assert again.status_code == 400 and "already served" in again.text
    # Unloaded while a request of it streams: that request finishes with the adapter, new ones get a 404.
    stream = server.client().completions.create(
        model="late",
        prompt=PROMPT,
        max_tokens=24,
        temperature=0,
        logprobs=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = [next(stream)]
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "late"}).status_code == 200
    gone = post(server, "/v1/completions", {"model": "late", "prompt": "a", "max_tokens": 1})
    assert gone.status_code == 404
    chunks += list(stream)
    assert chunks[-1].choices[0].finish_reason == "length" and all(c.model == "late" for c in chunks)
    streamed = [token for c in chunks if c.choices[0].logprobs for token in c.choices[0].logprobs.tokens]
    assert streamed == offline(adapters["base"], adapters["late"], 24)
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "late"}).status_code == 404


HOSTILE = [
    ({"lora_name": "", "lora_path": "/tmp"}, 400, "lora_name"),
    ({"lora_name": "x" * 300, "lora_path": "/tmp"}, 400, "lora_name"),
    ({"lora_name": "x", "lora_path": "/no/such/folder"}, 400, "no such folder"),
    ({"lora_name": "x", "lora_path": "/"}, 400, "adapter_config.json"),
    ({"lora_name": "x", "lora_path": "p" * 5000}, 400, "lora_path"),
    ({"lora_name": 7, "lora_path": "/tmp"}, 400, "lora_name"),
    ({"lora_name": ["a"], "lora_path": "/tmp"}, 400, "lora_name"),
    ({"lora_name": "x"}, 400, "lora_path"),
    ({"lora_name": "x", "lora_path": None}, 400, "lora_path"),
    ({"lora_name": "sql", "lora_path": "/tmp"}, 400, "already served"),
]


def test_hostile_bodies_are_refused_and_the_server_serves_on(server: RemoteServer, adapters) -> None:
    for body, status, expected in HOSTILE:
        response = post(server, "/v1/load_lora_adapter", body)
        assert response.status_code == status and expected in response.text, (body, response.text)
    too_wide = post(server, "/v1/load_lora_adapter", {"lora_name": "r16", "lora_path": adapters["r16"]})
    assert too_wide.status_code == 400 and "--max-lora-rank 8" in too_wide.text
    for body in (
        {"lora_name": "nope"},
        {"lora_name": "sql", "lora_int_id": 2**64},
        {"lora_name": "sql", "lora_int_id": -1},
        {"lora_name": "sql", "lora_int_id": "1"},
        {"lora_name": ""},
        [],
    ):
        response = post(server, "/v1/unload_lora_adapter", body)
        assert response.status_code in (400, 404), (body, response.text)
    nan_body = post(server, "/v1/completions", {"model": float("nan"), "prompt": "a", "max_tokens": 1})
    assert nan_body.status_code == 400
    assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
    assert {card.id for card in server.client().models.list().data} >= {"base", "sql", "chat"}
    assert len(complete(server, "sql")) == 8


def test_adapter_folders_deleted_or_rewritten_fail_only_their_requests(server, adapters, tmp_path) -> None:
    """The issue's sequences with two slots and two adapters in host memory: v asked, then sql and chat (v
    leaves the slots and host memory), then v's folder deleted, or rewritten with other weights of the same
    shapes, and v asked again. v's request gets an error naming its folder and the problem (never other
    weights, never a mix with its cached K/V); w and the base model serve on; v loaded again serves its new
    weights as a fresh engine does."""
    config = AutoConfig.from_pretrained(adapters["base"])
    v, w = str(tmp_path / "v"), str(tmp_path / "w")
    write_adapter(w, config, 4, 8, ATTENTION, seed=6)
    assert post(server, "/v1/load_lora_adapter", {"lora_name": "w", "lora_path": w}).status_code == 200
    base_tokens, w_tokens = complete(server, "base"), complete(server, "w")

    def load_v_and_evict_it(seed: int) -> None:
        write_adapter(v, config, 4, 8, ATTENTION, seed=seed)
        assert post(server, "/v1/load_lora_adapter", {"lora_name": "v", "lora_path": v}).status_code == 200
        complete(server, "v")
        complete(server, "sql")
        complete(server, "chat")

    def v_fails(problem: str) -> None:
        body = {"model": "v", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        response = post(server, "/v1/completions", body)
        assert response.status_code == 500 and v in response.text and problem in response.text, response.text
        assert complete(server, "w") == w_tokens and complete(server, "base") == base_tokens
        assert post(server, "/v1/unload_lora_adapter", {"lora_name": "v"}).status_code == 200

    load_v_and_evict_it(seed=5)
    shutil.rmtree(v)
    v_fails("no such folder")
    load_v_and_evict_it(seed=5)
    write_adapter(v, config, 4, 8, ATTENTION, seed=7)
    v_fails("its files changed since it was loaded")
    assert post(server, "/v1/load_lora_adapter", {"lora_name": "v", "lora_path": v}).status_code == 200
    assert complete(server, "v") == offline(adapters["base"], v)
    for name in ("v", "w"):
        assert post(server, "/v1/unload_lora_adapter", {"lora_name": name}).status_code == 200
