"""`pagedserve plan`'s table: the plan's figures (its JSON object) as two columns, then the verdict and
the recommended flags or what would fit."""

from typing import Any

from pagedserve.utils import format_bytes


def format_table(result: dict[str, Any]) -> str:
    """The plan as a two-column table, then the verdict and the flags (or what would fit)."""

    def gib(key: str) -> str:
        return format_bytes(result[key])

    rows = [
        ("model", f"{result['model']} ({result['architecture']}, {result['dtype']})"),
        (
            "parameters",
            f"{result['num_parameters']:,} ({result['num_parameters_per_gpu']:,} per GPU, "
            f"tp={result['tensor_parallel_size']})",
        ),
        ("weights per GPU", f"{result['weights_bytes']:,} B ({gib('weights_bytes')})"),
        ("KV bytes per token", f"{result['kv_bytes_per_token']:,} B per GPU"),
        ("KV bytes per block", f"{result['bytes_per_block']:,} B ({result['block_size']} tokens)"),
    ]
    if result["gpu_memory_bytes"] is not None:
        rows += [
            ("GPU memory", f"{gib('gpu_memory_bytes')} x {result['gpu_memory_utilization']}"),
            ("peak activations", f"{gib('activation_bytes')} (estimated; the engine profiles it)"),
            ("outside torch", f"{gib('non_torch_bytes')} (estimated)"),
        ]
    if result["sliding_window"] is not None:
        rows.append(
            (
                "sliding window",
                f"{result['sliding_window']} tokens on every layer: older blocks are "
                "freed, so a request holds at most the window's blocks",
            )
        )
    rows += [
        ("KV cache budget", f"{result['kv_budget_bytes']:,} B ({gib('kv_budget_bytes')})"),
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
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    if result["recommended_flags"] is not None:
        lines.append(
            f"\nFITS: {result['concurrency']} concurrent requests of {result['request_tokens']} "
            "tokens. Recommended flags:"
        )
        lines.append(
            "  " + " ".join(f"{flag} {value}" for flag, value in result["recommended_flags"].items())
        )
    else:
        why = (
            "the weights and activations alone take more than the GPU's share"
            if result["kv_budget_bytes"] <= 0
            else "they need more KV cache than this leaves"
        )
        lines.append(
            f"\nDOES NOT FIT: {result['concurrency']} concurrent requests of "
            f"{result['request_tokens']} tokens: {why}. What would fit:"
        )
        lines += [f"  - {option}" for option in result["would_fit"]] or ["  - nothing in reach: a larger GPU"]
    return "\n".join(lines)
