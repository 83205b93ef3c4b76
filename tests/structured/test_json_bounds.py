"""The bounds that let every constrained JSON value close (json_bounds.py), checked on llguidance
matchers built from the real grammars and the SmolLM2 tokenizer: the default bounds hold at their
edges, a schema's own bounds are compiled as written, and what the bounded grammar accepts still
validates against the schema the user gave."""

import json

import jsonschema
import llguidance
import pytest
from transformers import AutoTokenizer

from pagedserve.errors import InvalidRequestError
from pagedserve.structured_output.grammar import make_ll_tokenizer, to_grammar
from pagedserve.structured_output.json_bounds import (
    MAX_ARRAY_ITEMS,
    MAX_FRACTION_DIGITS,
    MAX_KEY_LENGTH,
    MAX_NESTING,
    MAX_OBJECT_KEYS,
    MAX_SAFE_INTEGER,
    MAX_STRING_LENGTH,
    bounded_schema,
)
from pagedserve.structured_outputs_params import StructuredOutputsParams
from pagedserve.utils.default_model import default_model_path
from pagedserve.utils.gguf_cache import gguf_hf_folder


@pytest.fixture(scope="module")
def tokenizer() -> llguidance.LLTokenizer:
    return make_ll_tokenizer(AutoTokenizer.from_pretrained(gguf_hf_folder(default_model_path())), 49152)


def accepts(tokenizer: llguidance.LLTokenizer, constraint: StructuredOutputsParams, text: str) -> bool:
    """The whole of `text` is a complete output of the constraint's grammar."""
    matcher = llguidance.LLMatcher(tokenizer, to_grammar(constraint))
    return matcher.consume_tokens(tokenizer.tokenize_str(text)) and matcher.is_accepting()


def nested(levels: int) -> dict:
    document: object = 1
    for _ in range(levels - 1):
        document = {"k": document}
    return {"k": document}


@pytest.mark.parametrize(
    ("schema", "inside", "outside"),
    [
        ({"type": "integer"}, [MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, 0], [MAX_SAFE_INTEGER + 1, -(2**63)]),
        (
            {"type": "number"},
            [1.5, -MAX_SAFE_INTEGER, "0." + "3" * MAX_FRACTION_DIGITS],
            ["0." + "3" * (MAX_FRACTION_DIGITS + 1), MAX_SAFE_INTEGER + 1, "1e5"],
        ),
        ({"type": "string"}, ["x" * MAX_STRING_LENGTH, ""], ["x" * (MAX_STRING_LENGTH + 1)]),
        # The schema's own bounds, larger or smaller than the defaults, are obeyed as written.
        (
            {"type": "integer", "maximum": 10**18},
            [10**18, -MAX_SAFE_INTEGER],
            [10**18 + 1, -MAX_SAFE_INTEGER - 1],
        ),
        ({"type": "integer", "exclusiveMinimum": 0, "maximum": 9}, [1, 9], [0, 10]),
        ({"type": "number", "multipleOf": 0.5, "maximum": 2}, [1.5, 2], [1.25, 2.5]),
        ({"type": "string", "maxLength": 1000}, ["y" * 1000], ["y" * 1001]),
        ({"type": "string", "maxLength": 3}, ["abc"], ["abcd"]),
        ({"type": "string", "pattern": "^a{300}$"}, ["a" * 300], ["a" * 299]),
        ({"enum": ["x" * 400, 7]}, ["x" * 400, 7], ["x", 8]),
    ],
)
def test_default_bounds_and_the_schema_s_own(
    tokenizer: llguidance.LLTokenizer, schema: dict, inside: list, outside: list
) -> None:
    constraint = StructuredOutputsParams(json=schema)
    for value in inside:
        text = value if isinstance(value, str) and schema.get("type") == "number" else json.dumps(value)
        assert accepts(tokenizer, constraint, text), (schema, text)
        jsonschema.validate(json.loads(text), schema)
    for value in outside:
        text = value if isinstance(value, str) and schema.get("type") == "number" else json.dumps(value)
        assert not accepts(tokenizer, constraint, text), (schema, text)


def test_a_bound_past_64_bits_is_refused_with_a_message() -> None:
    with pytest.raises(InvalidRequestError, match="not a valid JSON schema.*18446744073709551616"):
        to_grammar(StructuredOutputsParams(json={"type": "integer", "maximum": 2**64}))


def test_json_object_is_any_object_within_the_bounds(tokenizer: llguidance.LLTokenizer) -> None:
    constraint = StructuredOutputsParams(json_object=True)
    keys = {f"k{i}": i for i in range(MAX_OBJECT_KEYS)}
    inside = [
        {},
        {"a": None, "b": True, "c": -3, "d": 2.5, "e": "text", "f": [1, "x", [2]]},
        keys,
        {"x" * MAX_KEY_LENGTH: 1},
        {"list": list(range(MAX_ARRAY_ITEMS))},
        nested(MAX_NESTING),
        {"s": "z" * MAX_STRING_LENGTH},
    ]
    outside = [
        [1, 2],
        "text",
        {**keys, "one_more": 0},
        {"x" * (MAX_KEY_LENGTH + 1): 1},
        {"list": list(range(MAX_ARRAY_ITEMS + 1))},
        nested(MAX_NESTING + 1),
        {"s": "z" * (MAX_STRING_LENGTH + 1)},
        {"n": MAX_SAFE_INTEGER + 1},
    ]
    for document in inside:
        assert accepts(tokenizer, constraint, json.dumps(document, separators=(",", ":"))), document
    for document in outside:
        assert not accepts(tokenizer, constraint, json.dumps(document, separators=(",", ":"))), document


def test_bounded_schema_only_adds_to_what_is_open() -> None:
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": ["integer", "null"]},
            "tag": {"type": "string", "format": "uuid"},
            "code": {"const": 7, "type": "integer"},
            "items": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "number"}]}},
        },
    }
    bounded = bounded_schema(schema)
    properties = bounded["properties"]
    assert properties["id"] == {
        "type": ["integer", "null"],
        "maximum": MAX_SAFE_INTEGER,
        "minimum": -MAX_SAFE_INTEGER,
    }
    assert properties["tag"] == schema["properties"]["tag"]
    assert properties["code"] == schema["properties"]["code"]
    string, number = properties["items"]["items"]["anyOf"]
    assert string["maxLength"] == MAX_STRING_LENGTH
    assert number["multipleOf"] == 10.0**-MAX_FRACTION_DIGITS
    assert schema["properties"]["id"] == {"type": ["integer", "null"]}, "the input is left unchanged"


def test_an_empty_subschema_is_any_value_within_the_bounds(tokenizer: llguidance.LLTokenizer) -> None:
    for schema in ({}, {"type": "object", "properties": {"meta": True}, "required": ["meta"]}):
        constraint = StructuredOutputsParams(json=schema)

        def wrap(value: object, schema: dict = schema) -> str:
            return json.dumps({"meta": value} if schema else value, separators=(",", ":"))

        for value in (None, 3, "text", [1, {"a": [True]}], nested(MAX_NESTING)):
            assert accepts(tokenizer, constraint, wrap(value)), (schema, value)
        for value in ("z" * (MAX_STRING_LENGTH + 1), MAX_SAFE_INTEGER + 1, nested(MAX_NESTING + 1)):
            assert not accepts(tokenizer, constraint, wrap(value)), (schema, value)
    # Literals and boolean keywords are not schemas: left as written.
    literal = {"type": "array", "uniqueItems": True, "items": {"enum": [{}, 1]}, "default": {}}
    assert bounded_schema(literal) == literal
