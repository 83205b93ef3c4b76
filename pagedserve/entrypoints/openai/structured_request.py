"""A request's output constraint from its OpenAI fields: `response_format` (json_object, json_schema),
vLLM's `structured_outputs`, and the older `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar`. At most one of them; the engine validates what it says."""

from typing import Any

from pagedserve.errors import InvalidRequestError
from pagedserve.structured_outputs_params import StructuredOutputsParams

_GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def structured_outputs_from_request(request: Any) -> StructuredOutputsParams | None:
    """Raises InvalidRequestError naming the field that is malformed, or the fields that conflict."""
    found: dict[str, StructuredOutputsParams] = {}
    if request.structured_outputs is not None:
        try:
            found["structured_outputs"] = StructuredOutputsParams(**request.structured_outputs)
        except TypeError as exc:
            raise InvalidRequestError(
                f"structured_outputs: {exc}; use json, regex, choice, grammar or json_object.",
                param="structured_outputs",
            ) from exc
    constraint = _from_response_format(request.response_format)
    if constraint is not None:
        found["response_format"] = constraint
    for field, kind in _GUIDED.items():
        value = getattr(request, field)
        if value is not None:
            found[field] = StructuredOutputsParams(**{kind: value})
    if len(found) > 1:
        raise InvalidRequestError(
            f"Only one output constraint per request; got {', '.join(found)}.", param=next(iter(found))
        )
    return next(iter(found.values()), None)


def _from_response_format(response_format: dict[str, Any] | None) -> StructuredOutputsParams | None:
    response_format = response_format or {}
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise InvalidRequestError(
                "response_format json_schema needs {'json_schema': {'name': ..., 'schema': "
                "{...}}} with the schema as an object.",
                param="response_format",
            )
        return StructuredOutputsParams(json=schema)
    raise InvalidRequestError(
        f"response_format type {kind!r} is not supported; use text, json_object or json_schema.",
        param="response_format",
    )
