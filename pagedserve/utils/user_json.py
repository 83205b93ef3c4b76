"""User-given JSON (a flag's value, a request field) that may arrive as text or already parsed."""

import json
from collections.abc import Callable
from typing import Any, TypeAlias

# A JSON document as json.loads returns it: objects are dicts, arrays lists.
JsonValue: TypeAlias = "dict[str, JsonValue] | list[JsonValue] | str | int | float | bool | None"
JsonObject: TypeAlias = "dict[str, JsonValue]"


def as_object(value: JsonValue) -> JsonObject:
    """`value` when it is an object, else {}: for a member that is read only when it is one."""
    return value if isinstance(value, dict) else {}


def as_string(value: JsonValue) -> str:
    """`value` when it is a string, else "": for a member that is read only when it is one."""
    return value if isinstance(value, str) else ""


def load_user_json(value: Any, error: Callable[[str], Exception], what: str = "is not valid JSON") -> Any:
    """`value` parsed when it is JSON text, else as it is. Bad text raises `error(message)`, the message
    being `what` and the parser's complaint, so each caller's error names its own field or flag."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested past Python's limit
        raise error(f"{what}: {exc}") from exc


def nests_deeper_than(value: object, limit: int) -> bool:
    """Whether objects and arrays (dicts, lists, tuples) nest in `value` more than `limit` levels deep
    ({"a": [1]}: 2). Iterative, and it stops at the first level too deep: any nesting, a cycle too, is
    measured without recursion in bounded time."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, (dict, list, tuple)):
            continue
        if depth == limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children)
    return False
