"""The chat path's reasoning (`delta.reasoning`, with --reasoning-parser) as Responses reasoning items and
events and as Anthropic thinking blocks: chunks as the chat path streams them, through both translators,
checked against the official clients' event types."""

import json

import anthropic.types as anthropic_types
import openai.types.responses as responses_types
import pydantic

from pagedserve.entrypoints.openai.protocol import UsageInfo
from pagedserve.entrypoints.openai.protocol_chat import ChatCompletionChunk, ChatStreamChoice, DeltaMessage
from pagedserve.entrypoints.openai.responses_events import ResponseBuilder
from pagedserve.entrypoints.openai.serving_messages import MessageBuilder


class ReasoningDelta(DeltaMessage):
    """A delta as the chat path sends it with a reasoning parser."""

    reasoning: str | None = None


def _chunks() -> list[ChatCompletionChunk]:
    deltas = [
        ReasoningDelta(role="assistant", content=""),
        ReasoningDelta(reasoning="Ada is "),
        ReasoningDelta(reasoning="a name."),
        ReasoningDelta(content="Hello, "),
        ReasoningDelta(content="Ada!"),
    ]
    chunks = [
        ChatCompletionChunk(id="c", created=0, model="m", choices=[ChatStreamChoice(index=0, delta=d)])
        for d in deltas
    ]
    chunks[-1].choices[0].finish_reason = "stop"
    chunks[-1].usage = UsageInfo(prompt_tokens=5, completion_tokens=6, total_tokens=11)
    return chunks


def _data(events: list[str]) -> list[dict]:
    return [json.loads(event.split("data: ", 1)[1]) for event in events]


def test_reasoning_becomes_a_reasoning_item_and_its_events() -> None:
    builder = ResponseBuilder({"id": "resp_1", "object": "response", "output": [], "status": "in_progress"})
    events = builder.start()
    for chunk in _chunks():
        events += builder.feed(chunk)
    events += builder.finish()
    data = _data(events)
    adapter = pydantic.TypeAdapter(responses_types.ResponseStreamEvent)
    parsed = [
        adapter.validate_python(event)
        for event in data
        if event["type"] not in ("response.created", "response.in_progress", "response.completed")
    ]
    assert [event.type for event in parsed] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    reasoning, message = builder.output
    assert reasoning["type"] == "reasoning" and reasoning["content"][0]["text"] == "Ada is a name."
    assert message["content"][0]["text"] == "Hello, Ada!"
    assert [event["sequence_number"] for event in data] == list(range(len(data)))


def test_reasoning_becomes_a_thinking_block() -> None:
    builder = MessageBuilder("m")
    events = []
    for chunk in _chunks():
        events += builder.feed(chunk)
    events += builder.finish()
    adapter = pydantic.TypeAdapter(anthropic_types.RawMessageStreamEvent)
    parsed = [adapter.validate_python(event) for event in _data(events)]
    deltas = [event.delta.type for event in parsed if event.type == "content_block_delta"]
    assert deltas == ["thinking_delta", "thinking_delta", "text_delta", "text_delta"]
    message = anthropic_types.Message.model_validate(builder.message)
    thinking, text = message.content
    assert (thinking.type, thinking.thinking, text.text) == ("thinking", "Ada is a name.", "Hello, Ada!")
    assert (message.stop_reason, message.usage.output_tokens) == ("end_turn", 6)
