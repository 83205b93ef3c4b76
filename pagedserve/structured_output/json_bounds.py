"""Bounds on the JSON values a schema leaves unbounded, so that every constrained output can close.

Why: a grammar only says which token may come next. Inside an unbounded value (an integer's digits, a
string without maxLength, the free-form values of `json_object`) every token is allowed again, and a
greedy small model that starts repeating itself never leaves the value: the output runs to max_tokens
and is a JSON prefix that does not parse. With a bound, the grammar forces the value to close.

The bounds are what JSON carries between programs anyway (RFC 8259 §6, I-JSON RFC 7493 §2.2: numbers
as IEEE doubles, integers exact within ±(2**53 - 1)), plus a default length for free text. A schema
that states its own bound (maximum, exclusiveMaximum, maxLength, pattern, format, multipleOf, ...) is
compiled as written: these defaults only fill what it leaves open.
"""

from typing import Any

MAX_SAFE_INTEGER = 2**53 - 1  # I-JSON: the integers every JSON parser reads exactly (16 digits)
MAX_FRACTION_DIGITS = 10  # a number's digits after the point (llguidance takes multipleOf down to 1e-10)
MAX_STRING_LENGTH = 256  # characters of a string without maxLength, pattern, format, enum or const
# json_object's free-form document: at most this many keys per object, items per array, nesting levels.
MAX_OBJECT_KEYS = 16
MAX_KEY_LENGTH = 64
MAX_ARRAY_ITEMS = 16
MAX_NESTING = 4

# Keywords after which a value is already bounded (or defined by the schema): left as written.
_STRING_BOUNDS = ("maxLength", "pattern", "format", "enum", "const")
_NUMBER_BOUNDS = ("enum", "const")


def _type_includes(schema: dict, kind: str) -> bool:
    declared = schema.get("type")
    return declared == kind or (isinstance(declared, list) and kind in declared)


def _bound_number(schema: dict, bounded: dict) -> None:
    """Integers within ±MAX_SAFE_INTEGER; numbers there too, with at most MAX_FRACTION_DIGITS decimals
    (no exponent: llguidance writes bounded numbers in plain notation)."""
    if any(key in schema for key in _NUMBER_BOUNDS):
        return
    if "maximum" not in schema and "exclusiveMaximum" not in schema:
        bounded["maximum"] = MAX_SAFE_INTEGER
    if "minimum" not in schema and "exclusiveMinimum" not in schema:
        bounded["minimum"] = -MAX_SAFE_INTEGER
    if (
        _type_includes(schema, "number")
        and not _type_includes(schema, "integer")
        and "multipleOf" not in schema
    ):
        bounded["multipleOf"] = 10.0**-MAX_FRACTION_DIGITS


def bounded_schema(schema: Any) -> Any:
    """`schema` with the defaults above on every integer, number and string subschema that leaves them
    open. The result allows a subset of what `schema` allows: outputs still validate against `schema`."""
    if isinstance(schema, list):
        return [bounded_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    bounded = {key: bounded_schema(value) for key, value in schema.items()}
    if _type_includes(schema, "integer") or _type_includes(schema, "number"):
        _bound_number(schema, bounded)
    if _type_includes(schema, "string") and not any(key in schema for key in _STRING_BOUNDS):
        bounded["maxLength"] = MAX_STRING_LENGTH
    return bounded


def bounded_json_object() -> dict:
    """`json_object`'s schema: any JSON object, with every value bounded (keys, items, nesting depth,
    numbers, strings). One $defs entry per nesting level: a recursive $ref could nest without end."""
    scalars: list[dict] = [
        {"type": "null"},
        {"type": "boolean"},
        bounded_schema({"type": "integer"}),
        bounded_schema({"type": "number"}),
        bounded_schema({"type": "string"}),
    ]
    # The pattern is matched against the decoded key: any character but a newline, MAX_KEY_LENGTH at most.
    key_pattern = f"^.{{0,{MAX_KEY_LENGTH}}}$"

    def object_of(value: dict) -> dict:
        return {
            "type": "object",
            "patternProperties": {key_pattern: value},
            "additionalProperties": False,
            "maxProperties": MAX_OBJECT_KEYS,
        }

    levels = {"depth1": {"anyOf": scalars}}
    for depth in range(2, MAX_NESTING + 1):
        inner = {"$ref": f"#/$defs/depth{depth - 1}"}
        levels[f"depth{depth}"] = {
            "anyOf": [
                *scalars,
                {"type": "array", "items": inner, "maxItems": MAX_ARRAY_ITEMS},
                object_of(inner),
            ]
        }
    return {"$defs": levels, **object_of({"$ref": f"#/$defs/depth{MAX_NESTING}"})}
