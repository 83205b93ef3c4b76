"""Chat conversations -> prompt token ids through the tokenizer's (or a given) chat template.
Shared by `LLM.chat` and the OpenAI-compatible server."""

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pagedserve.config.multimodal import MultiModalConfig
from pagedserve.engine.input_processor import PromptType
from pagedserve.engine.tokenizer import AnyTokenizer
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


def _content(
    content: JsonValue, index: int, content_format: str, image_placeholder: str | None
) -> str | list[JsonValue]:
    """A message's content as the template expects it: one string, or OpenAI's text parts (an image part
    becomes the model's image placeholder, where the processor later puts the image's tokens)."""
    texts = _texts(content, index, image_placeholder)
    if content_format == "string":
        return "\n".join(texts)
    return [{"type": "text", "text": text} for text in texts]


def _texts(content: JsonValue, index: int, image_placeholder: str | None) -> list[str]:
    """The text of each part of a message's content (a string is one part, null none)."""
    if isinstance(content, str):
        return [content]
    if content is None:
        return []
    if isinstance(content, Sequence):
        return [_text(part, index, image_placeholder) for part in content]
    raise InvalidRequestError(
        f"messages[{index}].content must be a string or a list of text and image_url parts.",
        param=f"messages[{index}].content",
    )


def _text(part: JsonValue, index: int, image_placeholder: str | None) -> str:
    param = f"messages[{index}].content"
    kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
    text = part.get("text") if isinstance(part, Mapping) else None
    if kind == "text" and isinstance(text, str):
        return text
    if kind != "image_url" or not isinstance(part, Mapping):
        raise InvalidRequestError(
            f"{param}: only text ({{'type': 'text', 'text': ...}}) and image_url parts are supported, "
            f"got {kind!r}.",
            param=param,
        )
    if image_placeholder is None:
        raise InvalidRequestError(
            f"{param}: this model takes no images (its architecture is text-only); send text parts only.",
            param=param,
        )
    _image_url(part, index)
    return image_placeholder


def _image_url(part: Mapping[str, JsonValue], index: int) -> str:
    """The URL of an image_url part, {"type": "image_url", "image_url": {"url": ...}}."""
    image_url = part.get("image_url")
    url = image_url.get("url") if isinstance(image_url, Mapping) else None
    if not isinstance(url, str) or not url:
        raise InvalidRequestError(
            f"messages[{index}].content: an image_url part needs {{'image_url': {{'url': URL}}}} with a "
            "non-empty data:, http(s):// or file:// URL.",
            param=f"messages[{index}].content",
        )
    return url


def image_urls(messages: Sequence[Mapping[str, JsonValue]]) -> list[str]:
    """The URLs of the conversation's image_url parts, in order (after normalize_messages checked them)."""
    return [
        _image_url(part, index)
        for index, message in enumerate(messages)
        for part in _parts(message.get("content"))
        if part.get("type") == "image_url"
    ]


def _parts(content: JsonValue) -> list[Mapping[str, JsonValue]]:
    return [part for part in content if isinstance(part, Mapping)] if isinstance(content, list) else []


def image_placeholder(tokenizer: AnyTokenizer, multimodal: MultiModalConfig | None) -> str | None:
    """The text an image part becomes in the template (the prompt's image token, e.g. LLaVA's "<image>",
    Gemma 3's "<start_of_image>", framed by Qwen2-VL's vision start and end tokens where the config has
    them, as its chat template frames it); None for a text-only model, which refuses image parts."""
    if multimodal is None:
        return None
    start = getattr(multimodal.hf_config, "vision_start_token_id", None)
    end = getattr(multimodal.hf_config, "vision_end_token_id", None)
    if start is None or end is None:
        return str(tokenizer.convert_ids_to_tokens(multimodal.prompt_token_id))
    return "".join(tokenizer.convert_ids_to_tokens([int(start), multimodal.prompt_token_id, int(end)]))


def with_images(prompt: PromptType, messages: Sequence[Mapping[str, JsonValue]]) -> PromptType:
    """The engine's prompt for a rendered conversation: with its image URLs when it has image parts."""
    urls = image_urls(messages)
    if not urls:
        return prompt
    base = prompt if isinstance(prompt, dict) else {"prompt_token_ids": prompt}
    return {**base, "multi_modal_data": {"image": urls}}


def normalize_messages(
    messages: Sequence[Mapping[str, JsonValue]],
    content_format: Literal["string", "openai"] = "string",
    image_placeholder: str | None = None,
) -> list[JsonObject]:
    """Check roles and give each content as `content_format` says (text parts joined into one string, or
    a list of text parts; an image_url part as `image_placeholder`, None refusing images); keep an
    assistant's `tool_calls` (their arguments as objects, which chat templates expect) and a tool
    message's `tool_call_id` and `name`. Raises InvalidRequestError."""
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
            "content": _content(message.get("content"), index, content_format, image_placeholder),
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
