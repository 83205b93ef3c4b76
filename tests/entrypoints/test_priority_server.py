"""`--scheduling-policy priority` over HTTP: vLLM's `priority` field through the official openai client's
extra_body, and its hostile values refused with a 400 naming the field while the server keeps serving."""

import httpx
import pytest
from server_utils import API_SERVER, RemoteServer


@pytest.fixture(scope="module")
def server(tiny_llama: str):
    server = RemoteServer(
        API_SERVER,
        ["--model", tiny_llama, "--scheduling-policy", "priority", "--kv-cache-memory", "4MiB"],
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
