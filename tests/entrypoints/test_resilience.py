"""Faults end in errors, not hangs, and leave no process behind: a step that never finishes (a stopped
worker) and an engine that is frozen whole both trip --engine-stall-timeout; a SIGKILLed server takes its
engine and worker processes with it."""

import json
import os
import signal
import time

import httpx
import psutil
import pytest
from server_utils import API_SERVER, RemoteServer

MODEL = "tiny"
FLAGS = [
    "--max-model-len",
    "256",
    "--kv-cache-memory",
    "2MiB",
    "--served-model-name",
    MODEL,
    "--uvicorn-log-level",
    "warning",
]


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def assert_all_gone(processes: list[psutil.Process], timeout_s: float) -> None:
    """Every process ends (a zombie left to a non-reaping init counts as ended) within `timeout_s`."""

    def alive(process: psutil.Process) -> bool:
        try:
            return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    RemoteServer.wait_for(
        lambda: not any(alive(p) for p in processes),
        timeout_s,
        f"the processes to end: {[p.pid for p in processes if alive(p)]}",
    )


def stream_until_error(server: RemoteServer, on_first_chunk) -> tuple[dict, float]:
    """Stream a long completion; call `on_first_chunk()` at the first chunk; return the last event and
    when (time.monotonic()) the stream ended."""
    body = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
    }
    events: list[dict] = []
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
                if len(events) == 1:
                    on_first_chunk()
    return events[-1], time.monotonic()


def worker_pid(server: RemoteServer) -> int:
    """The (one) worker process of the mp executor: the engine's child named pagedserve-tp0."""
    workers = [
        p for p in psutil.Process(server.engine_pid()).children() if p.cmdline()[-1:] == ["pagedserve-tp0"]
    ]
    assert len(workers) == 1, workers
    return workers[0].pid


@pytest.mark.sampled
@pytest.mark.parametrize("frozen", ["worker", "engine"])
def test_stall_fails_requests_health_and_exits(tiny_llama: str, frozen: str) -> None:
    """worker: its step never finishes; the engine's own watchdog logs the step and exits. engine: the
    engine process is stopped whole; the server's watchdog kills it. Either way the stream ends with an
    error naming --engine-stall-timeout, /health answers 503, the server exits 1, nothing is left."""
    backend = "mp" if frozen == "worker" else "uni"
    server = RemoteServer(
        API_SERVER,
        [
            "--model",
            tiny_llama,
            *FLAGS,
            "--engine-stall-timeout",
            "1",
            "--distributed-executor-backend",
            backend,
        ],
    )
    try:
        tree = descendants(server.proc.pid)
        target = worker_pid(server) if frozen == "worker" else server.engine_pid()
        stopped_at: list[float] = []

        def freeze() -> None:
            os.kill(target, signal.SIGSTOP)
            stopped_at.append(time.monotonic())

        last, ended_at = stream_until_error(server, freeze)
        assert (
            "made no progress for 1 s while it had work (--engine-stall-timeout)" in last["error"]["message"]
        )
        assert ended_at - stopped_at[0] < (10 if frozen == "worker" else 15)
        statuses: list[int] = []
        server.wait_for(
            lambda: (
                statuses.append(httpx.get(f"{server.base_url}/health", timeout=5).status_code)
                or statuses[-1] == 503
            ),
            10,
            "/health to answer 503",
        )
        assert server.proc.wait(timeout=30) == 1
        assert_all_gone(tree, 20)
        log = server.log()
        if frozen == "worker":  # the engine's own watchdog saw the step
            assert (
                "has not finished. Running: 1 requests" in log
                and "The step in progress computes: cmpl-" in log
            )
        else:
            assert "sent nothing for" in log and "is killed" in log
    finally:
        server.stop()


def test_sigkill_of_the_server_leaves_no_process(tiny_llama: str) -> None:
    """SIGKILL gives the server no chance to clean up: the engine and its worker still end by themselves."""
    server = RemoteServer(API_SERVER, ["--model", tiny_llama, *FLAGS, "--distributed-executor-backend", "mp"])
    try:
        tree = descendants(server.proc.pid)
        assert worker_pid(server) in [p.pid for p in tree] and len(tree) >= 2  # engine, worker
        assert (
            httpx.post(
                f"{server.base_url}/v1/completions",
                timeout=60,
                json={"model": MODEL, "prompt": "Hi", "max_tokens": 4},
            ).status_code
            == 200
        )
        server.proc.kill()
        server.proc.wait(10)
        assert_all_gone(tree, 20)
    finally:
        server.stop()
