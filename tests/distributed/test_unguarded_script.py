"""Tensor parallelism from a plain script with no `if __name__ == "__main__":` guard, as users and
notebooks write it: offline (LLM) and as a server. The worker and engine processes are fresh
interpreters that never re-import the script; when the script ends, none of them is left running."""

import os
import subprocess
import sys
import time
import uuid

import httpx
import psutil

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "entrypoints"))
from server_utils import RemoteServer  # noqa: E402

_OFFLINE = """
import sys
from pagedserve import LLM, SamplingParams
print("SCRIPT RUNS", flush=True)  # printed once: the script is never imported again
llm = LLM(sys.argv[1], tensor_parallel_size=2, kv_cache_memory="4MiB", max_model_len=64)
out = llm.generate(["Hello"], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), use_tqdm=False)
print("TOKENS", len(out[0].outputs[0].token_ids), flush=True)
"""

_SERVER = """
import sys
from pagedserve.entrypoints.openai.api_server import main
print("SCRIPT RUNS", flush=True)
main(["--model", sys.argv[1], "--tensor-parallel-size", "2", "--kv-cache-memory", "4MiB", "--max-model-len",
      "64", *sys.argv[2:]])  # --host and --port
"""


def _marked(marker: str) -> list[psutil.Process]:
    """Running processes whose environment carries `marker` (the script and all it started)."""
    found = []
    for process in psutil.process_iter():
        try:
            if (
                process.environ().get("PAGEDSERVE_TEST_MARKER") == marker
                and process.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(process)
        except psutil.Error:
            continue
    return found


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "script.py"
    path.write_text(text)
    return str(path)


def _wait_gone(marker: str) -> None:
    deadline = time.monotonic() + 20
    while _marked(marker):
        assert time.monotonic() < deadline, f"left running: {[p.cmdline() for p in _marked(marker)]}"
        time.sleep(0.2)


def test_offline_tp2_from_an_unguarded_script(tiny_llama: str, tmp_path) -> None:
    marker = uuid.uuid4().hex
    proc = subprocess.run(
        [sys.executable, _write(tmp_path, _OFFLINE), tiny_llama],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PAGEDSERVE_TEST_MARKER": marker},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("SCRIPT RUNS") == 1 and "TOKENS 4" in proc.stdout
    _wait_gone(marker)


def test_server_tp2_from_an_unguarded_script(tiny_llama: str, tmp_path) -> None:
    marker = uuid.uuid4().hex
    server = RemoteServer(
        [sys.executable, _write(tmp_path, _SERVER)], [tiny_llama], env={"PAGEDSERVE_TEST_MARKER": marker}
    )  # returns once /health answers 200
    try:
        assert len(_marked(marker)) >= 4  # the script, the engine core, two workers
        response = httpx.post(
            f"{server.base_url}/v1/completions",
            timeout=60,
            json={"model": tiny_llama, "prompt": "Hello", "max_tokens": 4, "ignore_eos": True},
        )
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4
    finally:
        server.stop()  # SIGTERM: drains, then exits 0
    assert server.proc.returncode == 0 and server.log().count("SCRIPT RUNS") == 1, server.log()[-3000:]
    _wait_gone(marker)
