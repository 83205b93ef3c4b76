"""Productivity, the least fixpoint the emptiness check (emptiness.py) runs over a JSON schema's $refs
and a Lark grammar's rules: a name is productive once its definition derives something finite from
productive names alone."""

from collections.abc import Callable


def productive_names(uses: dict[str, set[str]], derives: Callable[[str, set[str]], bool]) -> set[str]:
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
