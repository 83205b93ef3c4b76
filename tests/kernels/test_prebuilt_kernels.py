"""The native CPU kernels compiled at install (setup.py): used only when their build record matches this
process (the same sources, torch, CPU), else the JIT build runs. The choice is tested on fake records
and a stand-in module, compiling nothing; one test checks that after CI's install
(`pip install --no-build-isolation -e .`, scripts/test.sh) the library compiled at install is what loads."""

import json
import os
import shutil
from pathlib import Path

import pytest

from pagedserve.kernels import cpu
from pagedserve.kernels.cpu import CpuKernels, build_config

STAND_IN = "json"  # an importable module standing in for the compiled library


def _write(path: Path, record: dict[str, object]) -> Path:
    path.write_text(json.dumps(record))
    return path


def test_setup_builds_the_jit_builds_sources() -> None:
    """setup.py reads `_SOURCES` (the one list of sources) without importing the package."""
    assert build_config.source_names() == [Path(source).name for source in cpu._SOURCES]


def test_digest_covers_sources_and_headers_only(tmp_path: Path) -> None:
    """The library and its record, built beside the sources, leave the digest unchanged (a digest taken
    before the build must equal one taken after it)."""
    copy = Path(shutil.copytree(build_config.FOLDER, tmp_path / "cpu", ignore=shutil.ignore_patterns("_C*")))
    before = build_config.sources_digest(copy)
    (copy / "_C.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    (copy / "_C.build.json").write_text("{}")
    assert build_config.sources_digest(copy) == before


def test_matching_record_may_load() -> None:
    here = build_config.build_record()
    assert build_config.prebuilt_mismatch(here, here) is None
    more_flags = {**here, "cpu_flags": [*build_config.cpu_flags(), "a_newer_cpu_feature"]}
    assert build_config.prebuilt_mismatch(here, more_flags) is None, "a CPU with more features runs it"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"sources_digest": "0123456789ab"}, "the C++ sources changed"),
        ({"torch_version": "2.4.0"}, "another torch"),
        ({"cpu_capability": "AVX512"}, "another CPU capability"),  # an AVX-512 build on an AVX2 CPU
        ({"cpu_flags": ["avx2", "avx512f", "fma"]}, "features this one lacks (avx512f)"),
        ({"cpu_flags": None}, "no CPU flags recorded"),
    ],
)
def test_mismatching_record_is_refused(change: dict[str, object], reason: str) -> None:
    here = {
        "sources_digest": "4079b2bd6bd6",
        "torch_version": "2.13.0+cpu",
        "cpu_capability": "AVX2",
        "cpu_flags": ["avx2", "fma", "sse4_2"],
    }
    assert reason in (build_config.prebuilt_mismatch({**here, **change}, here) or "")


def test_load_prebuilt_imports_only_a_matching_library(tmp_path: Path) -> None:
    here = build_config.build_record()
    matching = _write(tmp_path / "match.json", here)
    assert cpu._load_prebuilt(matching, STAND_IN) == CpuKernels(__import__(STAND_IN), source="prebuilt")
    stale = _write(tmp_path / "stale.json", {**here, "sources_digest": "0123456789ab"})
    assert cpu._load_prebuilt(stale, STAND_IN) is None
    assert cpu._load_prebuilt(tmp_path / "absent.json", STAND_IN) is None
    (tmp_path / "broken.json").write_text("{")
    assert cpu._load_prebuilt(tmp_path / "broken.json", STAND_IN) is None
    assert cpu._load_prebuilt(matching, "pagedserve.kernels.cpu._no_such_library") is None


@pytest.mark.parametrize("matches", [True, False])
def test_load_cpu_kernels_prefers_a_matching_prebuilt_else_jit(
    matches: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = {**build_config.build_record(), **({} if matches else {"cpu_capability": "ANOTHER"})}
    monkeypatch.setattr(build_config, "BUILD_INFO", _write(tmp_path / "_C.build.json", record))
    monkeypatch.setattr(build_config, "EXTENSION", STAND_IN)
    monkeypatch.setattr(cpu, "_build", lambda timeout_s: CpuKernels(None, "a JIT build", source="jit"))
    monkeypatch.setenv("PAGEDSERVE_CPU_KERNELS", "1")
    kernels = cpu.load_cpu_kernels.__wrapped__()
    assert kernels.source == ("prebuilt" if matches else "jit")


def test_the_library_compiled_at_install_is_what_loads() -> None:
    """After `pip install --no-build-isolation -e .` (CI's install) no process compiles the kernels."""
    if not build_config.BUILD_INFO.exists():
        _fail_in_ci_else_skip(f"not installed with `{build_config.PREBUILD_COMMAND}` (no build record)")
    built = json.loads(build_config.BUILD_INFO.read_text())
    reason = build_config.prebuilt_mismatch(built, build_config.build_record())
    if reason is not None:
        _fail_in_ci_else_skip(f"the library compiled at install does not match: {reason}")
    kernels = cpu.load_cpu_kernels()
    assert kernels.source == "prebuilt", kernels.error
    assert kernels.module is not None and kernels.module.__name__ == build_config.EXTENSION
    assert hasattr(kernels.module, "paged_attention")


def _fail_in_ci_else_skip(message: str) -> None:
    """CI installs with the prebuild command (scripts/test.sh); a developer's tree may not have."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
