"""vLLM's metric names for dashboards, alerts and autoscalers: every family under `vllm:` beside
`pagedserve:`, with `model_name` and `engine` labels and the same values, moved by real requests (a real
server, the official openai client), and the whole exposition valid Prometheus text."""

import os
from dataclasses import dataclass

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_utils import API_SERVER, RemoteServer

VLLM_FAMILIES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_params_n": "histogram",
    "vllm:request_params_max_tokens": "histogram",
    "vllm:iteration_tokens_total": "histogram",
    "vllm:num_preemptions": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:cache_config_info": "gauge",
}


@pytest.fixture(scope="module")
def server(tiny_llama: str):
    server = RemoteServer(
        API_SERVER,
        ["--model", tiny_llama, "--served-model-name", "my-model", "alias", "--kv-cache-memory", "4MiB"],
    )
    yield server
    server.stop()


@dataclass
class Traffic:
    """What the clients saw, to compare with what /metrics says."""

    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0


@pytest.fixture(scope="module")
def traffic(server: RemoteServer) -> Traffic:
    """Completions and a chat, streamed and not, each stopped by max_tokens; the usage of each counted."""
    client: openai.OpenAI = server.client()
    seen = Traffic()
    for max_tokens in (3, 5):
        completion = client.completions.create(
            model="my-model", prompt="one two three", max_tokens=max_tokens
        )
        assert completion.choices[0].finish_reason == "length"
        seen.requests += 1
        seen.prompt_tokens += completion.usage.prompt_tokens
        seen.generation_tokens += completion.usage.completion_tokens
    usage_only = {"include_usage": True}
    streams = [
        client.completions.create(
            model="my-model", prompt="four five", max_tokens=4, stream=True, stream_options=usage_only
        ),
        client.chat.completions.create(
            model="alias",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            stream=True,
            stream_options=usage_only,
        ),
    ]
    for stream in streams:
        chunks = list(stream)
        assert [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason] == ["length"]
        seen.requests += 1
        seen.prompt_tokens += chunks[-1].usage.prompt_tokens
        seen.generation_tokens += chunks[-1].usage.completion_tokens
    return seen


def scrape(server: RemoteServer) -> dict[str, dict[str, object]]:
    """name -> {"type": ..., "samples": [(sample name, labels, value)]}, parsed by prometheus_client;
    a family twice in the text (which Prometheus refuses) fails here."""
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    parsed = list(text_string_to_metric_families(text))
    names = [family.name for family in parsed]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    return {
        family.name: {"type": family.type, "samples": [(s.name, s.labels, s.value) for s in family.samples]}
        for family in parsed
    }


def value(families: dict, name: str, sample: str, **labels: str) -> float:
    family = families[name]
    return sum(v for n, lab, v in family["samples"] if n == sample and labels.items() <= lab.items())


def test_every_family_under_both_names(server: RemoteServer, traffic: Traffic) -> None:
    families = scrape(server)
    for name, kind in VLLM_FAMILIES.items():
        assert name in families, name
        assert families[name]["type"] == kind, name
        assert families[name]["samples"], name
        for _, labels, _ in families[name]["samples"]:
            assert labels["model_name"] == "my-model" and labels["engine"] == "0", (name, labels)
        twin = "pagedserve:" + name.removeprefix("vllm:")
        assert sorted(families[twin]["samples"], key=repr) == sorted(
            [(n.replace("vllm:", "pagedserve:", 1), lab, v) for n, lab, v in families[name]["samples"]],
            key=repr,
        ), name
    # Nothing under one prefix only.
    assert {n.removeprefix("vllm:") for n in families if n.startswith("vllm:")} == {
        n.removeprefix("pagedserve:") for n in families if n.startswith("pagedserve:")
    }
    reasons = {lab["finished_reason"] for _, lab, _ in families["vllm:request_success"]["samples"]}
    assert reasons == {"stop", "length", "abort", "error"}
    info = families["vllm:cache_config_info"]["samples"][0][1]
    assert info["block_size"] == "16" and info["enable_prefix_caching"] == "True"
    assert int(info["num_gpu_blocks"]) > 0


def test_model_weight_bytes_counts_the_resident_weights(server: RemoteServer, tiny_llama: str) -> None:
    """The gauge is the bytes the loaded weights hold: here the float32 checkpoint's, every tensor once."""
    from safetensors.torch import load_file

    checkpoint = load_file(os.path.join(tiny_llama, "model.safetensors"))
    (sample,) = scrape(server)["pagedserve:model_weight_bytes"]["samples"]
    assert sample[2] == sum(t.numel() * t.element_size() for t in checkpoint.values())


PER_REQUEST_HISTOGRAMS = (
    "time_to_first_token_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
    "request_inference_time_seconds",
    "request_prefill_time_seconds",
    "request_decode_time_seconds",
    "request_time_per_output_token_seconds",
    "request_prompt_tokens",
    "request_generation_tokens",
    "request_params_n",
    "request_params_max_tokens",
)


def test_values_follow_the_requests(server: RemoteServer, traffic: Traffic) -> None:
    families = scrape(server)

    def total(name: str, suffix: str, **labels: str) -> float:
        return value(families, f"vllm:{name}", f"vllm:{name}{suffix}", **labels)

    assert total("prompt_tokens", "_total") == traffic.prompt_tokens
    assert total("generation_tokens", "_total") == traffic.generation_tokens == 3 + 5 + 4 + 4
    assert total("request_success", "_total", finished_reason="length") == traffic.requests
    assert total("request_success", "_total") == traffic.requests
    for histogram in PER_REQUEST_HISTOGRAMS:
        assert total(histogram, "_count") == traffic.requests, histogram
    # One latency per token after each request's first (one token per step: no speculation here).
    assert total("inter_token_latency_seconds", "_count") == traffic.generation_tokens - traffic.requests
    assert total("request_prompt_tokens", "_sum") == traffic.prompt_tokens
    assert total("request_generation_tokens", "_sum") == traffic.generation_tokens
    assert total("request_params_max_tokens", "_sum") == 3 + 5 + 4 + 4
    assert total("request_params_n", "_sum") == traffic.requests
    for timing in (
        "time_to_first_token_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
    ):
        assert total(timing, "_sum") > 0, timing
    assert total("request_inference_time_seconds", "_sum") == pytest.approx(
        total("request_prefill_time_seconds", "_sum") + total("request_decode_time_seconds", "_sum")
    )
    assert total("e2e_request_latency_seconds", "_sum") >= total("request_inference_time_seconds", "_sum")
    # Every prompt and generated token went through an engine step (the last token is sampled, not fed).
    assert total("iteration_tokens_total", "_sum") >= traffic.prompt_tokens + traffic.generation_tokens - 4
    assert total("num_preemptions", "_total") == 0
    # Each prompt is looked up once in the prefix cache (no preemption re-queries it), counted in tokens.
    assert total("prefix_cache_queries", "_total") == traffic.prompt_tokens
    assert 0 <= total("prefix_cache_hits", "_total") <= traffic.prompt_tokens
    assert 0 <= total("kv_cache_usage_perc", "") <= 1
    assert total("num_requests_running", "") == total("num_requests_waiting", "") == 0
