"""The package's typing stays strict (issue 27): mypy's strict mode on all of pagedserve, and fewer than
MAX_ANY_USES uses of `Any` (scripts/count_any.py counts them)."""

import ast
import importlib.util
import tomllib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
MAX_ANY_USES = 80  # exclusive: the count must stay below it


def _count_any() -> ModuleType:
    spec = importlib.util.spec_from_file_location("count_any", ROOT / "scripts" / "count_any.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mypy_is_strict_on_the_whole_package() -> None:
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["strict"] is True
    assert mypy["files"] == ["pagedserve"]
    # No override turns a strict check off for a module of the package.
    for override in mypy.get("overrides", []):
        modules = override["module"] if isinstance(override["module"], list) else [override["module"]]
        relaxed = [key for key, value in override.items() if key != "module" and value is False]
        assert not (relaxed and any(m.startswith("pagedserve") for m in modules)), override


def test_any_uses_below_the_limit() -> None:
    found = _count_any().count([ROOT / "pagedserve"])
    total = sum(len(lines) for lines in found.values())
    assert total < MAX_ANY_USES, f"{total} uses of Any (python scripts/count_any.py --list shows them)"


def test_count_any_counts_uses_not_imports_or_text() -> None:
    source = '''
import typing
from typing import Any
x: Any = 1
def f(a: dict[str, Any], b: "list[Any]") -> typing.Any:
    """Any value."""
y = cast("dict[str, Any]", x)
Json: TypeAlias = "dict[str, Any]"
message = "Any"
'''
    assert sorted(_count_any().any_uses(ast.parse(source))) == [4, 5, 5, 5, 7, 8]
