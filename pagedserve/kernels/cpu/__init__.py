"""Native CPU kernels (C++/OpenMP): compiled at install, else with torch.utils.cpp_extension on first use.

`pip install --no-build-isolation -e .` compiles them (setup.py) into the `_C` module beside these
sources. `load_cpu_kernels()` loads it when it was built from these very sources, against this torch, for
this CPU (build_config.BUILD_INFO says); otherwise (no torch at install time, no compiler, sources edited
since, another machine) it compiles them on first use (JIT), cached in torch's extensions folder
($TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions), so only the first process on a machine pays
for it. A JIT build runs under a time limit (PAGEDSERVE_CPU_KERNELS_BUILD_TIMEOUT), a lock file older than
that is a killed build's and is removed, and whatever fails leaves the torch attention backend in use.
Importing this module compiles nothing: `load_cpu_kernels()` does, once per process.
"""

import contextlib
import functools
import importlib
import json
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Literal

import torch

from pagedserve import envs
from pagedserve.kernels.cpu import build_config
from pagedserve.kernels.cpu.build_config import sources_digest
from pagedserve.logger import init_logger

logger = init_logger(__name__)

_SOURCES = [
    str(Path(__file__).with_name(name))
    for name in (
        "paged_attention.cpp",
        "gguf_matmul.cpp",
        "gguf_decode_matmul.cpp",
        "gguf_packed_matmul.cpp",
        "gguf_packed_greedy.cpp",
        "gguf_kquant_matmul.cpp",
        "gguf_kquant_amx.cpp",
        "gguf_block_amx.cpp",
        "fp8_kv_cache.cpp",
        "fp8_matmul.cpp",
        "float_matmul.cpp",
        "fused_ops.cpp",
        "lora_bgmv.cpp",
        "greedy_argmax.cpp",
        "decode_inputs.cpp",
    )
]


@dataclass(frozen=True)
class CpuKernels:
    """The loaded extension, or why there is none (`error`: one line, for logs and test skips), and where it
    came from: "prebuilt" (compiled at install) or "jit" (compiled on first use)."""

    module: ModuleType | None
    error: str | None = None
    source: Literal["prebuilt", "jit"] | None = None


@functools.cache
def load_cpu_kernels() -> CpuKernels:
    """Load the extension compiled at install when it matches, else build it (first time on this machine)
    and load that, once per process. A failure (disabled by PAGEDSERVE_CPU_KERNELS=0, no compiler, missing
    headers, no ninja, a build or another process's build running past PAGEDSERVE_CPU_KERNELS_BUILD_TIMEOUT)
    comes back as `error`, never raised; only a malformed environment variable raises ConfigError."""
    if not envs.cpu_kernels_enabled():
        return CpuKernels(None, "disabled by PAGEDSERVE_CPU_KERNELS=0")
    prebuilt = _load_prebuilt(build_config.BUILD_INFO, build_config.EXTENSION)
    if prebuilt is not None:
        return prebuilt
    timeout_s = envs.cpu_kernels_build_timeout_s()
    start = time.perf_counter()
    outcome: queue.Queue[CpuKernels] = queue.Queue()
    # NOTE: torch waits forever on another build's lock file; a daemon thread lets us stop waiting (the
    # thread is left behind, polling, and dies with the process).
    threading.Thread(
        target=lambda: outcome.put(_build(timeout_s)), name="cpu-kernels-build", daemon=True
    ).start()
    try:
        kernels = outcome.get(timeout=timeout_s)
    except queue.Empty:
        return CpuKernels(
            None,
            f"the build did not finish within {timeout_s:g} s (another process may be "
            f"building them: its lock is in {_build_directory()}); raise "
            "PAGEDSERVE_CPU_KERNELS_BUILD_TIMEOUT to wait longer",
        )
    if kernels.module is not None:
        logger.info("Native CPU kernels ready in %.1f s (JIT build).", time.perf_counter() - start)
    return kernels


def _load_prebuilt(info_file: Path, module_name: str) -> CpuKernels | None:
    """The library compiled at install, when `info_file` (its build record) says it was built from these
    sources, against this torch, for this CPU; else None, logged with the reason, for the JIT build. Never
    imports a library that does not match: loading registers its ops (the JIT build's would then clash)
    and code built for CPU features this CPU lacks would die of SIGILL."""
    try:
        built = json.loads(info_file.read_text())
    except FileNotFoundError:
        logger.info(
            "Native CPU kernels: none were compiled at install (`%s` compiles them there); building "
            "them on first use (JIT, once per machine: cached in torch's extensions folder).",
            build_config.PREBUILD_COMMAND,
        )
        return None
    except (OSError, ValueError) as exc:
        reason: str | None = f"unreadable {info_file}: {exc}"
    else:
        reason = build_config.prebuilt_mismatch(built, build_config.build_record())
    if reason is None:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # e.g. another Python: the file is there under another ABI tag
            reason = f"it does not import: {_one_line(exc)}"
        else:
            logger.info("Native CPU kernels: the library compiled at install (%s).", module.__file__)
            return CpuKernels(module, source="prebuilt")
    logger.info(
        "Native CPU kernels: not using the library compiled at install (%s); building them on first use "
        "(JIT, once per machine: cached in torch's extensions folder).",
        reason,
    )
    return None


def _build(timeout_s: float) -> CpuKernels:
    try:
        from torch.utils import cpp_extension

        build_directory = _build_directory()
        _check_lock(os.path.join(build_directory, "lock"), timeout_s)
        module = cpp_extension.load(
            name=_extension_name(),
            build_directory=build_directory,
            sources=_SOURCES,
            extra_cflags=[*build_config.CFLAGS, *build_config.arch_flags(build_config.cxx_compiler())],
            extra_ldflags=build_config.LDFLAGS,
            verbose=False,
        )
    except Exception as exc:  # noqa: BLE001 (whatever the build breaks on, torch attention still works)
        return CpuKernels(None, _one_line(exc))
    return CpuKernels(module, source="jit")


@functools.cache
def _extension_name() -> str:
    # NOTE: cpp_extension's cache key (sources + flags) cannot tell CPUs apart, "-march=native" reading
    # the same everywhere; the capability in the name at least keeps a shared extensions folder from
    # handing an AVX-512 build to an AVX2-only CPU. The sources' digest gives every version of the kernels
    # its own folder: two versions of pagedserve started at once (an upgrade beside a running server, two
    # checkouts) would otherwise rebuild one folder in turn and one could load the other's library.
    capability = torch.backends.cpu.get_cpu_capability().lower()
    return f"pagedserve_cpu_kernels_{capability}_{sources_digest(Path(__file__).parent)}"


def _build_directory() -> str:
    """Where cpp_extension.load builds and caches the extension (and puts its lock file)."""
    from torch.utils import cpp_extension

    # NOTE: torch's own rule ($TORCH_EXTENSIONS_DIR or its default root); only a private function has it.
    return cpp_extension._get_build_directory(_extension_name(), verbose=False)


def _check_lock(lock: str, timeout_s: float) -> None:
    """A lock older than a whole build is a killed build's (torch would wait on it forever): removed. A
    younger one is said, since the wait that follows would otherwise look like a start that hangs."""
    try:
        age_s = time.time() - os.path.getmtime(lock)
    except FileNotFoundError:
        return
    if age_s <= timeout_s:
        logger.warning(
            "Waiting for another process's build of the native CPU kernels (its lock %s is %.0f s old); "
            "giving up after %g s (PAGEDSERVE_CPU_KERNELS_BUILD_TIMEOUT). If no other process is building "
            "them (one was killed mid-build), remove the lock file.",
            lock,
            max(age_s, 0.0),
            timeout_s,
        )
    else:
        logger.warning(
            "Removing the stale build lock %s (%.0f s old, longer than a build may take: "
            "PAGEDSERVE_CPU_KERNELS_BUILD_TIMEOUT=%g).",
            lock,
            age_s,
            timeout_s,
        )
        with contextlib.suppress(FileNotFoundError):
            os.remove(lock)


# What the kernel takes for "no attention sinks".
_NO_SINKS = torch.empty(0)
_NO_ENDS = torch.empty(0, dtype=torch.int64)  # every query attends up to its own position


def paged_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    fp8: tuple[torch.dtype, float, float] | None = None,
    query_start_loc: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    attend_ends: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of every query token over its request's K/V up to its own position, read in place
    through the request's block table. A query's output is the same bits whatever else the call holds
    (other requests, the rest of its chunk) and however many threads run it.

    q [num_tokens, num_heads, head_dim]; key_cache/value_cache [num_blocks, block_size, num_kv_heads,
    head_dim], contiguous, q's dtype (float32, float16 or bfloat16; softmax and sums in float32);
    block_tables [num_requests, max_blocks] int64 or int32; seq_lens [num_requests], each in
    [1, max_blocks * block_size]: each request's tokens of K/V, this step's included (already stored).
    `query_start_loc` [num_requests + 1]: request r's query tokens are q's rows [query_start_loc[r],
    query_start_loc[r + 1]), its last tokens (a prefill chunk, a verification); None: one each (decodes).
    `sliding_window` W: each query attends only to its last W tokens (the blocks before them are never
    read); `soft_cap` c: scores s become c * tanh(s / c); `sinks` [num_heads]: head h's softmax
    denominator gains e^sinks[h] (gpt-oss's attention sinks; read as float32). `attend_ends` [num_tokens]
    int64: a query whose entry is past its own position attends up to that end (one image's tokens, which
    attend each other both ways: Gemma 3), within its request's seq_lens.
    An fp8 cache: uint8 bits, read in place; `fp8` = (format, k_scale, v_scale): torch.float8_e4m3fn or
    torch.float8_e5m2, and the scales the values were stored with (stored = value / scale).
    Returns [num_tokens, num_heads, head_dim] in q's dtype.
    Raises RuntimeError when the kernels are unavailable or an input breaks this contract.
    """
    kernels = load_cpu_kernels()
    if kernels.module is None:
        raise RuntimeError(f"The native CPU kernels are unavailable: {kernels.error}")
    if query_start_loc is None:
        query_start_loc = torch.arange(q.shape[0] + 1)
    fp8_dtype, k_scale, v_scale = fp8 or (None, 1.0, 1.0)
    out: torch.Tensor = kernels.module.paged_attention(
        q,
        key_cache,
        value_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        scale,
        sliding_window or 0,
        soft_cap or 0.0,
        _fp8_format(fp8_dtype) if fp8_dtype else "",
        k_scale,
        v_scale,
        _NO_SINKS if sinks is None else sinks.float().contiguous(),
        _NO_ENDS if attend_ends is None else attend_ends,
    )
    return out


def reshape_and_cache_fp8(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    fp8_dtype: torch.dtype,
    k_scale: float,
    v_scale: float,
) -> None:
    """Token i's key / k_scale and value / v_scale [num_kv_heads, head_dim] as fp8 bits at slot
    slot_mapping[i] of the uint8 caches, saturated at the format's largest value and rounded to nearest
    even: what `(x.float() / scale).clamp(-max, max).to(fp8_dtype)` gives (torch.float8_e4m3fn or
    torch.float8_e5m2). Raises RuntimeError when the kernels are unavailable or an input breaks this
    contract (a slot outside the cache, a scale <= 0, another dtype)."""
    kernels = load_cpu_kernels()
    if kernels.module is None:
        raise RuntimeError(f"The native CPU kernels are unavailable: {kernels.error}")
    torch.ops.pagedserve.reshape_and_cache_fp8(
        key, value, key_cache, value_cache, slot_mapping, _fp8_format(fp8_dtype), k_scale, v_scale
    )


def _fp8_format(dtype: torch.dtype) -> str:
    """The kernels' name of an fp8 dtype: "e4m3fn" or "e5m2" (another dtype's name, which they refuse)."""
    return str(dtype).removeprefix("torch.float8_")


def _one_line(exc: Exception) -> str:
    """The exception's first line and, from a compiler log, its most telling line (the first with
    "error", else the last that is neither a command nor ninja's own)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    head = lines[0].split(": [", 1)[0]  # drop the echoed compiler command
    log = [line for line in lines[1:] if not line.startswith(("FAILED", "ninja:")) and " -o " not in line]
    detail = next((line for line in log if "error" in line.lower()), log[-1] if log else None)
    return f"{head}: {detail}" if detail else head
