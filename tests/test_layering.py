"""docs/design.md's layering, enforced: import-linter contracts, and core/ importable without torch."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
