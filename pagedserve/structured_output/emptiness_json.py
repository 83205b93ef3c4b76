"""Which $refs of a JSON schema allow no finite value (emptiness.py's JSON half): a $ref is a name, its
target the definition; required properties, minItems' items, `contains` and allOf must all be
productive, one branch of anyOf/oneOf. What it does not model (patterns, numeric ranges) counts as
productive."""

import enum
import urllib.parse
from collections.abc import Iterator
from typing import Literal

from pagedserve.structured_output.productive import productive_names
from pagedserve.utils.user_json import JsonObject, JsonValue

_DATA_KEYWORDS = ("const", "enum", "default", "examples")  # values, not schemas: no $ref in them counts


class _Missing(enum.Enum):
    """What `_resolve` finds for a $ref it does not follow (None would be JSON's null)."""

    MISSING = enum.auto()


_MISSING = _Missing.MISSING


def dead_json_refs(schema: JsonValue) -> list[str] | None:
    """None when `schema` allows a finite value; else its $refs that allow none (maybe [])."""
    targets = {ref: target for ref in _refs_in(schema) if (target := _resolve(schema, ref)) is not _MISSING}
    uses = {ref: _refs_in(target) & targets.keys() for ref, target in targets.items()}
    productive = productive_names(uses, lambda ref, known: _json_productive(targets[ref], known, targets))
    if _json_productive(schema, productive, targets):
        return None
    return sorted(targets.keys() - productive)


def _refs_in(schema: JsonValue) -> set[str]:
    """Every $ref string anywhere in `schema` (its $defs included)."""
    if isinstance(schema, list):
        return set().union(*(_refs_in(item) for item in schema))
    if not isinstance(schema, dict):
        return set()
    ref = schema.get("$ref")
    refs = {ref} if isinstance(ref, str) else set()
    return refs.union(*(_refs_in(value) for key, value in schema.items() if key not in _DATA_KEYWORDS))


def _resolve(root: JsonValue, ref: str) -> JsonValue | Literal[_Missing.MISSING]:
    """The subschema a local JSON-pointer $ref names ("#", "#/$defs/x"), or _MISSING (other refs are
    not followed: they count as productive)."""
    if ref != "#" and not ref.startswith("#/"):
        return _MISSING
    node = root
    for part in ref[2:].split("/") if ref != "#" else []:
        key = urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return _MISSING
    return node


def _json_productive(schema: JsonValue, known: set[str], refs: dict[str, JsonValue]) -> bool:
    """Whether `schema` allows a finite value, given the $refs that do (`known`; the other local ones,
    in `refs`, allow none)."""
    if schema is False:
        return False
    if not isinstance(schema, dict):
        return True  # true, or not a schema (llguidance reports that)
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref in refs and ref not in known:
        return False

    def productive(subschema: JsonValue) -> bool:
        return _json_productive(subschema, known, refs)

    if not all(productive(sub) for sub in _schema_list(schema, "allOf")):
        return False
    for key in ("anyOf", "oneOf"):
        options = _schema_list(schema, key)
        if options and not any(productive(sub) for sub in options):
            return False
    if "const" in schema or schema.get("enum"):
        return True
    declared = schema.get("type")
    types = [declared] if isinstance(declared, str) else declared
    if not isinstance(types, list) or any(kind not in ("object", "array") for kind in types):
        return True  # untyped (any value) or a scalar type: a scalar ends
    return any(
        all(map(productive, _object_needs(schema) if kind == "object" else _array_needs(schema)))
        for kind in types
    )


def _schema_list(schema: JsonObject, key: str) -> list[JsonValue]:
    value = schema.get(key)
    return value if isinstance(value, list) else []


def _object_needs(schema: JsonObject) -> Iterator[JsonValue]:
    """The subschemas an object of `schema` must hold a value of: its required properties'."""
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    for name in _schema_list(schema, "required"):
        if not isinstance(name, str):
            continue  # not a property name (llguidance reports that)
        if name in properties:
            yield properties[name]
        elif not schema.get("patternProperties"):  # a pattern may name it: not modelled
            yield schema.get("additionalProperties", True)


def _array_needs(schema: JsonObject) -> Iterator[JsonValue]:
    """The subschemas an array of `schema` must hold an item of: minItems' first items, `contains`."""
    min_items = schema.get("minItems", 0)
    min_items = min_items if isinstance(min_items, int) else 0
    prefix, items = _schema_list(schema, "prefixItems"), schema.get("items", True)
    if isinstance(items, list):  # draft 4's tuple form
        prefix, items = items, schema.get("additionalItems", True)
    yield from prefix[:min_items]
    if min_items > len(prefix):
        yield items
    if "contains" in schema and schema.get("minContains", 1) != 0:
        yield schema["contains"]
