"""The package's typing stays strict (issue 27): mypy's strict mode on all of pagedserve, and fewer than
MAX_ANY_USES uses of `Any` (scripts/count_any.py counts them). And its functions stay short: none over
MAX_FUNCTION_LINES lines outside pagedserve/kernels."""

import ast
import importlib.util
import tomllib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
MAX_ANY_USES = 80  # exclusive: the count must stay below it
# Inclusive. The kernels are exempt: a kernel's body is one tight loop nest that reads best unsplit.
MAX_FUNCTION_LINES = 60


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


def test_no_function_over_60_lines_outside_the_kernels() -> None:
    package = ROOT / "pagedserve"
    kernels = package / "kernels"
    offenders = []
    for path in sorted(package.rglob("*.py")):
        if path.is_relative_to(kernels):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            # Nested functions count on their own too (and inside the function that holds them).
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines (split them):\n" + "\n".join(offenders)
