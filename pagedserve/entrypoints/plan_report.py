"""`pagedserve plan`'s table: the plan's figures (its JSON object) as two columns, then the verdict and
the recommended flags or what would fit."""

from typing import Any, TypeAlias

from pagedserve.utils import format_bytes

# The plan's JSON object, as plan.report() builds it (its keys are the JSON output's).
PlanReport: TypeAlias = dict[str, Any]
Row: TypeAlias = tuple[str, str]  # a figure's name and its value, as shown


def format_table(result: PlanReport) -> str:
    """The plan as a two-column table, then the verdict and the flags (or what would fit)."""
    rows = [
        *_model_rows(result),
        *_memory_rows(result),
        *_sliding_window_rows(result),
        *_capacity_rows(result),
    ]
    return "\n".join([*_two_columns(rows), *_verdict_lines(result)])


def _gib(result: PlanReport, key: str) -> str:
    return format_bytes(result[key])


def _model_rows(result: PlanReport) -> list[Row]:
    """What the model costs, whatever the GPU: its weights and KV cache per token and per block."""
    return [
        ("model", f"{result['model']} ({result['architecture']}, {result['dtype']})"),
        (
            "parameters",
            f"{result['num_parameters']:,} ({result['num_parameters_per_gpu']:,} per GPU, "
            f"tp={result['tensor_parallel_size']}, pp={result['pipeline_parallel_size']})",
        ),
        (
            "weights per GPU",
            f"{result['weights_bytes']:,} B ({_gib(result, 'weights_bytes')}; {result['weights_format']})",
        ),
        *_offload_rows(result),
        ("KV bytes per token", f"{result['kv_bytes_per_token']:,} B per GPU ({result['kv_layout']})"),
        ("KV bytes per block", f"{result['bytes_per_block']:,} B ({result['block_size']} tokens)"),
    ]


def _offload_rows(result: PlanReport) -> list[Row]:
    """--cpu-offload-gb's weights in host memory (none without it)."""
    if not result["cpu_offload_bytes"]:
        return []
    return [
        (
            "weights in host memory",
            f"{result['cpu_offload_bytes']:,} B ({_gib(result, 'cpu_offload_bytes')}, --cpu-offload-gb; the GPU "
            "keeps two layers' buffers for them)",
        )
    ]


def _memory_rows(result: PlanReport) -> list[Row]:
    """The GPU's memory and what takes it besides the KV cache (none when the GPU's size is unknown)."""
    if result["gpu_memory_bytes"] is None:
        return []
    return [
        ("GPU memory", f"{_gib(result, 'gpu_memory_bytes')} x {result['gpu_memory_utilization']}"),
        ("peak activations", f"{_gib(result, 'activation_bytes')} (estimated; the engine profiles it)"),
        ("outside torch", f"{_gib(result, 'non_torch_bytes')} (estimated)"),
        *([("encoder cache", _gib(result, "encoder_cache_bytes"))] if result["encoder_cache_bytes"] else []),
    ]


def _sliding_window_rows(result: PlanReport) -> list[Row]:
    """Why a sliding-window model's requests hold fewer blocks than their length (none without one)."""
    if result["sliding_window"] is None:
        return []
    return [
        (
            "sliding window",
            f"{result['sliding_window']} tokens on every layer: older blocks are "
            "freed, so a request holds at most the window's blocks",
        )
    ]


def _capacity_rows(result: PlanReport) -> list[Row]:
    """The KV cache that is left, and how many requests it holds at once."""
    return [
        ("KV cache budget", f"{result['kv_budget_bytes']:,} B ({_gib(result, 'kv_budget_bytes')})"),
        ("KV blocks", f"{result['num_blocks']:,} (+1 reserved)"),
        ("KV capacity", f"{result['capacity_tokens']:,} tokens"),
        (
            f"max concurrency at {result['max_model_len']} tokens",
            f"{result['max_concurrency_at_max_model_len']:.2f}x",
        ),
        (
            f"requests of {result['request_tokens']} tokens at once",
            f"{result['max_requests_at_request_tokens']:,}",
        ),
    ]


def _two_columns(rows: list[Row]) -> list[str]:
    """The rows' names padded to the longest, so that the values line up."""
    width = max(len(name) for name, _ in rows)
    return [f"{name:<{width}}  {value}" for name, value in rows]


def _verdict_lines(result: PlanReport) -> list[str]:
    """FITS and the flags to serve with, or DOES NOT FIT, why, and what would fit instead."""
    if result["recommended_flags"] is not None:
        return [
            f"\nFITS: {result['concurrency']} concurrent requests of {result['request_tokens']} "
            "tokens. Recommended flags:",
            "  " + " ".join(f"{flag} {value}" for flag, value in result["recommended_flags"].items()),
        ]
    why = (
        "the weights and activations alone take more than the GPU's share"
        if result["kv_budget_bytes"] <= 0
        else "they need more KV cache than this leaves"
    )
    return [
        f"\nDOES NOT FIT: {result['concurrency']} concurrent requests of "
        f"{result['request_tokens']} tokens: {why}. What would fit:",
        *([f"  - {option}" for option in result["would_fit"]] or ["  - nothing in reach: a larger GPU"]),
    ]
