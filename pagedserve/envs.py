"""Environment variables pagedserve reads. Each is optional; a bad value is an error naming the variable."""

import os

from pagedserve.errors import ConfigError


def log_stats_interval_s() -> float:
    """PAGEDSERVE_LOG_STATS_INTERVAL: seconds between two stats log lines of the server (default 10)."""
    return _positive_seconds("PAGEDSERVE_LOG_STATS_INTERVAL", "10")


def _positive_seconds(name: str, default: str) -> float:
    raw = os.environ.get(name, default)
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(f"{name}={raw!r} must be a positive number of seconds.")
    return value


def api_key() -> str | None:
    """The server's API key when --api-key is not given: PAGEDSERVE_API_KEY, else vLLM's VLLM_API_KEY."""
    return os.environ.get("PAGEDSERVE_API_KEY") or os.environ.get("VLLM_API_KEY") or None


def cpu_kernels_enabled() -> bool:
    """PAGEDSERVE_CPU_KERNELS: 0 keeps the native CPU kernels unbuilt and unused (default 1)."""
    raw = os.environ.get("PAGEDSERVE_CPU_KERNELS", "1")
    if raw not in ("0", "1"):
        raise ConfigError(f"PAGEDSERVE_CPU_KERNELS={raw!r} must be 0 (disable the native CPU kernels) or 1.")
    return raw == "1"


def fused_cpu_ops_enabled() -> bool:
    """PAGEDSERVE_FUSED_CPU_OPS: 0 keeps the layers (RMSNorm, rotary, gated activations) on their torch ops
    while the native attention and GGUF kernels stay in use (default 1; for before/after measurements)."""
    raw = os.environ.get("PAGEDSERVE_FUSED_CPU_OPS", "1")
    if raw not in ("0", "1"):
        raise ConfigError(f"PAGEDSERVE_FUSED_CPU_OPS={raw!r} must be 0 (torch layers) or 1 (fused kernels).")
    return raw == "1"


def cpu_amx_enabled() -> bool:
    """PAGEDSERVE_CPU_AMX: 0 keeps the GGUF matmuls off AMX tiles where the CPU has them (default 1; for
    before/after measurements: K-quants give the same bits either way, Q4_0/Q4_1/Q8_0 prefill the same
    float32 arithmetic up to the order of additions)."""
    raw = os.environ.get("PAGEDSERVE_CPU_AMX", "1")
    if raw not in ("0", "1"):
        raise ConfigError(f"PAGEDSERVE_CPU_AMX={raw!r} must be 0 (no AMX) or 1 (AMX where the CPU has it).")
    return raw == "1"


def cpu_kernels_build_timeout_s() -> float:
    """PAGEDSERVE_CPU_KERNELS_BUILD_TIMEOUT: seconds the native CPU kernels may take to build (or to wait
    for another process's build) before the torch attention backend is used instead (default 600). A build
    lock older than this is a killed build's and is removed."""
    return _positive_seconds("PAGEDSERVE_CPU_KERNELS_BUILD_TIMEOUT", "600")


def gguf_activation_bits() -> int:
    """PAGEDSERVE_GGUF_ACTIVATION_BITS: how the GGUF decode kernels (batch <= 8; Q4_0, Q4_1, Q8_0, Q4_K, Q5_K weights,
    also the int8/int4 schemes' blocks) take activations: 32 (float32, exact), 16 (default) or 8 (llama.cpp's
    8-bit blocks: fastest, changes logits by about 1%; docs/benchmarks.md, Activation precision)."""
    raw = os.environ.get("PAGEDSERVE_GGUF_ACTIVATION_BITS", "16")
    if raw not in ("8", "16", "32"):
        raise ConfigError(f"PAGEDSERVE_GGUF_ACTIVATION_BITS={raw!r} must be 8, 16 or 32.")
    return int(raw)


def allow_runtime_lora_updating() -> bool:
    """PAGEDSERVE_ALLOW_RUNTIME_LORA_UPDATING, else vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING: 1 or true opens
    /v1/load_lora_adapter and /v1/unload_lora_adapter (default off)."""
    for name in ("PAGEDSERVE_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_ALLOW_RUNTIME_LORA_UPDATING"):
        raw = os.environ.get(name)
        if raw is not None:
            value = raw.strip().lower()
            if value not in ("0", "1", "true", "false", ""):
                raise ConfigError(f"{name}={raw!r} must be 1/true (allow) or 0/false.")
            return value in ("1", "true")
    return False


def pp_layer_partition() -> str | None:
    """PAGEDSERVE_PP_LAYER_PARTITION: layers per pipeline stage, e.g. "4,4,8" (default: an even split;
    config/parallel.py's `pipeline_stages` checks it against the model)."""
    return os.environ.get("PAGEDSERVE_PP_LAYER_PARTITION")


def pp_batch_queue_enabled() -> bool:
    """PAGEDSERVE_PP_BATCH_QUEUE: 0 runs pipeline stages one batch at a time, no micro-batches in flight
    (default 1: --pipeline-parallel-size batches in flight; for before/after measurements)."""
    raw = os.environ.get("PAGEDSERVE_PP_BATCH_QUEUE", "1")
    if raw not in ("0", "1"):
        raise ConfigError(
            f"PAGEDSERVE_PP_BATCH_QUEUE={raw!r} must be 0 (one batch at a time) or 1 (micro-batches)."
        )
    return raw == "1"
