"""A constraint nested deeper than MAX_CONSTRAINT_DEPTH (JSON schema objects and arrays, GBNF groups) is
refused with a 400 naming the field and the limit, before anything walks it recursively: 500 levels used to
be a RecursionError (a 500) in those walks (closed_objects, the tool $refs' rebasing). At the limit a schema
compiles. The server's side is tests/entrypoints/test_hostile_input.py."""

from typing import Any

import pytest
from transformers import AutoTokenizer

from pagedserve import SamplingParams
from pagedserve.engine.structured_validation import StructuredOutputValidator
from pagedserve.entrypoints.openai.chat_tools import resolve_chat_tools
from pagedserve.errors import InvalidRequestError
from pagedserve.structured_output.grammar import MAX_CONSTRAINT_DEPTH
from pagedserve.structured_outputs_params import StructuredOutputsParams
from pagedserve.utils.default_model import default_model_path
from pagedserve.utils.gguf_cache import gguf_hf_folder
from pagedserve.utils.user_json import nests_deeper_than

TOO_DEEP = (
    f"nested too deeply: its objects and arrays nest more than the limit of {MAX_CONSTRAINT_DEPTH} levels"
)


def nested_items(levels: int) -> dict[str, Any]:
    """`levels` objects and arrays deep: an array of arrays ... of strings."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema


def nested_properties(levels: int) -> dict[str, Any]:
    """An object of objects ...: 2 levels each ("properties", then the property's schema); `levels` deep,
    or one less."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range((levels - 1) // 2):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def nested_any_of(levels: int) -> dict[str, Any]:
    """anyOf in anyOf ...: 2 levels each (the list, then the schema); `levels` deep, or one less."""
    schema: dict[str, Any] = {"type": "null"}
    for _ in range((levels - 1) // 2):
        schema = {"anyOf": [schema, {"type": "integer"}]}
    return schema


@pytest.fixture(scope="module")
def validator() -> StructuredOutputValidator:
    """What LLM and the server check every request's constraint with."""
    return StructuredOutputValidator(
        AutoTokenizer.from_pretrained(gguf_hf_folder(default_model_path())), 49152
    )


def check(validator: StructuredOutputValidator, **constraint: Any) -> None:
    validator.validate(SamplingParams(structured_outputs=StructuredOutputsParams(**constraint)), None)


@pytest.mark.parametrize("shape", [nested_items, nested_properties, nested_any_of])
@pytest.mark.parametrize("levels", [MAX_CONSTRAINT_DEPTH + 1, 500, 5000])
def test_deep_schema_is_refused_naming_field_and_limit(
    validator: StructuredOutputValidator, shape: Any, levels: int
) -> None:
    with pytest.raises(InvalidRequestError, match=TOO_DEEP) as info:
        check(validator, json=shape(levels))
    assert info.value.param == "structured_outputs.json" and info.value.status_code == 400


@pytest.mark.parametrize("shape", [nested_items, nested_properties, nested_any_of])
def test_schema_at_the_limit_compiles(validator: StructuredOutputValidator, shape: Any) -> None:
    schema = shape(MAX_CONSTRAINT_DEPTH)
    assert not nests_deeper_than(schema, MAX_CONSTRAINT_DEPTH)
    check(validator, json=schema)


def test_depth_counts_objects_and_arrays() -> None:
    assert [nests_deeper_than(value, 1) for value in (1, {}, {"a": [1]}, [[]], ({"a": 1},))] == [
        False,
        False,
        True,
        True,
        True,
    ]
    assert not nests_deeper_than({"a": [1]}, 2)
    cycle: dict[str, Any] = {}
    cycle["self"] = [cycle, cycle]
    assert nests_deeper_than(cycle, MAX_CONSTRAINT_DEPTH)  # no hang: it stops at the limit


def test_deep_schema_text_is_refused() -> None:
    """Past Python's recursion limit json.loads itself raises RecursionError."""
    with pytest.raises(InvalidRequestError, match="structured_outputs.json is not a valid JSON schema"):
        StructuredOutputsParams(json='{"items":' * 100_000 + "{}" + "}" * 100_000)


def test_deep_gbnf_is_refused_but_parentheses_in_literals_do_not_count(
    validator: StructuredOutputValidator,
) -> None:
    levels = MAX_CONSTRAINT_DEPTH + 1
    with pytest.raises(
        InvalidRequestError, match="groups \\(parentheses\\) nest more than the limit"
    ) as info:
        check(validator, grammar="root ::= " + "(" * levels + '"a"' + ")" * levels)
    assert info.value.param == "structured_outputs.grammar"
    literals = f'root ::= "{"(" * levels}" [(] # {"(" * levels}\n'
    check(validator, grammar=literals)


@pytest.mark.parametrize("tool_choice", ["required", "none", {"type": "function", "function": {"name": "f"}}])
def test_deep_tool_parameters_are_refused(tool_choice: Any) -> None:
    tools = [
        {"type": "function", "function": {"name": "g"}},
        {"type": "function", "function": {"name": "f", "parameters": nested_properties(500)}},
    ]
    with pytest.raises(
        InvalidRequestError, match="tools\\[1\\].function.parameters is nested too deeply"
    ) as info:
        resolve_chat_tools(tools, tool_choice, None)
    assert info.value.param == "tools[1].function.parameters"


def test_tool_parameters_at_their_limit_compile_as_required(validator: StructuredOutputValidator) -> None:
    """The required schema holds each tool's parameters 2 levels down: their limit leaves room for that."""
    parameters = {"type": "object", "properties": {"a": nested_items(MAX_CONSTRAINT_DEPTH - 4)}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
    constraint = resolve_chat_tools(tools, "required", None).constraint
    assert constraint is not None and not nests_deeper_than(constraint.json, MAX_CONSTRAINT_DEPTH)
    validator.validate(SamplingParams(structured_outputs=constraint), None)
    deeper = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "array", "items": parameters}},
    }
    with pytest.raises(InvalidRequestError, match=f"limit of {MAX_CONSTRAINT_DEPTH - 2} levels"):
        resolve_chat_tools([deeper], "required", None)
