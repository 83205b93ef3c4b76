"""Chat-completion chunks -> the Responses API's output items and stream events, in the official order:
response.created, response.in_progress, then per output item output_item.added, its content part's
added / deltas / done (output_text, reasoning_text) or its function_call_arguments deltas / done,
output_item.done, and last response.completed (response.incomplete when cut at max_output_tokens,
response.failed on an error). A non-streamed response is the same run with the events dropped."""

import time
import uuid
from dataclasses import dataclass

from pagedserve.entrypoints.openai.chat_translation import GrowingText, named_event, tool_call_delta
from pagedserve.entrypoints.openai.protocol import UsageInfo
from pagedserve.entrypoints.openai.protocol_chat import ChatCompletionChunk
from pagedserve.entrypoints.openai.tool_parsers.streaming import ToolCallDelta
from pagedserve.utils.user_json import JsonObject, JsonValue


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class _OutputItem:
    """An output item of the response: its JSON, its place in `output`, and its growing text (a message's
    or reasoning item's content part, or a function call's arguments)."""

    json: JsonObject
    index: int
    text: GrowingText


class ResponseBuilder:
    """One response's state: `response` is the Response object so far; each method returns the events
    (server-sent, named) that the step makes."""

    def __init__(self, response: JsonObject) -> None:
        self.response = response
        self.output: list[JsonObject] = []  # `response["output"]`, which holds the same items
        self.sequence_number = 0
        self.open: _OutputItem | None = None  # the output item receiving deltas
        self.calls: dict[int, _OutputItem] = {}  # chat's tool-call index -> its function_call item
        self.finish_reason: str | None = None

    def _event(self, event_type: str, **data: JsonValue) -> str:
        event = named_event(event_type, {"type": event_type, "sequence_number": self.sequence_number, **data})
        self.sequence_number += 1
        return event

    def start(self) -> list[str]:
        return [
            self._event("response.created", response=self.response),
            self._event("response.in_progress", response=self.response),
        ]

    def feed(self, chunk: ChatCompletionChunk) -> list[str]:
        events: list[str] = []
        if chunk.usage is not None:
            self._set_usage(chunk.usage)
        for choice in chunk.choices:
            reasoning = getattr(choice.delta, "reasoning", None)  # with --reasoning-parser
            if reasoning:
                events += self._text_delta("reasoning", reasoning)
            if choice.delta.content:
                events += self._text_delta("message", choice.delta.content)
            for call in choice.delta.tool_calls or ():
                events += self._call_delta(tool_call_delta(call))
            self.finish_reason = choice.finish_reason or self.finish_reason
        return events

    def finish(self) -> list[str]:
        """The last events: the open item closed, the response completed (or incomplete)."""
        events = self._close()
        if self.finish_reason == "length":
            self.response.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
            return [*events, self._event("response.incomplete", response=self._finished())]
        self.response["status"] = "completed"
        return [*events, self._event("response.completed", response=self._finished())]

    def cancel(self) -> list[str]:
        """Ended by POST /v1/responses/{id}/cancel: what was made so far, status cancelled."""
        events = self._close()
        self.response["status"] = "cancelled"
        return [*events, self._event("response.completed", response=self._finished())]

    def fail(self, message: str) -> list[str]:
        self.response.update(status="failed", error={"code": "server_error", "message": message})
        return [self._event("response.failed", response=self._finished())]

    def _finished(self) -> JsonObject:
        self.response["completed_at"] = time.time()
        return self.response

    def _set_usage(self, usage: UsageInfo) -> None:
        details = getattr(usage, "completion_tokens_details", None)  # reasoning_tokens: --reasoning-parser
        cached = usage.prompt_tokens_details  # the prefix cache's hit
        self.response["usage"] = {
            "input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0 if cached is None else cached.cached_tokens},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": getattr(details, "reasoning_tokens", None) or 0},
            "total_tokens": usage.total_tokens,
        }

    def _add(self, item: JsonObject, text: GrowingText) -> list[str]:
        events = self._close()
        self.open = _OutputItem(item, len(self.output), text)
        self.output.append(item)
        self.response["output"] = [*self.output]
        return [*events, self._event("response.output_item.added", output_index=self.open.index, item=item)]

    def _text_delta(self, kind: str, delta: str) -> list[str]:
        """Text of a message (output_text) or of a reasoning item (reasoning_text)."""
        events: list[str] = []
        if self.open is None or self.open.json["type"] != kind:
            part_type = "output_text" if kind == "message" else "reasoning_text"
            part: JsonObject = {"type": part_type, "text": ""}
            item: JsonObject = {"type": kind, "status": "in_progress", "content": []}
            if kind == "message":
                part |= {"annotations": [], "logprobs": []}
                item |= {"id": item_id("msg"), "role": "assistant"}
            else:
                item |= {"id": item_id("rs"), "summary": []}
            events += self._add(item, GrowingText(part, "text"))
            item["content"] = [part]
            events.append(self._event("response.content_part.added", **self._where(), part=dict(part)))
        assert self.open is not None
        self.open.text.append(delta)
        name = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra: JsonObject = {"logprobs": []} if kind == "message" else {}
        return [*events, self._event(name, **self._where(), delta=delta, **extra)]

    def _call_delta(self, call: ToolCallDelta) -> list[str]:
        item = self.calls.get(call.index)
        events: list[str] = []
        if item is None:
            json: JsonObject = {
                "id": item_id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "call_id": call.id or item_id("call"),
                "name": call.name or "",
                "arguments": "",
            }
            events += self._add(json, GrowingText(json, "arguments"))
            assert self.open is not None
            item = self.calls[call.index] = self.open
        if call.arguments:
            item.text.append(call.arguments)
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item.json["id"],
                    output_index=item.index,
                    delta=call.arguments,
                )
            )
        return events

    def _where(self) -> JsonObject:
        assert self.open is not None
        return {"item_id": self.open.json["id"], "output_index": self.open.index, "content_index": 0}

    def _close(self) -> list[str]:
        """The open item's done events."""
        item, self.open = self.open, None
        if item is None:
            return []
        item.json["status"] = "completed"
        index = item.index
        events = []
        if item.json["type"] == "function_call":
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item.json["id"],
                    output_index=index,
                    name=item.json["name"],
                    arguments=item.text.text,
                )
            )
        else:
            part = item.text.holder
            where: JsonObject = {"item_id": item.json["id"], "output_index": index, "content_index": 0}
            if item.json["type"] == "message":
                events.append(
                    self._event("response.output_text.done", **where, text=item.text.text, logprobs=[])
                )
            else:
                events.append(self._event("response.reasoning_text.done", **where, text=item.text.text))
            events.append(self._event("response.content_part.done", **where, part=part))
        return [*events, self._event("response.output_item.done", output_index=index, item=item.json)]
