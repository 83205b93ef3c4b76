"""Qwen3-Coder: XML-like calls, each
`<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>`.
A value is text: the tool's JSON schema says what it is (an integer, a boolean, an object...); a parameter
the schema does not list, or text that is not of its type, stays a string (vLLM's rules)."""

import math

from pagedserve.entrypoints.openai.tool_parsers.base import ParsedToolCall, load_json, make_call
from pagedserve.entrypoints.openai.tool_parsers.blocks import BlockToolParser
from pagedserve.utils.user_json import JsonObject, JsonValue

_FUNCTION, _FUNCTION_END = "<function=", "</function>"
_PARAMETER, _PARAMETER_END = "<parameter=", "</parameter>"


class Qwen3CoderToolParser(BlockToolParser):
    start = open = "<tool_call>"
    close = "</tool_call>"

    def parse_block(self, body: str) -> ParsedToolCall | None:
        body = body.strip()
        name_end, function_end = body.find(">"), body.rfind(_FUNCTION_END)
        if not body.startswith(_FUNCTION) or name_end < 0 or function_end < name_end:
            return None
        name = body[len(_FUNCTION) : name_end].strip()
        properties = _properties(self.functions.get(name))
        arguments: JsonObject = {}
        for key, text in _parameters(body[name_end + 1 : function_end]):
            arguments[key] = typed_value(text, properties.get(key))
        return make_call(name, arguments)


def _parameters(text: str) -> list[tuple[str, str]]:
    """(key, value text) of each `<parameter=KEY>VALUE</parameter>`; a value without its closing tag ends
    at the next parameter (as vLLM reads it). The one newline around a value is the format's, not its."""
    found, start = [], text.find(_PARAMETER)
    while start >= 0:
        key_end = text.find(">", start)
        if key_end < 0:
            break
        following = text.find(_PARAMETER, key_end)
        bound = len(text) if following < 0 else following
        # NOTE: searched up to the next parameter only: linear time over many unclosed ones.
        value_end = text.find(_PARAMETER_END, key_end, bound)
        value_end = bound if value_end < 0 else value_end
        value = text[key_end + 1 : value_end].removeprefix("\n").removesuffix("\n")
        found.append((text[start + len(_PARAMETER) : key_end].strip(), value))
        start = following
    return found


def _properties(schema: JsonValue) -> JsonObject:
    properties = schema.get("properties") if isinstance(schema, dict) else None
    return properties if isinstance(properties, dict) else {}


def typed_value(text: str, schema: JsonValue) -> JsonValue:
    """A parameter's text as the JSON value its schema types it: "null" is null; integer and number
    parse as numbers, boolean as true/false, anything else (object, array, a type list) as JSON; a string,
    an unlisted parameter, or text that is not of the type stays the text."""
    if text.strip() == "null":
        return None
    declared = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(declared, list):  # ["integer", "null"]: the first that is not null
        declared = next((t for t in declared if t != "null"), None)
    if declared is None or declared == "string":
        return text
    value = text.strip()
    if declared == "boolean":
        return {"true": True, "false": False}.get(value.lower(), text)
    if declared in ("integer", "number"):
        number = _number(value, declared == "integer")
        return text if number is None else number
    try:
        return load_json(value)
    except ValueError:
        return text


def _number(text: str, integer: bool) -> int | float | None:
    """The number `text` writes (a whole one as an integer, as vLLM gives it), or None when it is none:
    not finite, or for an integer not whole."""
    try:
        if text.lstrip("+-").isdigit():
            return int(text)  # exactly, past a float's 2**53 (ValueError past Python's 4300 digits)
        number = float(text)
    except ValueError:
        return None
    if not math.isfinite(number) or (integer and not number.is_integer()):
        return None
    return int(number) if number.is_integer() else number
