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

Here: the two checks and their messages. The fixpoint is productive.py; the JSON half emptiness_json.py,
the Lark half (its reader of the rules) emptiness_lark.py.
"""

from pagedserve.structured_output.emptiness_json import dead_json_refs
from pagedserve.structured_output.emptiness_lark import dead_lark_rules
from pagedserve.utils.user_json import JsonValue


def json_schema_emptiness(schema: JsonValue) -> str | None:
    """Why the JSON schema allows no value (for the 400's message), or None when it may allow one."""
    dead = dead_json_refs(schema)
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
    dead = dead_lark_rules(lark)
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
