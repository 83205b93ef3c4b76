"""vLLM's metric names for dashboards, alerts and autoscalers: every family under `vllm:` beside
`pagedserve:`, with `model_name` and `engine` labels and the same values, moved by real requests (a real
server, the official openai client), and the whole exposition valid Prometheus text."""

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


def scrape(server: RemoteServer) -> dict[str, dict[str, object]]:
    """name -> {"type": ..., "samples": [(sample name, labels, value)]}, parsed by prometheus_client."""
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    return {
        family.name: {"type": family.type, "samples": [(s.name, s.labels, s.value) for s in family.samples]}
        for family in text_string_to_metric_families(text)
    }


def value(families: dict, name: str, sample: str, **labels: str) -> float:
    family = families[name]
    return sum(v for n, lab, v in family["samples"] if n == sample and labels.items() <= lab.items())


def test_vllm_names_labels_and_values(server: RemoteServer) -> None:
    client: openai.OpenAI = server.client()
    usage_prompt = 0
    for max_tokens in (3, 5):
        completion = client.completions.create(
            model="my-model", prompt="one two three", max_tokens=max_tokens
        )
        assert completion.choices[0].finish_reason == "length"
        usage_prompt += completion.usage.prompt_tokens
    stream = client.chat.completions.create(
        model="alias",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage_prompt += [chunk for chunk in stream][-1].usage.prompt_tokens
    families = scrape(server)
    for name, kind in VLLM_FAMILIES.items():
        assert name in families, name
        assert families[name]["type"] == kind, name
        for _, labels, _ in families[name]["samples"]:
            assert labels["model_name"] == "my-model" and labels["engine"] == "0", (name, labels)
        twin = "pagedserve:" + name.removeprefix("vllm:")
        assert sorted(families[twin]["samples"], key=repr) == sorted(
            [(n.replace("vllm:", "pagedserve:", 1), lab, v) for n, lab, v in families[name]["samples"]],
            key=repr,
        ), name
    assert value(families, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == usage_prompt
    assert value(families, "vllm:generation_tokens", "vllm:generation_tokens_total") == 3 + 5 + 4
    assert (
        value(families, "vllm:request_success", "vllm:request_success_total", finished_reason="length") == 3
    )
    for histogram in ("e2e_request_latency_seconds", "request_prompt_tokens", "request_params_max_tokens"):
        assert value(families, f"vllm:{histogram}", f"vllm:{histogram}_count") == 3, histogram
    assert value(families, "vllm:request_params_max_tokens", "vllm:request_params_max_tokens_sum") == 12
    assert value(families, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_sum") > 0
    assert value(families, "vllm:request_decode_time_seconds", "vllm:request_decode_time_seconds_sum") > 0
    assert (
        value(families, "vllm:iteration_tokens_total", "vllm:iteration_tokens_total_sum") >= usage_prompt + 9
    )
    info = families["vllm:cache_config_info"]["samples"][0][1]
    assert info["block_size"] == "16" and info["enable_prefix_caching"] == "True"
