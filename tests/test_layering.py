"""docs/design.md's layering, enforced: import-linter contracts, core/ importable without torch, and no
import cycle between modules."""

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = Path(ROOT) / "pagedserve"


def test_import_linter_contracts_kept() -> None:
    lint_imports = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    result = subprocess.run(
        [lint_imports, "--config", ".importlinter"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_core_imports_without_torch() -> None:
    code = (
        "import sys; import pagedserve.core.scheduler, pagedserve.core.kv_cache_manager; "
        "assert 'torch' not in sys.modules, 'core pulled in torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


ImportGraph = dict[str, set[str]]


def _module_files() -> dict[str, Path]:
    """Every module of the package by dotted name; a package's __init__.py under the package's name."""
    files: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _from_base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module a `from ... import` names, relative imports resolved against `module`."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _named_modules(module: str, path: Path, files: dict[str, Path]) -> set[str]:
    """The modules `module` names in its imports, at any level (functions, TYPE_CHECKING blocks too):
    `import a.b` names a.b; `from a import b` names a (its __init__) and a.b when that is a module."""
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(module, path.name == "__init__.py", node)
            named.add(base)
            named.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in named if name in files and name != module}


def import_graph() -> ImportGraph:
    """module -> the package's modules it imports, read from the source (nothing is imported)."""
    files = _module_files()
    return {module: _named_modules(module, path, files) for module, path in files.items()}


def find_cycle(graph: ImportGraph) -> list[str] | None:
    """One import cycle (its modules, the first repeated at the end), or None."""
    acyclic: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in acyclic:
            return None
        for child in sorted(graph[module]):
            cycle = visit(child, [*path, module])
            if cycle is not None:
                return cycle
        acyclic.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module, [])
        if cycle is not None:
            return cycle
    return None


def test_no_import_cycle_between_modules() -> None:
    """Every import counts, lazy (in a function) and TYPE_CHECKING ones too: a module that needs a
    name from one that imports it takes it from a module both can import instead. The package
    __init__ modules are nodes like any other (an import of a package is an edge to its __init__), with
    no exception. Not counted: the parent packages Python initializes on the way to a submodule
    (`from pagedserve.config.cache import X` runs pagedserve/config/__init__.py first); counting them
    would make every __init__ that re-exports its submodules (config, platforms, model_loader) a cycle
    with them, which is Python's package initialization, not two modules needing each other."""
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_import_graph_sees_every_kind_of_import() -> None:
    """The graph the cycle check walks has top-level, lazy (in a function) and TYPE_CHECKING imports,
    and an import of a package as an edge to its __init__."""
    graph = import_graph()
    assert "pagedserve.engine.request_stream" in graph["pagedserve.engine.async_llm"]
    assert "pagedserve.entrypoints.openai.api_server" in graph["pagedserve.entrypoints.cli"]  # in _serve
    assert "pagedserve.executor.base" in graph["pagedserve.executor"]  # under TYPE_CHECKING
    assert "pagedserve.platforms" in graph["pagedserve.attention.backends"]  # a package: its __init__


def test_relative_imports_resolve() -> None:
    def base(module: str, is_package: bool, source: str) -> str:
        node = ast.parse(source).body[0]
        assert isinstance(node, ast.ImportFrom)
        return _from_base(module, is_package, node)

    assert (
        base("pagedserve.engine.core", False, "from .frontend import Frontend")
        == "pagedserve.engine.frontend"
    )
    assert base("pagedserve.engine.core", False, "from .. import envs") == "pagedserve"
    assert base("pagedserve.engine.core", False, "from ..config import X") == "pagedserve.config"
    assert base("pagedserve.engine", True, "from .core import X") == "pagedserve.engine.core"


def test_find_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]


def _contract_layers() -> list[list[str]]:
    """The layers of .importlinter's layers contract, top first, each a list of independent packages."""
    text = (Path(ROOT) / ".importlinter").read_text()
    block = text.split("layers =\n", 1)[1].split("\n\n", 1)[0]
    return [
        [name.strip().removeprefix("pagedserve.") for name in line.split("|")]
        for line in block.splitlines()
        if line.strip()
    ]


def _design_layers() -> list[list[str]]:
    """The layer block of docs/design.md's "Layers" section: the packages before the description."""
    text = (Path(ROOT) / "docs" / "design.md").read_text()
    section = text.split("## Layers", 1)[1]
    block = section.split("```\n", 2)[1]
    layers = []
    for line in block.splitlines():
        names = line.split("  ", 1)[0]  # two spaces part the packages from what they hold
        layers.append([name.strip() for name in names.split("|")])
    return layers


def test_design_md_lists_the_contracts_layers() -> None:
    """design.md's layer diagram is the import-linter contract, line for line and sibling for sibling,
    and siblings are independent (`|`), never `:` (which would let them import each other)."""
    assert ":" not in "".join(" ".join(layer) for layer in _contract_layers())
    assert _design_layers() == _contract_layers()
    listed = {name for layer in _contract_layers() for name in layer}
    packages = {path.stem if path.suffix == ".py" else path.name for path in PACKAGE.iterdir()}
    packages -= {"__init__", "__main__", "__pycache__"}
    assert packages - listed == set(), "packages the layers contract leaves out"


# The KV manager's own state, and the modules that are its parts (docs/design.md: a sealed KV manager).
KV_MANAGER_STATE = {"req_to_blocks", "block_pool", "ref_cnt", "num_freed_leading", "device_null_block"}
KV_MANAGER_MODULES = {
    "kv_cache_manager.py",
    "kv_cache_tables.py",
    "block_pool.py",
    "swap.py",
    "prefix_hit.py",
    "hashing.py",
}


def test_nobody_reads_the_kv_managers_state() -> None:
    """The scheduler and everything else ask the KV manager (allocate, fork, swap out/in, free, stats);
    only its own modules touch its tables, pools and reference counts."""
    readers = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "core" and path.name in KV_MANAGER_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in KV_MANAGER_STATE:
                readers.append(f"{path.relative_to(PACKAGE)}:{node.lineno} .{node.attr}")
    assert readers == []
