"""Chat or completion chunks -> Ollama's replies: while streaming one NDJSON line per delta and a last one
with `done` and Ollama's counters (durations in nanoseconds); otherwise that last one carrying the whole
answer. /api/chat's replies hold a `message`, /api/generate's a `response` text."""

import json
import time
from collections.abc import AsyncGenerator, Callable
from datetime import UTC, datetime
from typing import Literal, TypeVar

from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from pagedserve.entrypoints.openai.chat_translation import json_object
from pagedserve.entrypoints.openai.errors import exception_message
from pagedserve.entrypoints.openai.protocol import UsageInfo
from pagedserve.entrypoints.openai.protocol_chat import ChatCompletionChunk
from pagedserve.entrypoints.openai.protocol_completion import CompletionResponse

NDJSON = "application/x-ndjson"
# Chat's finish reasons as Ollama's done_reason (Ollama ends a turn with tool calls as "stop").
_DONE_REASONS = {"tool_calls": "stop", "abort": "stop"}

Chunk = TypeVar("Chunk", bound=BaseModel)


def created_at() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def ndjson(line: dict[str, object]) -> str:
    return json.dumps(line, ensure_ascii=False) + "\n"


class OllamaReply:
    """One answer's text, thinking, tool calls and counters, fed chunk by chunk. `started_ns`: when the
    request arrived (time.monotonic_ns)."""

    def __init__(self, model: str, kind: Literal["message", "response"], started_ns: int) -> None:
        self.model = model
        self.kind = kind
        self.started_ns = started_ns
        self.first_ns: int | None = None  # the first output: the prompt is evaluated
        self.content = ""
        self.thinking = ""
        self.calls: dict[int, dict[str, str]] = {}  # chat's tool-call index -> its name and arguments
        self.usage = UsageInfo()
        self.finish_reason: str | None = None

    def feed_chat(self, chunk: ChatCompletionChunk) -> dict[str, object] | None:
        """The line that streams this chunk (None: nothing to send)."""
        text = thinking = ""
        for choice in chunk.choices:
            text += choice.delta.content or ""
            thinking += choice.delta.reasoning or ""
            for call in choice.delta.tool_calls or ():
                function = call.get("function", {})
                entry = self.calls.setdefault(
                    call["index"], {"name": function.get("name", ""), "arguments": ""}
                )
                entry["arguments"] += function.get("arguments") or ""
            self.finish_reason = choice.finish_reason or self.finish_reason
        return self._fed(chunk.usage, text, thinking)

    def feed_completion(self, chunk: CompletionResponse) -> dict[str, object] | None:
        """The line that streams this chunk (None: nothing to send)."""
        for choice in chunk.choices:
            self.finish_reason = choice.finish_reason or self.finish_reason
        return self._fed(chunk.usage, "".join(choice.text for choice in chunk.choices), "")

    def _fed(self, usage: UsageInfo | None, text: str, thinking: str) -> dict[str, object] | None:
        if self.first_ns is None:
            self.first_ns = time.monotonic_ns()
        self.usage = usage or self.usage
        self.content += text
        self.thinking += thinking
        return self._line(text, thinking, []) if text or thinking else None

    def tool_calls(self) -> list[dict[str, object]]:
        """Ollama's tool calls: each function's arguments as an object."""
        return [
            {"function": {"name": call["name"], "arguments": json_object(call["arguments"])}}
            for _, call in sorted(self.calls.items())
        ]

    def stream_end(self) -> list[dict[str, object]]:
        """The lines that end a stream: the tool calls (whole, as Ollama sends them), then `done`."""
        calls = self.tool_calls()
        return [*([self._line("", "", calls)] if calls else []), self.done("", "", [])]

    def whole(self) -> dict[str, object]:
        return self.done(self.content, self.thinking, self.tool_calls())

    def done(self, text: str, thinking: str, calls: list[dict[str, object]]) -> dict[str, object]:
        end_ns = time.monotonic_ns()
        first_ns = self.first_ns or end_ns
        reason = self.finish_reason or "stop"
        return {
            **self._line(text, thinking, calls),
            "done": True,
            "done_reason": _DONE_REASONS.get(reason, reason),
            "total_duration": end_ns - self.started_ns,
            "load_duration": 0,  # the model is resident
            "prompt_eval_count": self.usage.prompt_tokens,
            "prompt_eval_duration": first_ns - self.started_ns,
            "eval_count": self.usage.completion_tokens,
            "eval_duration": end_ns - first_ns,
        }

    def _line(self, text: str, thinking: str, calls: list[dict[str, object]]) -> dict[str, object]:
        line: dict[str, object] = {"model": self.model, "created_at": created_at()}
        if self.kind == "message":
            message: dict[str, object] = {"role": "assistant", "content": text}
            line["message"] = message
        else:  # /api/generate's thinking sits beside its response
            line["response"] = text
            message = line
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = calls
        return {**line, "done": False}


def loaded(model: str, kind: Literal["message", "response"]) -> dict[str, object]:
    """Ollama's answer to a request with nothing to generate (no prompt, no messages): the model is
    loaded, done_reason "load"."""
    line = OllamaReply(model, kind, time.monotonic_ns())._line("", "", [])
    return {**line, "done": True, "done_reason": "load"}


async def ndjson_lines(
    reply: OllamaReply,
    chunks: AsyncGenerator[Chunk, None],
    feed: Callable[[Chunk], dict[str, object] | None],
) -> AsyncGenerator[str, None]:
    """The stream; an error midway as Ollama's {"error": ...} line (its client raises it)."""
    try:
        async for chunk in chunks:
            line = feed(chunk)
            if line is not None:
                yield ndjson(line)
        for line in reply.stream_end():
            yield ndjson(line)
    except Exception as exc:
        yield ndjson({"error": exception_message(exc)})
    finally:
        await chunks.aclose()


async def whole_reply(
    reply: OllamaReply,
    chunks: AsyncGenerator[Chunk, None],
    feed: Callable[[Chunk], dict[str, object] | None],
) -> dict[str, object]:
    try:
        async for chunk in chunks:
            feed(chunk)
    finally:
        await chunks.aclose()
    return reply.whole()


async def answer(
    reply: OllamaReply,
    chunks: AsyncGenerator[Chunk, None],
    feed: Callable[[Chunk], dict[str, object] | None],
    stream: bool,
) -> dict[str, object] | StreamingResponse:
    """The NDJSON stream, or (stream false) the one object."""
    if stream:
        return StreamingResponse(ndjson_lines(reply, chunks, feed), media_type=NDJSON)
    return await whole_reply(reply, chunks, feed)
