"""Which rules of a Lark grammar (llguidance's dialect; GBNF arrives converted) never end (emptiness.py's
Lark half): a recursive-descent reader of the rule definitions, the part of the grammar that decides
which rules can end, then the productivity fixpoint over them. Lark it does not parse gives no verdict."""

import json
import re
from collections.abc import Iterator

from pagedserve.structured_output.productive import productive_names

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


def dead_lark_rules(grammar: str) -> list[str] | None:
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
    productive = productive_names(uses, lambda name, known: derives(rules[name], known))
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
