"""Chat templates rendered with jinja2 as transformers' `apply_chat_template` renders them, without
importing transformers (the API server's tokenizer, utils/light_tokenizer.py): the same sandboxed
environment and options, the same helpers the templates on the Hub call, the same variables."""

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pagedserve.utils.user_json import JsonValue

# Where a message's reasoning may be: templates read the first, gpt-oss's reads `thinking`.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Appended to the continued message: the render is cut where it appears, so the model continues the text.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class _GenerationBlocks(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (training templates mark the assistant's tokens with it):
    rendered as its body, since nothing here asks for the assistant mask."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """`namespace(...)` whose attributes may not start with "_" (no reach into Python's internals)."""

    def __init__(*args: object, **kwargs: object) -> None:
        self, attributes = args[0], dict(*args[1:], **kwargs)
        for name in attributes:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attributes)

    def __setitem__(self, name: str, value: object) -> None:
        _Namespace._check(name)
        super().__setitem__(name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"A chat template may not set the attribute {name!r}.")


class _DictBuilder:
    """`dict(...)` and `dict.fromkeys(...)` in a template, and nothing else of the type."""

    def __call__(self, *args: object, **kwargs: object) -> dict[str, object]:
        return dict(*args, **kwargs)

    def fromkeys(self, keys: Sequence[object], value: object = None) -> dict[object, object]:
        return dict.fromkeys(keys, value)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # NOTE: jinja's own tojson escapes HTML characters; templates expect plain JSON
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@functools.lru_cache(maxsize=16)
def compile_chat_template(template: str) -> jinja2.Template:
    """The template compiled once; raises jinja2.TemplateSyntaxError."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlocks, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals.update(
        raise_exception=_raise_exception,
        strftime_now=_strftime_now,
        dict=_DictBuilder(),
        namespace=_Namespace,
    )
    return environment.from_string(template)


def _with_reasoning_aliases(message: dict[str, JsonValue]) -> dict[str, JsonValue]:
    reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def render_chat_template(
    template: str,
    conversation: Sequence[Mapping[str, JsonValue]],
    *,
    tools: Sequence[Mapping[str, JsonValue]] | None = None,
    documents: Sequence[Mapping[str, JsonValue]] | None = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool = False,
    variables: Mapping[str, JsonValue] | None = None,
) -> str:
    """The conversation as the template renders it (keys whose value is None dropped, reasoning under each
    of its names; `variables`: the special tokens and the request's template kwargs). With
    `continue_final_message` the text ends inside the last message's content. Raises ValueError or
    jinja2's TemplateError (the template's `raise_exception`)."""
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be set.")
    messages = [
        _with_reasoning_aliases({key: value for key, value in message.items() if value is not None})
        for message in conversation
    ]
    final = _tag_final_message(messages, template) if continue_final_message else None
    rendered = compile_chat_template(template).render(
        messages=messages,
        tools=list(tools) if tools is not None else None,
        documents=list(documents) if documents is not None else None,
        add_generation_prompt=add_generation_prompt,
        **(variables or {}),
    )
    return rendered if final is None else _cut_at_tag(rendered, final)


def _tag_final_message(messages: list[dict[str, JsonValue]], template: str) -> str:
    """Marks the last message's text with the continue tag; returns that text."""
    if not messages:
        raise ValueError("continue_final_message is set but the conversation is empty.")
    final = messages[-1]
    content = final.get("content")
    if content is None or "content" not in template:
        raise ValueError(
            "continue_final_message is set but the final message has no content the template reads."
        )
    if isinstance(content, list):
        texts = [(i, block) for i, block in enumerate(content) if isinstance(block, dict) and "text" in block]
        if not texts:
            raise ValueError("continue_final_message is set but the final message has no text to continue.")
        last, block = texts[-1]
        text = str(block["text"])
        final["content"] = [*content[:last], {**block, "text": text + _CONTINUE_TAG}, *content[last + 1 :]]
        return text
    text = str(content)
    final["content"] = text + _CONTINUE_TAG
    return text


def _cut_at_tag(rendered: str, final: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in rendered or tag not in rendered:
        raise ValueError(
            "continue_final_message is set but the chat template dropped part of the final message; "
            "continue a message the template renders whole."
        )
    end = rendered.rindex(tag)
    # NOTE: a template that trims the message's trailing space leaves no space after the tag either
    return rendered[:end] if rendered[end:].startswith(_CONTINUE_TAG) else rendered[:end].rstrip()
