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

from pagedserve.utils.user_json import JsonObject, JsonValue

MAX_SAFE_INTEGER = 2**53 - 1  # I-JSON: the integers every JSON parser reads exactly (16 digits)
MAX_FRACTION_DIGITS = 10  # a number's digits after the point (llguidance takes multipleOf down to 1e-10)
MAX_STRING_LENGTH = 256  # characters of a string without maxLength, pattern, format, enum or const
# json_object's free-form document: keys per object (8: a model that repeats one pair, `"blue":20,` again and
# again, closes the object within ~50 tokens), key length, items per array, nesting levels.
MAX_OBJECT_KEYS = 8
MAX_KEY_LENGTH = 32
MAX_ARRAY_ITEMS = 16
MAX_NESTING = 4

# Keywords after which a value is already bounded (or defined by the schema): left as written.
_STRING_BOUNDS = ("maxLength", "pattern", "format", "enum", "const")
_NUMBER_BOUNDS = ("enum", "const")


def _type_includes(schema: JsonObject, kind: str) -> bool:
    declared = schema.get("type")
    return declared == kind or (isinstance(declared, list) and kind in declared)


def _bound_number(schema: JsonObject, bounded: JsonObject) -> None:
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


_ANY_VALUE = "pagedserve_any_value"  # the $defs entry an empty subschema ({} or true) becomes
# Where a value is a subschema, a map of subschemas or a list of them ({} and true mean "any value" only
# there: `"uniqueItems": true` or `"dependentRequired": {}` are not schemas). Other keywords are copied.
_SCHEMA = ("items", "additionalProperties", "additionalItems", "contains", "unevaluatedProperties")
_SCHEMA_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")


def _bound(schema: JsonValue) -> tuple[JsonValue, bool]:
    """(the bounded subschema, whether it refers to the bounded any-value)."""
    if schema is True:
        return _any_value_ref(), True
    if not isinstance(schema, dict):
        return schema, False
    return _bound_object(schema)


def _any_value_ref() -> JsonObject:
    return {"$ref": f"#/$defs/{_ANY_VALUE}"}


def _bound_object(schema: JsonObject) -> tuple[JsonObject, bool]:
    """`_bound` of an object schema, which stays an object."""
    if not schema:
        return _any_value_ref(), True
    bounded, uses_any = dict(schema), False
    for key, value in schema.items():
        if key in _SCHEMA:
            bounded[key], uses = _bound(value)
        elif key in _SCHEMA_MAP and isinstance(value, dict):
            entries = {name: _bound(subschema) for name, subschema in value.items()}
            bounded[key] = {name: entry for name, (entry, _) in entries.items()}
            uses = any(entry_uses for _, entry_uses in entries.values())
        elif key in _SCHEMA_LIST and isinstance(value, list):
            entries_list = [_bound(subschema) for subschema in value]
            bounded[key] = [entry for entry, _ in entries_list]
            uses = any(entry_uses for _, entry_uses in entries_list)
        else:
            continue
        uses_any |= uses
    if _type_includes(schema, "integer") or _type_includes(schema, "number"):
        _bound_number(schema, bounded)
    if _type_includes(schema, "string") and not any(key in schema for key in _STRING_BOUNDS):
        bounded["maxLength"] = MAX_STRING_LENGTH
    return bounded, uses_any


def bounded_schema(schema: JsonObject) -> JsonObject:
    """`schema` with the defaults above on every integer, number and string subschema that leaves them
    open, and every empty subschema ({} or true: any value) made a bounded any-value. The result allows
    a subset of what `schema` allows: outputs still validate against `schema`."""
    bounded, uses_any = _bound_object(schema)
    if not uses_any:
        return bounded
    if "$ref" in bounded:  # the whole schema was {}
        bounded = {"allOf": [bounded]}
    defs = bounded.get("$defs", {})
    if not isinstance(defs, dict):  # a TypeError: to_grammar makes it the request's 400
        raise TypeError(f"$defs must be an object, not {type(defs).__name__}")
    bounded["$defs"] = {**defs, **_bounded_any_value_defs()}
    return bounded


def _scalars() -> list[JsonValue]:
    return [
        {"type": "null"},
        {"type": "boolean"},
        _bound({"type": "integer"})[0],
        _bound({"type": "number"})[0],
        _bound({"type": "string"})[0],
    ]


def _object_of(value: JsonValue) -> JsonObject:
    # The pattern is matched against the decoded key: any character but a newline, MAX_KEY_LENGTH at most.
    return {
        "type": "object",
        "patternProperties": {f"^.{{0,{MAX_KEY_LENGTH}}}$": value},
        "additionalProperties": False,
        "maxProperties": MAX_OBJECT_KEYS,
    }


def _bounded_any_value_defs() -> JsonObject:
    """$defs for any JSON value within the bounds: one entry per nesting level (a recursive $ref could
    nest without end); `_ANY_VALUE` holds up to MAX_NESTING levels of arrays and objects."""
    levels: JsonObject = {f"{_ANY_VALUE}1": {"anyOf": _scalars()}}
    for depth in range(2, MAX_NESTING + 2):
        inner: JsonObject = {"$ref": f"#/$defs/{_ANY_VALUE}{depth - 1}"}
        array: JsonObject = {"type": "array", "items": inner, "maxItems": MAX_ARRAY_ITEMS}
        levels[f"{_ANY_VALUE}{depth}"] = {"anyOf": [*_scalars(), array, _object_of(inner)]}
    levels[_ANY_VALUE] = {"$ref": f"#/$defs/{_ANY_VALUE}{MAX_NESTING + 1}"}
    return levels


def bounded_json_object() -> JsonObject:
    """`json_object`'s schema: any JSON object (MAX_NESTING levels at most, itself included), every
    value bounded."""
    return {"$defs": _bounded_any_value_defs(), **_object_of({"$ref": f"#/$defs/{_ANY_VALUE}{MAX_NESTING}"})}
