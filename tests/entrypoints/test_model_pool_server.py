"""--models-dir and --model NAME=PATH against a real server on 127.0.0.1: two tiny models (one in the
directory, one named on the command line) loaded when first named and unloaded (LRU, keep_alive), each in
its own engine process, their greedy tokens checked against HF transformers; sleep frees the engine's
memory (its RSS) and wake brings the same outputs back; hostile names, keep_alive values and sleep levels
are refused naming the field, and the server still serves afterwards."""

import asyncio
import json
import os
import shutil
import time
from datetime import datetime

import httpx
import ollama
import psutil
import pytest
import torch
from server_utils import API_SERVER, RemoteServer
from transformers import AutoModelForCausalLM

API_KEY = "pool-key"
PROMPT = [1, 420, 1337, 88, 9000]
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory, tiny_model_factory) -> str:
    root = tmp_path_factory.mktemp("models")
    # NOTE: copies: a symlink leading outside --models-dir is not served.
    shutil.copytree(tiny_model_factory("llama"), root / "alpha")
    (root / "broken").mkdir()  # fails to load: no architecture pagedserve knows
    (root / "broken" / "config.json").write_text(json.dumps({"architectures": ["NoSuchModelForCausalLM"]}))
    (root / "huge").mkdir()  # 64 GiB of weights (a sparse file): over the memory budget, never opened
    shutil.copy(root / "alpha" / "config.json", root / "huge" / "config.json")
    with open(root / "huge" / "model.safetensors", "wb") as file:
        file.truncate(64 * 2**30)
    os.symlink(tiny_model_factory("llama"), root / "outside")  # leads outside: not served
    return str(root)


@pytest.fixture(scope="module")
def beta_path(tiny_model_factory) -> str:
    """Served as --model beta=PATH, from outside --models-dir."""
    return tiny_model_factory("qwen2")


@pytest.fixture(scope="module")
def server(models_dir: str, beta_path: str):
    args = ["--models-dir", models_dir, "--model", f"beta={beta_path}"]
    args += ["--max-loaded-models", "1", "--max-loaded-memory", "1GiB"]
    args += ["--keep-alive", "-1", "--max-model-len", "256", "--kv-cache-memory", "2MiB"]
    args += ["--swap-space", "0", "--uvicorn-log-level", "warning", "--api-key", API_KEY]
    args += ["--max-num-queued-requests", "2", "--enable-sleep-mode"]
    server = RemoteServer(API_SERVER, args, api_key=API_KEY)
    yield server
    server.stop()


def engines(server: RemoteServer) -> list[int]:
    """The server's live engine processes (one per loaded model)."""
    pids = []
    for child in psutil.Process(server.proc.pid).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and child.cmdline()[-1:] == ["EngineCore"]:
                pids.append(child.pid)
        except psutil.Error:  # NOTE: it ended meanwhile
            continue
    return pids


def post(server: RemoteServer, path: str, body: object = None, **params: object) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body or {})
    headers = {**server.headers(), "content-type": "application/json"}
    return httpx.post(
        f"{server.base_url}{path}", content=content, params=params, headers=headers, timeout=120
    )


def greedy(server: RemoteServer, model: str, **extra: object) -> list[int]:
    """The model's greedy tokens for PROMPT, through the openai client."""
    completion = server.client().completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        logprobs=1,
        extra_body={"return_tokens_as_token_ids": True, **extra},
    )
    return [int(token.removeprefix("token_id:")) for token in completion.choices[0].logprobs.tokens]


async def burst(server: RemoteServer, model: str, num_requests: int) -> list[httpx.Response]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    async with httpx.AsyncClient(base_url=server.base_url, headers=server.headers(), timeout=120) as client:
        return await asyncio.gather(*[client.post("/v1/completions", json=body) for _ in range(num_requests)])


def hf_greedy(path: str) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    out = model.generate(torch.tensor([PROMPT]), max_new_tokens=MAX_TOKENS, do_sample=False)
    return out[0, len(PROMPT) :].tolist()


def rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def test_hostile_names_keep_alives_and_levels_get_the_api_errors(server: RemoteServer, models_dir: str):
    listed = {card.id for card in server.client().models.list().data}
    assert listed == {"alpha", "beta", "broken", "huge"}  # the symlink that leads outside is not served
    for name in [
        "../alpha",
        models_dir + "/alpha",
        "/etc/passwd",
        "alpha/../beta",
        "outside",
        "nope",
        "",
        "a" * 10**5,
    ]:
        response = post(server, "/v1/completions", {"model": name, "prompt": "x"})
        assert response.status_code == 404 and response.json()["error"]["param"] == "model", name
        assert "does not exist" in response.json()["error"]["message"]
    for name in [None, 7, ["alpha"], {"a": 1}]:
        response = post(server, "/v1/completions", {"model": name, "prompt": "x"})
        assert response.status_code == 400 and response.json()["error"]["param"] == "model", name
    for keep_alive in ["xx", "5 minutes", 2**64, 1e300, True, [5], {"s": 1}, "1" * 10**4, [0] * 10**5]:
        response = post(
            server, "/v1/completions", {"model": "alpha", "prompt": "x", "keep_alive": keep_alive}
        )
        assert response.status_code == 400 and response.json()["error"]["param"] == "keep_alive", keep_alive
    for raw in ['{"model": "alpha", "keep_alive": NaN}', '{"model": "alpha", "keep_alive": Infinity}']:
        assert post(server, "/v1/completions", raw).json()["error"]["param"] == "keep_alive"
    response = post(server, "/v1/completions", {"model": "huge", "prompt": "x"})
    assert response.status_code == 507 and "--max-loaded-memory" in response.json()["error"]["message"]
    response = post(server, "/v1/completions", {"model": "broken", "prompt": "x"})
    assert response.status_code == 503 and "`broken` failed to load" in response.json()["error"]["message"]
    # Without the key nothing loads, sleeps or wakes.
    for path in ["/v1/completions", "/sleep", "/wake_up"]:
        response = httpx.post(f"{server.base_url}{path}", json={"model": "beta"}, timeout=10)
        assert response.status_code == 401
    assert httpx.get(f"{server.base_url}/metrics", params={"model": "beta"}, timeout=10).status_code == 404
    assert engines(server) == []
    assert len(greedy(server, "alpha")) == MAX_TOKENS  # still serving (HF's tokens: the next test)
    metrics = httpx.get(f"{server.base_url}/metrics", params={"model": "alpha"}, timeout=10)
    assert 'model_name="alpha"' in metrics.text  # open like /metrics, for a loaded model
    for level in ["3", "0", "-1", str(2**64), "abc", "nan", "1.5"]:
        response = post(server, "/sleep", model="alpha", level=level)
        assert response.status_code == 400 and "level" in response.text, level
    assert post(server, "/is_sleeping", model="alpha").status_code == 405
    assert len(greedy(server, "alpha")) == MAX_TOKENS


def test_two_models_load_on_demand_sleep_and_unload(server: RemoteServer, models_dir: str, beta_path: str):
    alpha_tokens = greedy(server, "alpha")
    assert alpha_tokens == hf_greedy(os.path.join(models_dir, "alpha"))
    (alpha_engine,) = engines(server)
    # beta evicts alpha (--max-loaded-models 1, alpha idle); the answers are each model's own. Of four
    # requests at once, two wait for its load (--max-num-queued-requests 2, the load counting as one).
    replies = asyncio.run(burst(server, "beta", 4))
    assert sorted(reply.status_code for reply in replies) == [200, 200, 503, 503]
    assert "wait for the model `beta` to load" in next(r.text for r in replies if r.status_code == 503)
    beta_tokens = greedy(server, "beta")
    assert beta_tokens == hf_greedy(beta_path) != alpha_tokens
    server.wait_for(lambda: alpha_engine not in engines(server), 30, "alpha's engine to exit")
    (beta_engine,) = engines(server)
    ps = httpx.get(f"{server.base_url}/api/ps", headers=server.headers(), timeout=10).json()
    assert [(m["name"], m["expires_at"]) for m in ps["models"]] == [("beta", None)]  # keep_alive -1: never

    weights = os.path.getsize(os.path.join(beta_path, "model.safetensors"))
    for level in (1, 2):
        awake = rss(beta_engine)
        assert post(server, "/sleep", model="beta", level=level).status_code == 200
        asleep = rss(beta_engine)
        assert awake - asleep > 0.8 * weights, (level, awake, asleep, weights)
        status = httpx.get(
            f"{server.base_url}/is_sleeping", params={"model": "beta"}, headers=server.headers()
        )
        assert status.json() == {"is_sleeping": True, "level": level}
        refused = post(server, "/v1/completions", {"model": "beta", "prompt": PROMPT, "max_tokens": 1})
        assert refused.status_code == 503 and "POST /wake_up" in refused.json()["error"]["message"]
        start = time.monotonic()
        assert post(server, "/wake_up", model="beta").status_code == 200
        woke_s = time.monotonic() - start
        print(f"level {level}: RSS {awake / 2**20:.0f} -> {asleep / 2**20:.0f} MiB, woke in {woke_s:.2f} s")
        assert greedy(server, "beta") == beta_tokens  # the same weights, a fresh KV cache

    # keep_alive "1h": unloaded an hour after; then 0: unloaded as soon as its request ends.
    assert greedy(server, "beta", keep_alive="1h") == beta_tokens
    (entry,) = httpx.get(f"{server.base_url}/api/ps", headers=server.headers(), timeout=10).json()["models"]
    assert 3590 < datetime.fromisoformat(entry["expires_at"]).timestamp() - time.time() <= 3600
    assert greedy(server, "beta", keep_alive=0) == beta_tokens
    server.wait_for(lambda: engines(server) == [], 30, "beta's engine to exit (keep_alive 0)")
    assert server.proc.poll() is None


def test_the_ollama_client_loads_and_unloads_models_by_name(server: RemoteServer):
    """The official ollama client, unchanged: /api/tags lists --models-dir's model and --model beta=PATH's,
    a chat loads its model on demand, /api/ps shows it, keep_alive 0 unloads it once answered."""
    client = ollama.Client(host=server.base_url, headers=server.headers())
    assert {"alpha", "beta"} <= {model.model for model in client.list().models}
    options = {"num_predict": MAX_TOKENS, "temperature": 0}
    reply = client.chat(model="alpha", messages=[{"role": "user", "content": "Hi"}], options=options)
    assert reply.done and reply.eval_count == MAX_TOKENS and reply.message.role == "assistant"
    assert [model.model for model in client.ps().models] == ["alpha"]
    answer = client.generate(model="beta", prompt="Hi", options=options, keep_alive=0)
    assert answer.done and answer.eval_count == MAX_TOKENS
    server.wait_for(lambda: engines(server) == [], 30, "beta's engine to exit (keep_alive 0)")
    assert client.list().models  # still serving
    # Pulling a pool's model or refusing to manage one loads nothing; an unknown name is a 404.
    assert client.pull("beta").status == "success" and engines(server) == []
    with pytest.raises(ollama.ResponseError) as unknown:
        client.pull("nope")
    assert unknown.value.status_code == 404 and "nope" in unknown.value.error
    with pytest.raises(ollama.ResponseError) as refused:
        client.delete("alpha")
    assert refused.value.status_code == 400 and engines(server) == []
