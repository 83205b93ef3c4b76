"""`--scheduling-policy priority` over HTTP: vLLM's `priority` field through the official openai client's
extra_body, its hostile values refused with a 400 naming the field while the server keeps serving, and an
urgent request preempting a lazy stream (one seat), counted in /metrics under both prefixes."""

import httpx
import pytest
from server_utils import API_SERVER, RemoteServer


@pytest.fixture(scope="module")
def server(tiny_llama: str):
    server = RemoteServer(
        API_SERVER,
        [
            "--model",
            tiny_llama,
            "--scheduling-policy",
            "priority",
            "--kv-cache-memory",
            "4MiB",
            "--max-num-seqs",
            "1",
        ],
    )
    yield server
    server.stop()


def test_priority_through_the_openai_client(server: RemoteServer) -> None:
    client = server.client()
    for priority in (-5, 0, 7, -(2**63), 2**63 - 1):
        completion = client.completions.create(
            model=client.models.list().data[0].id,
            prompt="hello",
            max_tokens=2,
            extra_body={"priority": priority},
        )
        assert completion.usage.completion_tokens == 2
        chat = client.chat.completions.create(
            model=completion.model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=1,
            extra_body={"priority": priority},
        )
        assert chat.usage.completion_tokens == 1


@pytest.mark.parametrize(
    "raw",
    # The JSON token as a client sends it: 2**63, 2**64, -2**63 - 1, -2**64, then non-integers.
    [
        str(2**63),
        str(2**64),
        str(-(2**63) - 1),
        str(-(2**64)),
        "1.5",
        '"x"',
        "null",
        "true",
        "[1]",
        "NaN",
        "Infinity",
    ],
)
def test_hostile_priorities_are_400s(server: RemoteServer, raw: str) -> None:
    body = '{"prompt": "hi", "max_tokens": 1, "priority": ' + raw + "}"
    response = httpx.post(
        server.base_url + "/v1/completions",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400, response.text
    assert "priority" in response.text or "JSON" in response.text


def test_still_serves_after_the_hostile_values(server: RemoteServer) -> None:
    client = server.client()
    completion = client.completions.create(model=client.models.list().data[0].id, prompt="hi", max_tokens=2)
    assert completion.usage.completion_tokens == 2


def test_an_urgent_request_preempts_a_lazy_stream_once_and_metrics_count_it(server: RemoteServer) -> None:
    """One seat: the lazy stream yields to the urgent request (admitted by preempting it), then comes back
    and ends whole; /metrics counts one preemption, a priority one, under pagedserve: and vllm:."""
    client = server.client()
    model = client.models.list().data[0].id
    before = server.metrics()
    lazy = client.completions.create(
        model=model,
        prompt="a lazy story",
        max_tokens=96,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"priority": 5, "ignore_eos": True},
    )
    chunks = iter(lazy)
    next(chunks)  # it runs
    urgent = client.completions.create(model=model, prompt="hi", max_tokens=2, extra_body={"priority": -5})
    assert urgent.usage.completion_tokens == 2
    *_, last_choice, usage = chunks
    assert last_choice.choices[0].finish_reason == "length" and usage.usage.completion_tokens == 96
    server.wait_for(
        lambda: server.metrics()["vllm:num_priority_preemptions_total"] > 0, 30, "the preemption's metric"
    )
    after = server.metrics()
    for prefix in ("pagedserve", "vllm"):
        for name in ("num_priority_preemptions_total", "num_preemptions_total"):
            assert after[f"{prefix}:{name}"] - before.get(f"{prefix}:{name}", 0) == 1
        assert (
            after[f"{prefix}:num_recomputed_tokens_total"] > before[f"{prefix}:num_recomputed_tokens_total"]
        )
