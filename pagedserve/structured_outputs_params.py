"""StructuredOutputsParams: what a request's output must match (vLLM's names). Exactly one kind per
request; the engine turns it into a grammar (pagedserve/structured_output/)."""

import json as _json
from dataclasses import dataclass
from typing import Any

from pagedserve.errors import InvalidRequestError
from pagedserve.utils.user_json import load_user_json

_KINDS = ("json", "regex", "choice", "grammar", "json_object")
_TYPES: dict[str, type | tuple[type, ...]] = {
    "json": dict,
    "regex": str,
    "choice": list,
    "grammar": str,
    "json_object": bool,
}
_TYPE_NAMES = {
    "json": "a JSON schema (an object, or its JSON text)",
    "regex": "a string",
    "choice": "a list of strings",
    "grammar": "a string",
    "json_object": "true or false",
}


@dataclass
class StructuredOutputsParams:
    """`json`: a JSON schema (dict or its text); `regex`: the whole output matches it; `choice`: the
    output is one of these strings; `grammar`: an EBNF grammar (GBNF `root ::= ...` or Lark `start: ...`);
    `json_object`: any JSON object. Raises InvalidRequestError unless exactly one is set."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        # NOTE: a schema given as text is parsed here, once: a malformed one is refused with the request.
        self.json = load_user_json(
            self.json,
            lambda message: InvalidRequestError(message, param="structured_outputs.json"),
            "structured_outputs.json is not a valid JSON schema",
        )
        # NOTE: types are checked here, at the API: the engine process decodes requests against these
        # annotations, and a wrong type there would fail the engine instead of this request.
        for kind, expected in _TYPES.items():
            value = getattr(self, kind)
            if value is not None and not isinstance(value, expected):
                raise InvalidRequestError(
                    f"structured_outputs.{kind} must be {_TYPE_NAMES[kind]}, got {type(value).__name__}.",
                    param=f"structured_outputs.{kind}",
                )
        chosen = [kind for kind in _KINDS if getattr(self, kind) not in (None, False)]
        if len(chosen) != 1:
            raise InvalidRequestError(
                f"structured_outputs must set exactly one of {', '.join(_KINDS)}; got "
                f"{', '.join(chosen) if chosen else 'none'}.",
                param="structured_outputs",
            )
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) for c in self.choice)):
            raise InvalidRequestError(
                "structured_outputs.choice must be a non-empty list of strings.",
                param="structured_outputs.choice",
            )

    @property
    def kind(self) -> str:
        return next(kind for kind in _KINDS if getattr(self, kind) not in (None, False))

    @property
    def spec(self) -> str:
        """The constraint as canonical text: with `kind`, the key under which its grammar is cached."""
        value = getattr(self, self.kind)
        if self.kind in ("json", "choice"):
            return _json.dumps(value, sort_keys=True, separators=(",", ":"))
        return "" if self.kind == "json_object" else value
