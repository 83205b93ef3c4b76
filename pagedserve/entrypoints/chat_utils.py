"""Chat conversations -> prompt token ids through the tokenizer's (or a given) chat template.
Shared by `LLM.chat` and the OpenAI-compatible server."""
import os
from collections.abc import Mapping, Sequence
from typing import Any

from pagedserve.errors import ConfigError, InvalidRequestError

ROLES = ("system", "user", "assistant")


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


def _text_content(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, Sequence):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"),
                                                                                              str):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise InvalidRequestError(f"messages[{index}].content: only text parts ({{'type': 'text', "
                                          f"'text': ...}}) are supported, got {kind!r}.",
                                          param=f"messages[{index}].content")
            texts.append(part["text"])
        return "\n".join(texts)
    raise InvalidRequestError(f"messages[{index}].content must be a string or a list of text parts.",
                              param=f"messages[{index}].content")


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Check roles and flatten text-part content into strings. Raises InvalidRequestError."""
    if not messages:
        raise InvalidRequestError("messages must contain at least one message.", param="messages")
    conversation = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role not in ROLES:
            raise InvalidRequestError(f"messages[{index}].role {role!r} is not supported; use one of "
                                      f"{', '.join(ROLES)}.", param=f"messages[{index}].role")
        conversation.append({"role": role, "content": _text_content(message.get("content"), index)})
    return conversation


def apply_chat_template(tokenizer: Any, conversation: Sequence[Mapping[str, Any]],
                        chat_template: str | None = None, add_generation_prompt: bool = True) -> list[int]:
    """The prompt token ids of a conversation. Raises InvalidRequestError when there is no template or it
    rejects the conversation (e.g. roles that do not alternate)."""
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise InvalidRequestError("The model's tokenizer has no chat template: start the server with "
                                  "--chat-template, or use the completions API.", param="messages")
    try:
        token_ids = tokenizer.apply_chat_template(list(conversation), chat_template=chat_template,
                                                  add_generation_prompt=add_generation_prompt,
                                                  tokenize=True, return_dict=False)
    except Exception as exc:  # jinja2's TemplateError (raise_exception) and friends
        raise InvalidRequestError(f"The chat template rejected the conversation: {exc}",
                                  param="messages") from exc
    return list(token_ids)
