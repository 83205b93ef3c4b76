"""User-given JSON (a flag's value, a request field) that may arrive as text or already parsed."""

import json
from collections.abc import Callable
from typing import Any


def load_user_json(value: Any, error: Callable[[str], Exception], what: str = "is not valid JSON") -> Any:
    """`value` parsed when it is JSON text, else as it is. Bad text raises `error(message)`, the message
    being `what` and the parser's complaint, so each caller's error names its own field or flag."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise error(f"{what}: {exc}") from exc
