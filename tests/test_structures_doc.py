"""docs/structures.md's module list names every module of the package, and no module that is gone.

The rule its "## Modules" section is written to: a list item names a module by its path from the package
root (`core/scheduler.py`), or by its file name after the item's folder (`lora/`: `peft.py`, ...); a
nested folder is written from the root too (`entrypoints/openai/`). `__init__.py` files need a line only
where they hold more than the package's exports."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pagedserve"
SOURCE_SUFFIXES = (".py", ".cpp", ".h")
NAMED_PATH = re.compile(r"`([\w/]+(?:/|\.py|\.cpp|\.h))`")


def documented_modules() -> set[str]:
    section = (ROOT / "docs" / "structures.md").read_text().split("\n## Modules\n", 1)[1]
    named: set[str] = set()
    for item in re.split(r"\n(?=- )", section):
        folder = ""
        for token in NAMED_PATH.findall(item):
            if token.endswith("/"):
                folder = token
            else:
                named.add(token if "/" in token else folder + token)
    return named


def package_modules() -> set[str]:
    return {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*")
        if path.suffix in SOURCE_SUFFIXES and "__pycache__" not in path.parts
    }


def test_every_module_has_its_line() -> None:
    missing = {m for m in package_modules() - documented_modules() if not m.endswith("__init__.py")}
    assert not missing, f"docs/structures.md's module list lacks {sorted(missing)}"


def test_no_line_names_a_module_that_is_gone() -> None:
    stale = documented_modules() - package_modules()
    assert not stale, f"docs/structures.md names modules that do not exist: {sorted(stale)}"
