"""A real server process on 127.0.0.1 for the tests, with bounded waits everywhere."""

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import psutil

STARTUP_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RemoteServer:
    """`command` is the command line up to the flags (e.g. python -m ...api_server); host and port are
    added. The log (stdout and stderr) goes to a file, readable with `log()`."""

    def __init__(
        self,
        command: list[str],
        args: list[str],
        api_key: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.api_key = api_key
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._log_file = tempfile.NamedTemporaryFile(
            "w+", prefix="pagedserve-server-", suffix=".log", delete=False
        )
        self.proc = subprocess.Popen(
            [*command, *args, "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"The server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"The server was not ready in {STARTUP_TIMEOUT_S} s:\n{self.log()}")

    def log(self) -> str:
        with open(self._log_file.name, encoding="utf-8", errors="replace") as file:
            return file.read()

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.base_url}/v1", api_key=self.api_key or "none", timeout=60, max_retries=0
        )

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.base_url}/v1", api_key=self.api_key or "none", timeout=60, max_retries=0
        )

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics by its name with labels less model_name and engine, e.g.
        'pagedserve:num_requests_running'."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                base, _, labels = name.partition("{")
                kept = [
                    label
                    for label in labels.rstrip("}").split(",")
                    if label and not label.startswith(("model_name=", "engine="))
                ]
                samples[base + ("{" + ",".join(kept) + "}" if kept else "")] = float(value)
        return samples

    def engine_pid(self) -> int:
        """The EngineCore process: the server's child (python -m pagedserve.utils.child_main FD EngineCore)."""
        children = psutil.Process(self.proc.pid).children()
        engines = [c.pid for c in children if c.cmdline()[-1:] == ["EngineCore"]]
        assert len(engines) == 1, f"expected one engine process among {children}"
        return engines[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log_file.close()

    @staticmethod
    def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"Timed out after {timeout_s} s waiting for {what}.")
            time.sleep(0.1)


API_SERVER = [sys.executable, "-m", "pagedserve.entrypoints.openai.api_server"]


def forced_tool_call(client: openai.OpenAI, model: str | None, tools: list[dict], regex: str) -> Any:
    """The one call of a tool_choice "auto" chat completion whose output `regex` forces to "Checking."
    then the call: whole, and streamed (its chunks reassembled to the same content, call and finish)."""
    kwargs: dict[str, Any] = dict(
        model=model,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=tools,
        tool_choice="auto",
        max_tokens=80,
        temperature=0,
        extra_body={"guided_regex": regex},
    )
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content == "Checking."
    (call,) = whole.message.tool_calls
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        finish = choice.finish_reason or finish
        for delta_call in choice.delta.tool_calls or []:
            entry = calls.setdefault(delta_call.index, {"name": None, "arguments": ""})
            entry["name"] = delta_call.function.name or entry["name"]
            entry["arguments"] += delta_call.function.arguments or ""
    assert content == "Checking." and finish == "tool_calls"
    assert calls == {0: {"name": call.function.name, "arguments": call.function.arguments}}
    return call
