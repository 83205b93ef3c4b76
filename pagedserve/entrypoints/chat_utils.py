"""Chat conversations -> prompt token ids through the tokenizer's (or a given) chat template.
Shared by `LLM.chat` and the OpenAI-compatible server."""

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pagedserve.errors import ConfigError, InvalidRequestError
from pagedserve.utils.user_json import JsonObject, JsonValue

ROLES = ("system", "user", "assistant", "tool", "developer")
# OpenAI's newer name for "system" (as vLLM, templates get "system").
_ROLE_ALIASES = {"developer": "system"}
# apply_chat_template's own arguments (and the conversation's template name): a chat_template_kwargs
# key may not replace them.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def load_chat_template(value: str | None) -> str | None:
    """--chat-template: a file holding a Jinja template, or the template itself (vLLM's rule: a value
    that looks like a path but is no file is an error)."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as file:
            return file.read()
    if any(c in value for c in "{}\n"):
        return value
    raise ConfigError(f"--chat-template {value!r} is neither a file nor a Jinja template.")


ContentFormat = Literal["auto", "string", "openai"]
# A template that loops over a message's content (`{% for part in message['content'] %}`) expects
# OpenAI's list of parts; any other reads it as one string.
_LOOPS_OVER_CONTENT = re.compile(r"for\s+\w+\s+in\s+\w+(\.content|\[\s*['\"]content['\"]\s*\])")


def resolve_content_format(
    content_format: ContentFormat, template: str | None
) -> Literal["string", "openai"]:
    """--chat-template-content-format: auto detects what `template` expects (string when unknown)."""
    if content_format != "auto":
        return content_format
    return "openai" if template and _LOOPS_OVER_CONTENT.search(template) else "string"


def _content(content: JsonValue, index: int, content_format: str) -> str | list[JsonValue]:
    """A message's content as the template expects it: one string, or OpenAI's text parts."""
    texts = _texts(content, index)
    if content_format == "string":
        return "\n".join(texts)
    return [{"type": "text", "text": text} for text in texts]


def _texts(content: JsonValue, index: int) -> list[str]:
    """The text of each part of a message's content (a string is one part, null none)."""
    if isinstance(content, str):
        return [content]
    if content is None:
        return []
    if isinstance(content, Sequence):
        texts = []
        for part in content:
            text = part.get("text") if isinstance(part, Mapping) and part.get("type") == "text" else None
            if not isinstance(text, str):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise InvalidRequestError(
                    f"messages[{index}].content: only text parts ({{'type': 'text', "
                    f"'text': ...}}) are supported, got {kind!r}.",
                    param=f"messages[{index}].content",
                )
            texts.append(text)
        return texts
    raise InvalidRequestError(
        f"messages[{index}].content must be a string or a list of text parts.",
        param=f"messages[{index}].content",
    )


def normalize_messages(
    messages: Sequence[Mapping[str, JsonValue]], content_format: Literal["string", "openai"] = "string"
) -> list[JsonObject]:
    """Check roles and give each content as `content_format` says (text parts joined into one string, or
    a list of text parts); keep an assistant's `tool_calls` (their arguments as objects, which chat
    templates expect) and a tool message's `tool_call_id` and `name`. Raises InvalidRequestError."""
    if not messages:
        raise InvalidRequestError("messages must contain at least one message.", param="messages")
    conversation = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidRequestError(
                f"messages[{index}].role {role!r} is not supported; use one of {', '.join(ROLES)}.",
                param=f"messages[{index}].role",
            )
        role = _ROLE_ALIASES.get(role, role)
        entry: JsonObject = {
            "role": role,
            "content": _content(message.get("content"), index, content_format),
        }
        tool_calls = message.get("tool_calls")
        if role == "assistant" and tool_calls:
            if not isinstance(tool_calls, list):
                raise _bad_tool_call(index)
            entry["tool_calls"] = [_template_tool_call(call, index) for call in tool_calls]
        if role == "tool":
            entry.update(
                {key: message[key] for key in ("tool_call_id", "name") if message.get(key) is not None}
            )
        conversation.append(entry)
    return conversation


def _template_tool_call(call: JsonValue, index: int) -> JsonValue:
    function = call.get("function") if isinstance(call, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(call, Mapping) or not isinstance(function, Mapping) or not isinstance(name, str):
        raise _bad_tool_call(index)
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise InvalidRequestError(
                f"messages[{index}].tool_calls: arguments of {name!r} are not JSON: {exc}.",
                param=f"messages[{index}].tool_calls",
            ) from exc
    return {"id": call.get("id"), "type": "function", "function": {"name": name, "arguments": arguments}}


def _bad_tool_call(index: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"messages[{index}].tool_calls entries must be {{'id': ..., 'type': "
        "'function', 'function': {'name': ..., 'arguments': ...}}.",
        param=f"messages[{index}].tool_calls",
    )


def check_template_kwargs(template_kwargs: Mapping[str, JsonValue] | None) -> None:
    """Raises InvalidRequestError for a chat_template_kwargs key that would replace one of
    apply_chat_template's own arguments."""
    clashes = sorted(set(template_kwargs or ()) & RESERVED_TEMPLATE_KWARGS)
    if clashes:
        raise InvalidRequestError(
            f"chat_template_kwargs may not set {', '.join(clashes)}: the request's own fields "
            "(messages, tools, documents, add_generation_prompt, ...) set those; remove them.",
            param="chat_template_kwargs",
        )


def apply_chat_template(
    tokenizer: Any,
    conversation: Sequence[Mapping[str, JsonValue]],
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, JsonValue]] | None = None,
    *,
    continue_final_message: bool = False,
    documents: list[dict[str, str]] | None = None,
    template_kwargs: Mapping[str, JsonValue] | None = None,
) -> list[int]:
    """The prompt token ids of a conversation (`tools` go to the template's `tools`, `documents` to its
    `documents`, `template_kwargs` are further template variables, e.g. enable_thinking). Raises
    InvalidRequestError when there is no template, a template kwarg clashes with an argument, or the
    template rejects the conversation (e.g. roles that do not alternate)."""
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise InvalidRequestError(
            "The model's tokenizer has no chat template: start the server with "
            "--chat-template, or use the completions API.",
            param="messages",
        )
    check_template_kwargs(template_kwargs)
    try:
        token_ids = tokenizer.apply_chat_template(
            list(conversation),
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            documents=documents,
            tokenize=True,
            return_dict=False,
            **(template_kwargs or {}),
        )
    except Exception as exc:  # jinja2's TemplateError (raise_exception) and friends
        raise InvalidRequestError(
            f"The chat template rejected the conversation: {exc}", param="messages"
        ) from exc
    return list(token_ids)
