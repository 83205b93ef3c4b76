"""A request's bad input fails that request only, on a real server: the caller whose request the engine
process cannot decode or cannot take gets a 500 with an OpenAI error body at once, while a stream in
flight completes and the engine goes on serving (/health 200, new requests complete).

The API checks every field it knows, so the server here runs with a hole in its frontend (the launcher
below): requests with a marker seed leave `process_inputs` with a field the engine will refuse. Their
bytes then take the real way: the MPClient's encoder and socket, the engine process's decoder and
scheduler, the error output back, the HTTP error."""

import sys
import threading
import time

import httpx
import openai
import pytest
from server_utils import RemoteServer

MODEL = "tiny"
UNDECODABLE_SEED = 1001  # the engine cannot decode the request (cache_salt is an int)
UNTAKEABLE_SEED = 1002  # it decodes, but the engine cannot take it (max_tokens unresolved)
STREAM_TOKENS = 48
LAUNCHER = f"""
import dataclasses, sys
import msgspec
from pagedserve.engine.async_llm import AsyncLLM
from pagedserve.entrypoints.openai.api_server import main

process_inputs = AsyncLLM.process_inputs

def with_hole(self, request_id, prompt, options):
    request = process_inputs(self, request_id, prompt, options)
    if options.sampling_params.seed == {UNDECODABLE_SEED}:
        return msgspec.structs.replace(request, cache_salt=7)
    if options.sampling_params.seed == {UNTAKEABLE_SEED}:
        unresolved = dataclasses.replace(request.sampling_params, max_tokens=None)
        return msgspec.structs.replace(request, sampling_params=unresolved)
    return request

AsyncLLM.process_inputs = with_hole
sys.exit(main())
"""


@pytest.fixture(scope="module")
def server(tiny_llama: str):
    args = ["--model", tiny_llama, "--served-model-name", MODEL, "--kv-cache-memory", "4MiB"]
    server = RemoteServer([sys.executable, "-c", LAUNCHER], [*args, "--uvicorn-log-level", "warning"])
    yield server
    server.stop()


def error_of(call) -> tuple[openai.APIStatusError, float]:
    start = time.monotonic()
    with pytest.raises(openai.APIStatusError) as info:
        call()
    return info.value, time.monotonic() - start


def test_bad_engine_input_fails_its_caller_only(server: RemoteServer) -> None:
    client = server.client()
    streamed: list[object] = []

    def long_stream() -> None:
        chunks = client.completions.create(
            model=MODEL,
            prompt="A long story",
            max_tokens=STREAM_TOKENS,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        streamed.extend(chunks)

    in_flight = threading.Thread(target=long_stream, daemon=True)
    in_flight.start()
    server.wait_for(lambda: bool(streamed) or not in_flight.is_alive(), 60, "the stream's first chunk")

    failures = [
        error_of(
            lambda: client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, seed=UNDECODABLE_SEED)
        ),
        error_of(
            lambda: client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, seed=UNDECODABLE_SEED
            )
        ),
        error_of(
            lambda: client.completions.create(
                model=MODEL, prompt=["Hi", "there"], max_tokens=4, seed=UNTAKEABLE_SEED, stream=True
            )
        ),
    ]
    for error, elapsed in failures:
        assert isinstance(error, openai.InternalServerError) and error.status_code == 500, error
        body = error.response.json()["error"]
        assert body["code"] == 500 and body["type"] == "InternalServerError", body
        assert "The engine could not run request" in body["message"], body
        assert elapsed < 10, f"the failure took {elapsed:.1f} s"
    assert "could not be decoded" in failures[0][0].message and "at `cache_salt`" in failures[0][0].message
    assert "could not be decoded" in failures[1][0].message
    assert "could not take it" in failures[2][0].message and "max_tokens" in failures[2][0].message

    in_flight.join(60)
    assert not in_flight.is_alive()
    finish_reasons = [c.choices[0].finish_reason for c in streamed if c.choices]  # type: ignore[attr-defined]
    assert finish_reasons[-1] == "length", streamed[-3:]

    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
    after = client.completions.create(model=MODEL, prompt="Hi", max_tokens=5, extra_body={"ignore_eos": True})
    assert after.choices[0].finish_reason == "length" and after.usage.completion_tokens == 5
    # NOTE: each prompt is an engine request, and both prompts of the third fail in one message: four.
    assert server.metrics()['pagedserve:request_success_total{finished_reason="error"}'] == 4
    assert "crashed" not in server.log() and server.proc.poll() is None
