"""The native CPU kernels' JIT build never blocks a start: a lock left by a killed build is removed, a
build that runs past its time limit or fails leaves the torch attention backend in use, with a warning.
Each engine starts in its own process with a private TORCH_EXTENSIONS_DIR, on the JIT path even where the
install compiled the kernels, and compiles nothing (no compiler, or a lock it waits on)."""

import os
import subprocess
import sys
import time

from pagedserve.kernels import cpu as cpu_kernels

# Build a tiny model's engine, generate, and print which attention backend decoded. No build record: the
# library compiled at install (if any) is not used, the JIT build runs.
_SCRIPT = """
import sys
from pagedserve.kernels.cpu import build_config
build_config.BUILD_INFO = build_config.BUILD_INFO.with_name("absent.json")
from pagedserve import LLM, SamplingParams
llm = LLM(sys.argv[1], max_model_len=64, kv_cache_memory="1MiB", dtype="float32")
out = llm.generate(["Hello"], SamplingParams(max_tokens=3, temperature=0))[0].outputs[0]
assert len(out.token_ids) == 3
backend = type(llm.llm_engine.engine_core.executor.worker.model_runner.backend).__name__
print("BACKEND", backend)
"""
_START_LIMIT_S = 240  # an engine start on this busy machine, with the build cached: well under this


def _start_engine(model: str, extensions_dir: str, **env: str) -> tuple[str, str, float]:
    """The backend that decoded, the log, and the seconds the start took."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, model],
        capture_output=True,
        text=True,
        timeout=_START_LIMIT_S,
        env={**os.environ, "TORCH_EXTENSIONS_DIR": extensions_dir, **env},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    backend = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("BACKEND"))
    return backend, proc.stderr, time.monotonic() - start


def _lock(extensions: str, age_s: float) -> str:
    """A lock file `age_s` old where the JIT build of these sources puts it in `extensions`."""
    lock = os.path.join(extensions, cpu_kernels._extension_name(), "lock")
    os.makedirs(os.path.dirname(lock))
    open(lock, "w").close()
    mtime = time.time() - age_s
    os.utime(lock, (mtime, mtime))
    return lock


def test_stale_lock_of_a_killed_build_is_removed(tiny_llama: str, tmp_path) -> None:
    """Older than the 60 s a build may take here: a killed build's, removed, and the build goes ahead at
    once (it fails: no compiler) instead of waiting on it."""
    extensions = str(tmp_path / "torch_extensions")
    lock = _lock(extensions, age_s=120)
    backend, log, _ = _start_engine(
        tiny_llama, extensions, PAGEDSERVE_CPU_KERNELS_BUILD_TIMEOUT="60", CXX="false"
    )
    assert backend == "TorchPagedAttentionBackend", log[-2000:]
    assert "Removing the stale build lock" in log and not os.path.exists(lock)
    assert "did not finish within" not in log and "the native CPU kernels are unavailable" in log


def test_build_held_by_another_process_times_out_to_torch(tiny_llama: str, tmp_path) -> None:
    """A fresh lock (a build in progress elsewhere that never ends): the start waits only the time limit."""
    extensions = str(tmp_path / "torch_extensions")
    lock = _lock(extensions, age_s=-600)  # younger than a build throughout the start (which takes seconds)
    backend, log, _ = _start_engine(tiny_llama, extensions, PAGEDSERVE_CPU_KERNELS_BUILD_TIMEOUT="3")
    assert backend == "TorchPagedAttentionBackend", log[-2000:]
    assert (
        "WARNING" in log
        and "Waiting for another process's build of the native CPU kernels" in log
        and "did not finish within 3 s" in log
        and "PAGEDSERVE_CPU_KERNELS_BUILD_TIMEOUT" in log
    )
    assert os.path.exists(lock), "a live build's lock is left alone"


def test_failing_build_falls_back_to_torch_with_a_warning(tiny_llama: str, tmp_path) -> None:
    backend, log, _ = _start_engine(tiny_llama, str(tmp_path / "empty"), CXX="false")
    assert backend == "TorchPagedAttentionBackend"
    assert "WARNING" in log and "the native CPU kernels are unavailable" in log


def test_each_version_of_the_sources_builds_in_its_own_folder(tmp_path) -> None:
    """Two versions of the kernels (an upgraded package beside a running server) never share a build
    folder: the extension's name carries a digest of every source and header."""
    import shutil
    from pathlib import Path

    from pagedserve.kernels import cpu

    folder = Path(cpu.__file__).parent
    copy = Path(shutil.copytree(folder, tmp_path / "cpu", ignore=shutil.ignore_patterns("__pycache__")))
    assert cpu.sources_digest(copy) == cpu.sources_digest(folder)
    assert cpu.sources_digest(folder) in cpu._extension_name()
    header = copy / "vec.h"
    header.write_text(header.read_text() + "\n// changed\n")
    assert cpu.sources_digest(copy) != cpu.sources_digest(folder)
