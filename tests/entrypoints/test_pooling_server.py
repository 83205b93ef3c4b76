"""The pooling runner behind a real server on 127.0.0.1 (`pagedserve serve MODEL --runner pooling`):
/v1/embeddings through the official openai client (base64, its default, and float) and plain HTTP,
/pooling, /classify, /score and /v1/score, /rerank and /v1/rerank, against sentence-transformers and HF
transformers; hostile inputs each a 400 that leaves the server serving; generation and pooling models
refusing each other's endpoints."""

import json
import sys

import httpx
import ollama
import pytest
import torch
from server_utils import RemoteServer

API_KEY = "pool-key"
SERVE = [sys.executable, "-m", "pagedserve", "serve"]
TEXTS = ["the cat is on the mat", "paris is the capital of france", "what is the weather like", "a"]
QUERY = "what is the capital of france"


def post(server: RemoteServer, path: str, body: object) -> httpx.Response:
    # NOTE: json.dumps writes NaN and Infinity as JSON extensions, as many clients do.
    return httpx.post(
        server.base_url + path,
        content=json.dumps(body),
        timeout=60,
        headers={**server.headers(), "Content-Type": "application/json"},
    )


def _serve(model: str, *flags: str, api_key: str | None = None) -> RemoteServer:
    args = [model, "--served-model-name", "m", "--uvicorn-log-level", "warning", *flags]
    return RemoteServer(SERVE, args + (["--api-key", api_key] if api_key else []), api_key=api_key)


@pytest.fixture(scope="module")
def embedder(tiny_bert_embedder: str):
    server = _serve(
        tiny_bert_embedder, "--runner", "pooling", "--max-prompts-per-request", "8", api_key=API_KEY
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sentence_transformer(tiny_bert_embedder: str):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(tiny_bert_embedder, device="cpu")


@pytest.fixture(scope="module")
def reference(sentence_transformer) -> torch.Tensor:
    return torch.tensor(sentence_transformer.encode(TEXTS))


def _close(got: list[list[float]], expected: torch.Tensor) -> None:
    torch.testing.assert_close(torch.tensor(got), expected, atol=1e-4, rtol=0)


def test_openai_client_embeddings(embedder: RemoteServer, reference: torch.Tensor) -> None:
    client = embedder.client()
    response = client.embeddings.create(model="m", input=TEXTS)  # base64 on the wire (the client's default)
    _close([d.embedding for d in response.data], reference)
    assert [d.index for d in response.data] == list(range(len(TEXTS)))
    assert response.usage.prompt_tokens == response.usage.total_tokens > len(TEXTS)
    floats = client.embeddings.create(model="m", input=TEXTS[1], encoding_format="float")
    _close([floats.data[0].embedding], reference[1:2])
    ids = embedder.client().embeddings.create(model="m", input=[[2, 40, 3]], encoding_format="float")
    assert len(ids.data[0].embedding) == 64 and ids.usage.prompt_tokens == 3


def test_plain_http_embeddings_and_pooling(embedder: RemoteServer, reference: torch.Tensor) -> None:
    for path in ("/v1/embeddings", "/pooling"):
        response = post(embedder, path, {"input": TEXTS, "encoding_format": "float"})
        assert response.status_code == 200, response.text
        key = "embedding" if path == "/v1/embeddings" else "data"
        _close([d[key] for d in response.json()["data"]], reference)
    one_by_one = [
        post(embedder, "/v1/embeddings", {"input": t}).json()["data"][0]["embedding"] for t in TEXTS
    ]
    _close(one_by_one, reference)
    cosine = post(embedder, "/v1/score", {"text_1": TEXTS[0], "text_2": TEXTS[1:]}).json()["data"]
    assert [d["score"] for d in cosine] == pytest.approx((reference[1:] @ reference[0]).tolist(), abs=1e-4)
    ranked = post(embedder, "/rerank", {"query": TEXTS[0], "documents": TEXTS[1:], "top_n": 2}).json()
    assert (
        len(ranked["results"]) == 2
        and ranked["results"][0]["relevance_score"] >= ranked["results"][1]["relevance_score"]
    )


def test_prompt_name_puts_the_models_prompt_first(embedder: RemoteServer, sentence_transformer) -> None:
    """prompt_name (config_sentence_transformers.json's prompts) as sentence-transformers applies it."""
    expected = torch.tensor(sentence_transformer.encode(TEXTS[:2], prompt_name="query"))
    response = embedder.client().embeddings.create(
        model="m", input=TEXTS[:2], extra_body={"prompt_name": "query"}
    )
    _close([d.embedding for d in response.data], expected)
    pooled = post(embedder, "/pooling", {"input": TEXTS[0], "prompt_name": "query"}).json()["data"]
    _close([pooled[0]["data"]], expected[:1])
    plain = post(embedder, "/v1/embeddings", {"input": TEXTS[0], "prompt_name": None}).json()["data"]
    _close([plain[0]["embedding"]], torch.tensor(sentence_transformer.encode(TEXTS[:1])))


def test_auth_and_generation_refused(embedder: RemoteServer) -> None:
    no_key = httpx.post(embedder.base_url + "/v1/embeddings", json={"input": "a"}, timeout=30)
    assert no_key.status_code == 401
    completion = post(embedder, "/v1/completions", {"prompt": "a", "max_tokens": 2})
    assert completion.status_code == 400 and "pooling runner" in completion.json()["error"]["message"]
    classify = post(embedder, "/classify", {"input": "a"})
    assert classify.status_code == 400 and "/v1/embeddings" in classify.json()["error"]["message"]


def test_ollama_embed_and_embeddings(embedder: RemoteServer, sentence_transformer) -> None:
    """Ollama's client (its Bearer key): /api/embed normalized, as Ollama's, inputs cut to the context
    unless truncate is false; the older /api/embeddings as the model pools; show names the capability."""
    client = ollama.Client(host=embedder.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    embedded = client.embed(model="m", input=TEXTS[:2])
    _close(
        embedded.embeddings, torch.tensor(sentence_transformer.encode(TEXTS[:2], normalize_embeddings=True))
    )
    assert embedded.prompt_eval_count > 2 and embedded.total_duration > 0
    legacy = client.embeddings(model="m", prompt=TEXTS[0])
    _close([legacy.embedding], torch.tensor(sentence_transformer.encode(TEXTS[:1])))
    assert client.embed(model="m", input="the cat " * 100).prompt_eval_count == 128
    with pytest.raises(ollama.ResponseError, match="truncate") as too_long:
        client.embed(model="m", input="the cat " * 100, truncate=False)
    assert too_long.value.status_code == 400
    shown = client.show("m")
    assert shown.capabilities == ["embedding"]
    # Under a million parameters Ollama writes thousands without decimals (format.HumanNumber); the
    # checkpoint is float32, whatever dtype it is served in.
    parameters = sum(param.numel() for param in sentence_transformer.parameters())
    assert shown.modelinfo["general.parameter_count"] == parameters < 10**6
    assert shown.details.model_dump(include={"format", "parameter_size", "quantization_level"}) == {
        "format": "safetensors",
        "parameter_size": f"{round(parameters / 1000)}K",
        "quantization_level": "F32",
    }


HOSTILE = [
    ("/v1/embeddings", {"input": []}, "input"),
    ("/v1/embeddings", {"input": ["a"] * 9}, "max-prompts-per-request"),
    ("/v1/embeddings", {"input": "the cat " * 100}, "truncate_prompt_tokens"),
    ("/v1/embeddings", {"input": [[]]}, "empty"),
    ("/v1/embeddings", {"input": [[-1]]}, "vocabulary"),
    ("/v1/embeddings", {"input": [[2**63]]}, "vocabulary"),
    ("/v1/embeddings", {"input": [[2**64]]}, "vocabulary"),
    ("/v1/embeddings", {"input": [1.5]}, "input"),
    ("/v1/embeddings", {"input": [True]}, "input"),
    ("/v1/embeddings", {"input": {"a": 1}}, "input"),
    ("/v1/embeddings", {"input": None}, "input"),
    ("/v1/embeddings", {}, "input"),
    ("/v1/embeddings", {"input": "a", "encoding_format": "hex"}, "encoding_format"),
    ("/v1/embeddings", {"input": "a", "dimensions": 8}, "dimensions"),
    ("/v1/embeddings", {"input": "a", "dimensions": -1}, "dimensions"),
    ("/v1/embeddings", {"input": "a", "dimensions": 2**63}, "dimensions"),
    ("/v1/embeddings", {"input": "a", "dimensions": 2**64}, "dimensions"),
    ("/v1/embeddings", {"input": "a", "dimensions": float("nan")}, "dimensions"),
    ("/v1/embeddings", {"input": "a", "dimensions": "8"}, "dimensions"),
    ("/v1/embeddings", {"input": "a", "dimensions": True}, "dimensions"),
    ("/v1/embeddings", {"input": "a", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ("/v1/embeddings", {"input": "a", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ("/v1/embeddings", {"input": "a", "truncate_prompt_tokens": 2**64}, "truncate_prompt_tokens"),
    ("/v1/embeddings", {"input": "a", "truncate_prompt_tokens": float("inf")}, "truncate_prompt_tokens"),
    ("/v1/embeddings", {"input": "a", "truncate_prompt_tokens": 1.5}, "truncate_prompt_tokens"),
    ("/v1/embeddings", {"input": "a", "prompt_name": "nope"}, "'document', 'query'"),
    ("/v1/embeddings", {"input": "a", "prompt_name": ""}, "not one of the model's prompts"),
    ("/v1/embeddings", {"input": "a", "prompt_name": "q" * 100_000}, "at most 256 characters"),
    ("/v1/embeddings", {"input": "a", "prompt_name": 5}, "prompt_name"),
    ("/v1/embeddings", {"input": "a", "prompt_name": ["query"]}, "prompt_name"),
    ("/v1/embeddings", {"input": [[2, 40, 3]], "prompt_name": "query"}, "token ids"),
    ("/pooling", {"input": "a", "prompt_name": "nope"}, "drop prompt_name"),
    ("/v1/embeddings", {"input": "a", "normalize": "yes"}, "normalize"),  # was read as true
    ("/pooling", {"input": "a", "normalize": 1}, "normalize"),
    ("/rerank", {"query": "a", "documents": ["b"], "return_documents": "no"}, "return_documents"),
    ("/rerank", {"query": "a", "documents": []}, "documents"),
    ("/rerank", {"query": "a", "documents": ["b"] * 9}, "max-prompts-per-request"),
    ("/rerank", {"query": "a", "documents": ["b"], "top_n": 0}, "top_n"),
    ("/rerank", {"query": "a", "documents": ["b"], "top_n": -(2**63)}, "top_n"),
    ("/rerank", {"query": "a", "documents": ["b"], "top_n": float("nan")}, "top_n"),
    ("/rerank", {"query": "a", "documents": ["b"], "top_n": "2"}, "top_n"),
    ("/rerank", {"query": 5, "documents": ["b"]}, "query"),
    ("/rerank", {"query": "a", "documents": [5]}, "documents"),
    ("/v1/score", {"text_1": [], "text_2": ["b"]}, "query"),
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "queries"),
]


def test_hostile_inputs_are_400s_and_the_server_serves_on(embedder: RemoteServer) -> None:
    for path, body, expected in HOSTILE:
        response = post(embedder, path, body)
        assert response.status_code == 400, (path, body, response.text)
        assert expected in response.text, (path, body, response.text)
        assert len(response.text) < 2000, (path, "the error must not echo a huge input")
    huge_top_n = post(embedder, "/rerank", {"query": "a", "documents": ["b", "c"], "top_n": 2**64})
    assert huge_top_n.status_code == 200 and len(huge_top_n.json()["results"]) == 2
    truncated = post(embedder, "/v1/embeddings", {"input": "the cat " * 100, "truncate_prompt_tokens": -1})
    assert truncated.status_code == 200 and truncated.json()["usage"]["prompt_tokens"] == 128
    assert httpx.get(embedder.base_url + "/health", timeout=10).status_code == 200
    assert len(embedder.client().embeddings.create(model="m", input="still here").data) == 1


def test_cross_encoder_endpoints_equal_hf(tiny_bert_cross_encoder: str) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    hf = AutoModelForSequenceClassification.from_pretrained(tiny_bert_cross_encoder).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_cross_encoder)
    with torch.no_grad():
        encoded = tokenizer([QUERY] * len(TEXTS), TEXTS, padding=True, return_tensors="pt")
        expected = torch.sigmoid(hf(**encoded).logits[:, 0]).tolist()
    server = _serve(tiny_bert_cross_encoder)  # --runner auto: an encoder is served by the pooling runner
    try:
        for path in ("/score", "/v1/score"):
            data = post(server, path, {"text_1": QUERY, "text_2": TEXTS}).json()["data"]
            assert [d["score"] for d in data] == pytest.approx(expected, abs=1e-4)
        for path in ("/rerank", "/v1/rerank"):
            body = post(server, path, {"query": QUERY, "documents": TEXTS, "top_n": 3}).json()
            order = sorted(range(len(TEXTS)), key=lambda i: -expected[i])[:3]
            assert [r["index"] for r in body["results"]] == order
            assert [r["document"]["text"] for r in body["results"]] == [TEXTS[i] for i in order]
            assert [r["relevance_score"] for r in body["results"]] == pytest.approx(
                [expected[i] for i in order], abs=1e-4
            )
        probs = post(server, "/classify", {"input": TEXTS}).json()["data"]
        assert all(d["num_classes"] == 1 and 0 < d["probs"][0] < 1 for d in probs)
        refused = post(server, "/v1/embeddings", {"input": "a"})
        assert refused.status_code == 400 and "classify" in refused.text
    finally:
        server.stop()


def test_decoder_classifier_endpoints_equal_hf(tiny_qwen3_classifier: str) -> None:
    """Qwen3ForSequenceClassification (Qwen3-Reranker with a `score` head): /rerank, /score and /classify
    equal HF's head at each pair's (text's) last token."""
    from conftest import hf_classifier_logits
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_classifier)
    prompts = [tokenizer(QUERY, t)["input_ids"] for t in TEXTS] + [tokenizer(TEXTS[0])["input_ids"]]
    logits = torch.sigmoid(hf_classifier_logits(tiny_qwen3_classifier, prompts)[:, 0]).tolist()
    expected, single = logits[:-1], logits[-1]
    server = _serve(tiny_qwen3_classifier)  # --runner auto: no LM head, so the pooling runner
    try:
        body = post(server, "/v1/rerank", {"query": QUERY, "documents": TEXTS}).json()
        assert [r["index"] for r in body["results"]] == sorted(range(len(TEXTS)), key=lambda i: -expected[i])
        assert [r["relevance_score"] for r in body["results"]] == pytest.approx(
            sorted(expected, reverse=True), abs=1e-4
        )
        data = post(server, "/score", {"text_1": QUERY, "text_2": TEXTS[1]}).json()["data"]
        assert data[0]["score"] == pytest.approx(expected[1], abs=1e-4)
        probs = post(server, "/classify", {"input": TEXTS[0]}).json()["data"][0]["probs"]
        assert probs == pytest.approx([single], abs=1e-4)
        completion = post(server, "/v1/completions", {"prompt": "a", "max_tokens": 2})
        assert completion.status_code == 400 and "pooling runner" in completion.text
    finally:
        server.stop()


def test_a_generation_model_refuses_pooling_endpoints(tiny_llama: str) -> None:
    server = _serve(tiny_llama, "--kv-cache-memory", "4MiB")
    try:
        for path, body in (
            ("/v1/embeddings", {"input": "a"}),
            ("/pooling", {"input": "a"}),
            ("/classify", {"input": "a"}),
            ("/v1/score", {"text_1": "a", "text_2": "b"}),
            ("/v1/rerank", {"query": "a", "documents": ["b"]}),
        ):
            response = post(server, path, body)
            assert response.status_code == 400, (path, response.text)
            assert "--runner pooling" in response.json()["error"]["message"]
        assert post(server, "/v1/completions", {"prompt": "a", "max_tokens": 2}).status_code == 200
    finally:
        server.stop()


def test_metrics_and_dashboard_count_pooling_requests(embedder: RemoteServer) -> None:
    before = embedder.metrics().get("pagedserve:prompt_tokens_total", 0.0)
    usage = post(embedder, "/v1/embeddings", {"input": ["the cat", "a dog"]}).json()["usage"]
    after = embedder.metrics()
    assert after["pagedserve:prompt_tokens_total"] - before == usage["prompt_tokens"]
    state = httpx.get(embedder.base_url + "/dashboard/state", headers=embedder.headers(), timeout=30)
    assert state.status_code == 200, state.text
