"""The benchmarks' client (benchmarks/serving.py, used by overload.py too) against a real server: a stream
cut by its deadline (finish_reason "abort") got tokens, yet is neither completed nor goodput."""

import argparse
import asyncio
import os
import sys

import httpx
import pytest
from server_utils import API_SERVER, RemoteServer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "benchmarks"))
from serving import stream_request, summarize  # noqa: E402

MODEL = "tiny"


@pytest.fixture(scope="module")
def server(tiny_llama: str):
    server = RemoteServer(
        API_SERVER,
        [
            "--model",
            tiny_llama,
            "--served-model-name",
            MODEL,
            "--max-model-len",
            "512",
            "--kv-cache-memory",
            "8MiB",
            "--uvicorn-log-level",
            "warning",
        ],
    )
    yield server
    server.stop()


def test_deadline_aborted_stream_is_not_completed(server: RemoteServer) -> None:
    async def send() -> list:
        async with httpx.AsyncClient(timeout=120) as client:
            url = f"{server.base_url}/v1/completions"
            body = {
                "model": MODEL,
                "prompt": [1, 2, 3],
                "stream": True,
                "ignore_eos": True,
                "stream_options": {"include_usage": True},
            }
            whole = await stream_request(client, url, {**body, "max_tokens": 8})
            # A deadline of ~50 tokens' time (as fast as this machine is now) cuts a 500-token stream.
            deadline_s = max(0.5, 50 * whole.latency / whole.output_tokens)
            cut = await stream_request(client, url, {**body, "max_tokens": 500, "timeout": deadline_s})
            return [cut, whole]

    cut, whole = asyncio.run(send())
    assert 0 < cut.output_tokens < 500 and cut.ttft > 0, f"not cut after its first token: {cut}"
    assert cut.finish_reason == "abort" and not cut.ok and "abort" in cut.error
    assert whole.ok and whole.finish_reason == "length" and whole.output_tokens == 8
    summary = summarize([cut, whole], duration=1.0)
    assert (summary["successful_requests"], summary["failed_requests"]) == (1, 1)
    assert summary["total_output_tokens"] == 8


@pytest.mark.parametrize("dataset", ["random", "copy"])
def test_overload_and_serving_build_the_same_workloads(dataset: str, tiny_llama: str) -> None:
    """overload.py parses its own flags but builds its workload with serving.py's builder: every field
    the builder reads must exist in both parsers."""
    import overload
    import serving

    flags = ["--dataset", dataset, "--tokenizer", tiny_llama, "--input-len-min", "8", "--input-len-max", "16"]
    flags += ["--output-len-max", "4"]
    overload_args = vars(overload.parse_args(flags)) | {"num_prompts": 3, "request_rate": 2.0}
    workloads = [
        serving.build_workload(serving.parse_args([*flags, "--num-prompts", "3", "--request-rate", "2"])),
        serving.build_workload(argparse.Namespace(**overload_args)),
    ]
    assert workloads[0].prompts and workloads[0].prompts == workloads[1].prompts
