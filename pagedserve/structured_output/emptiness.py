"""Constraints that can produce no output at all, refused before they reach the engine.

Why: llguidance (1.9) compiles and validates a grammar whose recursion never ends (`root ::= root`; a JSON
schema whose required property is the schema itself, `{"properties": {"a": {"$ref": "#"}}, "required":
["a"]}`), and its matcher dead-ends only at run time, after the request was accepted. It has no check
for this, so here is the textbook one: productivity, a least fixpoint (a rule is productive once one of
its alternatives uses only terminals and productive rules), over a JSON schema's $refs and a Lark
grammar's rules (GBNF arrives converted to Lark).

It over-approximates, so it refuses only what certainly produces nothing: what it does not model
(patterns, numeric ranges, regexes, Lark syntax it does not parse) counts as productive. The engine's
run-time check (matcher.py: the request ends with finish_reason "error") catches the rest.
"""

import enum
import json
import re
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Literal

from pagedserve.utils.user_json import JsonObject, JsonValue


def json_schema_emptiness(schema: JsonValue) -> str | None:
    """Why the JSON schema allows no value (for the 400's message), or None when it may allow one."""
    dead = _dead_json_refs(schema)
    if dead is None:
        return None
    if not dead:
        return "it allows no JSON value: a required property or array item allows none."
    return (
        f"it allows no finite JSON value: {_names('$ref', dead)} can never end, as every value it allows "
        "contains another (through a required property, minItems or allOf). Give the recursion a way out: "
        "make the property optional, allow an empty array, or add an anyOf branch without the $ref."
    )


def lark_emptiness(lark: str, gbnf: bool = False) -> str | None:
    """Why the Lark grammar produces no string, or None when it may produce one (or this cannot tell).
    `gbnf`: it was converted from GBNF, whose root rule is Lark's start."""
    dead = _dead_lark_rules(lark)
    if dead is None:
        return None
    if gbnf:
        dead = ["root" if name == "start" else name for name in dead]
    return (
        f"it produces no string: {_names('rule', dead)} can never end, as each of its alternatives uses a "
        "rule that never ends (itself included). Give every recursive rule an alternative without the "
        "recursion."
    )


def _names(kind: str, names: list[str]) -> str:
    shown = ", ".join(repr(name) for name in names[:5]) + (", ..." if len(names) > 5 else "")
    return f"{kind}{'s' if len(names) > 1 else ''} {shown}"


def _productive_names(uses: dict[str, set[str]], derives: Callable[[str, set[str]], bool]) -> set[str]:
    """The least fixpoint: the names whose definitions derive something finite. `uses[name]`: the names
    its definition refers to; `derives(name, productive)`: whether it derives something finite when the
    names in `productive` do (monotone). A name is tried again only when one it uses became productive."""
    users: dict[str, list[str]] = {}
    for name, used in uses.items():
        for other in used:
            users.setdefault(other, []).append(name)
    productive: set[str] = set()
    pending = list(uses)
    while pending:
        name = pending.pop()
        if name not in productive and derives(name, productive):
            productive.add(name)
            pending.extend(users.get(name, ()))
    return productive


# ---- JSON schemas: a $ref is a name, its target the definition ----

_DATA_KEYWORDS = ("const", "enum", "default", "examples")  # values, not schemas: no $ref in them counts


class _Missing(enum.Enum):
    """What `_resolve` finds for a $ref it does not follow (None would be JSON's null)."""

    MISSING = enum.auto()


_MISSING = _Missing.MISSING


def _dead_json_refs(schema: JsonValue) -> list[str] | None:
    """None when `schema` allows a finite value; else its $refs that allow none (maybe [])."""
    targets = {ref: target for ref in _refs_in(schema) if (target := _resolve(schema, ref)) is not _MISSING}
    uses = {ref: _refs_in(target) & targets.keys() for ref, target in targets.items()}
    productive = _productive_names(uses, lambda ref, known: _json_productive(targets[ref], known, targets))
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


# ---- Lark grammars: llguidance's dialect, the part that decides which rules can end ----

# A rule's definition: alternatives (any one), each a sequence (all) of rule names and groups. Terminals
# and optional parts ([...], ?, *, ~0.., {0,...}) are left out: they never stop a sequence from ending.
Alternatives = list[list["str | Alternatives"]]

_LARK_TOKENS = re.compile(
    r"""(?P<skip>[ \t]+|(\#|//)[^\n]*)
    | (?P<newline>(\r?\n[ \t]*)+)
    | (?P<terminal>"(\\.|[^"\\])*"i?|/(\\.|[^/\\])+/[imslux]*|<[^<>\s]+>|@[a-zA-Z0-9_\-]+)
    | (?P<directive>%[a-z]+)[ \t]*
    | (?P<name>[!?]?_?[a-zA-Z][_a-zA-Z0-9\-]*)
    | (?P<number>[+-]?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?)  # not "2.": 2..3 is a range
    | (?P<punct>->|\.\.|@\{|@\}|[:|()\[\]{},.~+*?=&])""",
    re.VERBOSE,
)
_ENDS_SEQUENCE = {"newline", "|", "->", ")", "]", "}", "eof"}
_JSON = json.JSONDecoder()


class _Unsupported(Exception):
    """Lark this analysis does not parse (templates, %override, nested grammars...): no verdict."""


def _dead_lark_rules(grammar: str) -> list[str] | None:
    """None when the grammar's start rule may end (or it cannot tell); else the rules that never end."""
    try:
        rules = _LarkRules(grammar).parse()
    except _Unsupported:
        return None
    if "start" not in rules:
        return None

    def derives(alternatives: Alternatives, known: set[str]) -> bool:
        return any(
            all(
                (part not in rules or part in known) if isinstance(part, str) else derives(part, known)
                for part in sequence
            )
            for sequence in alternatives
        )

    uses = {name: set(_rule_names(body)) for name, body in rules.items()}
    productive = _productive_names(uses, lambda name, known: derives(rules[name], known))
    return None if "start" in productive else sorted(rules.keys() - productive)


def _rule_names(alternatives: Alternatives) -> Iterator[str]:
    for sequence in alternatives:
        for part in sequence:
            yield from [part] if isinstance(part, str) else _rule_names(part)


def _lex(text: str) -> Iterator[tuple[str, str]]:
    """(kind, text) tokens: kind is a group name of _LARK_TOKENS, or the punctuation itself."""
    position = 0
    while position < len(text):
        match = _LARK_TOKENS.match(text, position)
        if match is None:
            raise _Unsupported(text[position : position + 20])
        kind, value = match.lastgroup or "", match.group(match.lastgroup or 0)
        position = match.end()
        if kind == "directive" and value in ("%json", "%regex", "%llguidance"):
            # Its JSON argument is one token: a terminal (%json, %regex) or a statement's (%llguidance).
            try:
                _, position = _JSON.raw_decode(text, position)
            except ValueError:
                raise _Unsupported(value) from None
            kind = "terminal" if value != "%llguidance" else kind
        if kind != "skip":
            yield (value if kind == "punct" else kind), value
    yield "eof", ""


class _LarkRules:
    """A recursive-descent reader of the rule definitions (token definitions and statements skipped)."""

    def __init__(self, grammar: str) -> None:
        self.tokens = list(_lex(grammar))
        self.position = 0

    def parse(self) -> dict[str, Alternatives]:
        rules: dict[str, Alternatives] = {}
        while self._kind() != "eof":
            if self._kind() == "newline":
                self.position += 1
            elif self._kind() == "name" and self._is_rule(self._value()):
                name = self._value().lstrip("!?")
                self.position += 1
                self._skip_rule_options()
                if name in rules:
                    raise _Unsupported(f"rule {name} defined twice")
                rules[name] = self._alternatives()
                if self._kind() not in ("newline", "eof"):
                    raise _Unsupported(f"unexpected {self._value()!r}")
            elif self._value() in ("%override", "%declare", "@{"):
                raise _Unsupported(self._value())
            else:
                self._skip_item()
        return rules

    def _kind(self, offset: int = 0) -> str:
        return self.tokens[min(self.position + offset, len(self.tokens) - 1)][0]

    def _value(self) -> str:
        return self.tokens[self.position][1]

    def _expect(self, kind: str) -> None:
        if self._kind() != kind:
            raise _Unsupported(f"expected {kind}, got {self._value()!r}")
        self.position += 1

    @staticmethod
    def _is_rule(name: str) -> bool:
        return name.lstrip("!?_")[:1].islower()

    def _skip_rule_options(self) -> None:
        """A priority (.2) and attributes ([lazy, stop=...]) between a rule's name and its colon."""
        if self._kind() == "{":
            raise _Unsupported("template rule")
        if self._kind() == ".":
            self.position += 2
        if self._kind() == "[":
            while self._kind() not in ("]", "eof"):
                self.position += 1
            self.position += 1
        self._expect(":")

    def _skip_item(self) -> None:
        """A token definition or a statement: up to the newline that is no `|` continuation."""
        depth = 0
        while self._kind() != "eof":
            kind = self._kind()
            if kind in ("(", "[", "{"):
                depth += 1
            elif kind in (")", "]", "}"):
                depth -= 1
            elif kind == "newline" and depth <= 0 and self._kind(1) != "|":
                return
            self.position += 1

    def _alternatives(self) -> Alternatives:
        alternatives = [self._sequence()]
        while self._kind() == "|" or (self._kind() == "newline" and self._kind(1) == "|"):
            self.position += 1 if self._kind() == "|" else 2
            alternatives.append(self._sequence())
        return alternatives

    def _sequence(self) -> list["str | Alternatives"]:
        sequence: list[str | Alternatives] = []
        while self._kind() not in _ENDS_SEQUENCE:
            part = self._expression()
            if part is not None:
                sequence.append(part)
        if self._kind() == "->":  # an alias names the tree node: no effect on the language
            self.position += 2
        return sequence

    def _expression(self) -> "str | Alternatives | None":
        """One atom and its repetition; None when it always ends (a terminal, or optional)."""
        kind = self._kind()
        self.position += 1
        part: str | Alternatives | None
        if kind in ("(", "["):
            group = self._alternatives()
            self._expect(")" if kind == "(" else "]")
            part = group if kind == "(" else None  # [...] is optional
        elif kind == "terminal":
            part = None
            if self._kind() == "..":  # a character range, "a".."z"
                self.position += 2
        elif kind == "name":
            name = self.tokens[self.position - 1][1]
            if self._kind() == "{" and self._kind(1) not in ("number", ","):
                raise _Unsupported("template use")
            part = name if self._is_rule(name) else None
        else:
            raise _Unsupported(kind)
        return None if self._min_repeats() == 0 else part

    def _min_repeats(self) -> int:
        """How many times the atom just read must occur: its operator ?, *, +, ~n..m or {n,m}."""
        kind = self._kind()
        if kind in ("?", "*", "+"):
            self.position += 1
            return 1 if kind == "+" else 0
        if kind == "~":
            self.position += 1
            minimum = self._number()
            if self._kind() == "..":
                self.position += 1
                self._number()
            return minimum
        if kind == "{":
            self.position += 1
            minimum = self._number() if self._kind() == "number" else 0
            while self._kind() in (",", "number"):
                self.position += 1
            self._expect("}")
            return minimum
        return 1

    def _number(self) -> int:
        value = self._value()
        self._expect("number")
        try:
            return int(value)
        except ValueError:
            raise _Unsupported(value) from None
