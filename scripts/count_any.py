"""Count the uses of `typing.Any` in the pagedserve package (issue 27: fewer than 80).

A use is an `Any` name (or `typing.Any` / `t.Any` attribute) anywhere outside an import: in annotations,
type aliases, `cast(Any, ...)` and TypeVar bounds alike, since each is a place where type checking stops;
quoted types ("dict[str, Any]") count too. `from typing import Any` itself is not a use, nor is the word
in a docstring or a message. Usage: `python scripts/count_any.py [--list] [PATH ...]`.
"""

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "pagedserve"


def any_uses(tree: ast.AST) -> Iterator[int]:
    """The line of every use of Any in `tree`: imports are not visited, since they hold aliases, not
    Name nodes. A string in a type position ("dict[str, Any]") is parsed like the type it stands for."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "Any":
            yield node.lineno
        elif isinstance(node, ast.Attribute) and node.attr == "Any":
            yield node.lineno
    for node in _type_positions(tree):
        for string in ast.walk(node):
            if isinstance(string, ast.Constant) and isinstance(string.value, str) and "Any" in string.value:
                try:
                    inner = ast.parse(string.value.strip(), mode="eval")
                except SyntaxError:
                    continue
                yield from (string.lineno for _ in any_uses(inner))


def _type_positions(tree: ast.AST) -> Iterator[ast.expr]:
    """Annotations, the value of a `TypeAlias`, and cast()'s type: where a string is a type."""
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            yield node.annotation
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            yield node.returns
        elif isinstance(node, ast.AnnAssign):
            yield node.annotation
            if node.value is not None and "TypeAlias" in ast.unparse(node.annotation):
                yield node.value
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("cast") and node.args:
            yield node.args[0]


def count_file(path: Path) -> list[int]:
    return sorted(any_uses(ast.parse(path.read_text(), str(path))))


def count(paths: list[Path]) -> dict[Path, list[int]]:
    """Lines with a use of Any, per file that has any, over every .py file under `paths`."""
    files = sorted({f for p in paths for f in ([p] if p.is_file() else p.rglob("*.py"))})
    found = {f: count_file(f) for f in files}
    return {f: lines for f, lines in found.items() if lines}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, default=[PACKAGE])
    parser.add_argument("--list", action="store_true", help="print every use as FILE:LINE")
    args = parser.parse_args(argv)
    found = count(args.paths)
    if args.list:
        for path, lines in found.items():
            for line in lines:
                print(f"{path}:{line}")
    else:
        for path, lines in sorted(found.items(), key=lambda item: -len(item[1])):
            print(f"{len(lines):4d} {path}")
    print(sum(len(lines) for lines in found.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
