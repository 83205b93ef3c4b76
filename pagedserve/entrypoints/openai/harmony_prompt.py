"""A chat request as gpt-oss's prompt: the conversation rendered by openai-harmony, as vLLM renders it.

A system message carries the reasoning effort; the request's system and developer messages become the
developer message's instructions, with its function tools; an assistant's earlier reasoning is its
analysis channel, its content the final channel, each tool call a commentary message to
`functions.<name>` (JSON); a tool's answer comes from `functions.<name>` (named by the call it
answers). The prompt ends with `<|start|>assistant`: the model writes its channel first."""

import json
from collections.abc import Mapping, Sequence
from typing import cast

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    ToolDescription,
)

from pagedserve.entrypoints.openai.harmony_encoding import harmony_encoding
from pagedserve.errors import InvalidRequestError
from pagedserve.utils.user_json import JsonObject, JsonValue

HARMONY_EFFORTS = ("low", "medium", "high")  # the efforts harmony's system message can say


def render_harmony_prompt(
    conversation: Sequence[Mapping[str, JsonValue]],
    reasonings: Sequence[str | None],
    functions: Mapping[str, JsonObject],
    descriptions: Mapping[str, str],
    reasoning_effort: str | None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """The prompt's token ids. `conversation`: normalize_messages' (content as one string);
    `reasonings`: each message's earlier reasoning; `functions`: the tools (name -> parameters schema)
    with their `descriptions`. Raises InvalidRequestError for a tool message answering no known call."""
    system = SystemContent.new()
    if reasoning_effort is not None:
        if reasoning_effort not in HARMONY_EFFORTS:
            raise InvalidRequestError(
                f"reasoning_effort {reasoning_effort!r} is not one gpt-oss knows: use "
                f"{', '.join(HARMONY_EFFORTS)}.",
                param="reasoning_effort",
            )
        system = system.with_reasoning_effort(ReasoningEffort(reasoning_effort.capitalize()))
    messages = [Message.from_role_and_content(Role.SYSTEM, system)]
    instructions = [str(m["content"]) for m in conversation if m["role"] in ("system", "developer")]
    if instructions or functions:
        developer = DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions("\n\n".join(instructions))
        if functions:
            tools = [
                ToolDescription.new(name, descriptions.get(name, ""), dict(schema))
                for name, schema in functions.items()
            ]
            developer = developer.with_function_tools(tools)
        messages.append(Message.from_role_and_content(Role.DEVELOPER, developer))
    call_names: dict[str, str] = {}  # a call's id -> its function, for the tool message answering it
    for index, (message, reasoning) in enumerate(zip(conversation, reasonings)):
        messages += _messages(message, reasoning, index, call_names)
    encoding = harmony_encoding()
    rendered = Conversation.from_messages(messages)
    if not add_generation_prompt:
        return list(encoding.render_conversation(rendered))
    return list(encoding.render_conversation_for_completion(rendered, Role.ASSISTANT))


def _messages(
    message: Mapping[str, JsonValue], reasoning: str | None, index: int, call_names: dict[str, str]
) -> list[Message]:
    role, content = message["role"], str(message["content"] or "")
    if role == "user":
        return [Message.from_role_and_content(Role.USER, content)]
    if role == "tool":
        name = message.get("name") or call_names.get(str(message.get("tool_call_id")))
        if not isinstance(name, str):
            raise InvalidRequestError(
                f"messages[{index}] answers no tool call of an earlier assistant message: set its "
                "tool_call_id to that call's id (or its name to the function's).",
                param=f"messages[{index}].tool_call_id",
            )
        author = Author.new(Role.TOOL, f"functions.{name}")
        answer = Message.from_author_and_content(author, content)
        return [answer.with_channel("commentary").with_recipient("assistant")]
    if role != "assistant":
        return []  # system and developer: the developer message's instructions
    said: list[Message] = []
    if reasoning:
        said.append(Message.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis"))
    # NOTE: the request's schema (protocol.py) has checked each call's shape
    calls = cast("list[dict[str, dict[str, JsonValue]]]", message.get("tool_calls") or [])
    for call in calls:
        function = call["function"]
        call_names[str(call.get("id"))] = str(function["name"])
        arguments = Message.from_role_and_content(
            Role.ASSISTANT, json.dumps(function["arguments"], ensure_ascii=False)
        )
        said.append(
            arguments.with_channel("commentary")
            .with_recipient(f"functions.{function['name']}")
            .with_content_type("<|constrain|>json")
        )
    if content:
        said.append(Message.from_role_and_content(Role.ASSISTANT, content).with_channel("final"))
    return said
