"""The server as deployment scripts use it: poll GET /health from the moment the process starts, send
requests after the first 200 (vLLM's contract); then SIGKILL it: nothing is left behind (no process, no
/tmp/pagedserve-* folder)."""

import os
import signal
import subprocess
import time

import httpx
import psutil
from server_utils import API_SERVER, free_port

STARTUP_TIMEOUT_S = 120.0


def _pagedserve_temp_entries(tmp: str) -> list[str]:
    return sorted(name for name in os.listdir(tmp) if name.startswith("pagedserve"))


def test_first_healthy_answer_serves_and_sigkill_leaves_nothing(tiny_llama: str, tmp_path) -> None:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    tmp = str(tmp_path)  # the server's TMPDIR: what it leaves there is ours to see
    proc = subprocess.Popen(
        [
            *API_SERVER,
            "--model",
            tiny_llama,
            "--max-model-len",
            "128",
            "--kv-cache-memory",
            "2MiB",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TMPDIR": tmp},
    )
    try:
        statuses: list[int | str] = []
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not statuses or statuses[-1] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, f"not healthy; polls: {statuses[-5:]}"
            try:
                statuses.append(httpx.get(f"{base_url}/health", timeout=5).status_code)
            except httpx.TransportError:
                statuses.append("refused")
            time.sleep(0.05)
        # At once, as a script would: the first request after the first 200 succeeds.
        response = httpx.post(
            f"{base_url}/v1/completions",
            timeout=60,
            json={"model": tiny_llama, "prompt": "Hello", "max_tokens": 4},
        )
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["finish_reason"] in ("length", "stop")
        assert set(statuses[:-1]) <= {"refused", 503}, statuses

        family = [proc.pid] + [child.pid for child in psutil.Process(proc.pid).children(recursive=True)]
        assert len(family) >= 2, "the engine core runs in its own process"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 15
        while any(
            psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            for pid in family[1:]
        ):
            assert time.monotonic() < deadline, "a child of the SIGKILLed server is still running"
            time.sleep(0.1)
        assert _pagedserve_temp_entries(tmp) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
