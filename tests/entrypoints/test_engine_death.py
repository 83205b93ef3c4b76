"""Killing the engine process: requests in flight fail promptly, /health answers 503, the server exits 1.
Started as `pagedserve serve MODEL` with a vLLM-style command line."""

import os
import shutil
import signal
import threading
import time

import httpx
import openai
import pytest
from server_utils import RemoteServer

NUM_STREAMS = 3
MODEL = "tiny-f16"


@pytest.fixture(scope="module")
def server(tiny_llama: str):
    executable = shutil.which("pagedserve")
    assert executable, "the `pagedserve` console script is not installed (pip install -e .)"
    # vLLM's flags as a vLLM user writes them (float16 runs on CPU too), plus a small KV cache.
    args = [
        tiny_llama,
        "--dtype",
        "float16",
        "--gpu-memory-utilization",
        "0.90",
        "--max-model-len",
        "256",
        "--kv-cache-memory",
        "4MiB",
        "--served-model-name",
        MODEL,
    ]
    server = RemoteServer([executable, "serve"], args)
    yield server
    server.stop()


def test_killed_engine_fails_requests_and_health(server: RemoteServer) -> None:
    client = server.client()
    first_chunk = threading.Barrier(NUM_STREAMS + 1, timeout=60)
    errors: list[BaseException | None] = [None] * NUM_STREAMS
    ended_at: list[float] = [0.0] * NUM_STREAMS

    def stream(index: int) -> None:
        try:
            chunks = client.completions.create(
                model=MODEL,
                prompt=f"Stream {index}",
                max_tokens=240,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            for number, _ in enumerate(chunks):
                if number == 0:
                    first_chunk.wait()
        except BaseException as exc:  # noqa: BLE001  # the thread reports whatever ended it
            errors[index] = exc
        ended_at[index] = time.monotonic()

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(NUM_STREAMS)]
    for thread in threads:
        thread.start()
    first_chunk.wait()
    os.kill(server.engine_pid(), signal.SIGKILL)
    killed_at = time.monotonic()

    statuses: list[int] = []
    server.wait_for(
        lambda: (
            statuses.append(httpx.get(server.base_url + "/health", timeout=5).status_code)
            or statuses[-1] == 503
        ),
        10,
        "/health to answer 503",
    )
    for thread in threads:
        thread.join(timeout=20)
        assert not thread.is_alive(), "a stream hung after the engine died"
    for error, ended in zip(errors, ended_at):
        assert isinstance(error, openai.APIError) and "engine core process" in str(error), error
        assert ended - killed_at < 10
    assert server.proc.wait(timeout=20) == 1
    log = server.log()
    assert f"{NUM_STREAMS} request(s) in flight" in log and "generated tokens" in log
