"""`pagedserve plan`: the KV budget an operator otherwise works out by hand. From a model's config.json
alone (no weights loaded) and the accelerator's memory: weights, KV bytes per token, blocks, capacity,
the concurrency that fits, recommended flags, or plainly that the workload does not fit and what would.

Every figure comes from sizing.py, the arithmetic the engine's startup log uses, so with the same
settings (e.g. --kv-cache-memory, which both accept) the numbers are the engine's own. On a GPU the
engine measures the peak activations with a profiling run; the plan estimates them (and says so).

This module is the command: its flags, the report and the exit status. The steps are their own modules:
plan_inputs.py (flags -> resolved inputs), plan_figures.py (inputs -> figures), plan_advice.py (the flags
to use, or what would fit), plan_report.py (the table).
"""

import argparse
import json
from dataclasses import asdict
from typing import Any

from pagedserve.config import EngineArgs, add_dataclass_cli_args, dataclass_from_cli_args
from pagedserve.entrypoints.model_tag import take_model_tag
from pagedserve.entrypoints.plan_advice import alternatives, recommendations
from pagedserve.entrypoints.plan_figures import Plan, compute_plan
from pagedserve.entrypoints.plan_inputs import PlanArgs, PlanInputs, resolve_inputs
from pagedserve.entrypoints.plan_report import format_table
from pagedserve.entrypoints.plan_weights import gguf_types
from pagedserve.errors import ConfigError

# The engine flags the plan takes, with the engine's names, help and defaults.
ENGINE_FLAGS = (
    "dtype",
    "mmproj",
    "max_model_len",
    "block_size",
    "gpu_memory_utilization",
    "kv_cache_memory",
    "kv_cache_memory_bytes",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_num_batched_tokens",
    "kv_cache_dtype",
    "enable_lora",
    "max_loras",
    "max_lora_rank",
    "cpu_offload_gb",
)


def weights_format(inputs: PlanInputs) -> str:
    """How the weights are held on the device, in words (the GGUF types read from the file's header)."""
    dtype = inputs.model_config.dtype
    gguf_file = inputs.model_config.gguf_file
    if gguf_file is not None:
        packed, floats = gguf_types(gguf_file, inputs.device)
        kept = f"GGUF {', '.join(packed)} packed" if packed else "GGUF"
        return f"{kept}; {', '.join(floats)} tensors in {dtype}" if floats else kept
    if inputs.linear_storage is not None and inputs.linear_storage.method == "mxfp4":
        # NOTE: quantization/mxfp4.py: the torch backend widens each active expert per step
        kernels = "widened per step" if inputs.model_config.linear_backend == "torch" else "block kernels"
        return f"mxfp4 experts packed ({kernels}); the rest in {dtype}"
    if inputs.linear_storage is not None:
        return f"{inputs.linear_storage.method} linear layers packed; the rest in {dtype}"
    return dtype


def report(inputs: PlanInputs, plan: Plan) -> dict[str, Any]:
    """The whole plan as one JSON-able object."""
    return {
        "model": inputs.model_config.model,
        "architecture": inputs.model_config.architecture,
        "dtype": inputs.model_config.dtype,
        "kv_cache_dtype_bytes": inputs.kv_dtype_bytes,
        "tensor_parallel_size": inputs.tp,
        "pipeline_parallel_size": inputs.pp,
        "block_size": inputs.block_size,
        "gpu_memory_bytes": inputs.gpu_memory,
        "gpu_memory_utilization": inputs.utilization,
        "num_parameters": inputs.shape.num_parameters(1),
        "num_parameters_per_gpu": max(
            inputs.shape.stage(stage).num_parameters(inputs.tp) for stage in inputs.layout.stages
        ),
        "max_model_len": inputs.model_config.max_model_len,
        "concurrency": inputs.concurrency,
        "request_tokens": inputs.request_tokens,
        "sliding_window": inputs.layout.widest_window,
        "kv_cache_groups": inputs.layout.num_groups,
        "kv_layout": inputs.layout.model.describe(),
        "weights_format": weights_format(inputs),
        **asdict(plan),
        "recommended_flags": recommendations(inputs, plan) if plan.fits else None,
        "would_fit": [] if plan.fits else alternatives(inputs),
    }


def add_plan_args(parser: argparse.ArgumentParser) -> None:
    """The plan's flags, and the engine flags it shares (same names, help and defaults as `serve`)."""
    parser.add_argument("model_tag", nargs="?", default=None, help="The model (like --model).")
    add_dataclass_cli_args(PlanArgs, parser)
    add_dataclass_cli_args(EngineArgs, parser, only=ENGINE_FLAGS)


def run_plan(namespace: argparse.Namespace) -> int:
    """Print the plan; exit status 0 when the workload fits, 1 when it does not."""
    take_model_tag(namespace)
    if not namespace.model:
        raise ConfigError(
            "No model given: pass it as the first argument or as --model (an HF folder, its "
            "config.json or a GGUF file)."
        )
    args = dataclass_from_cli_args(PlanArgs, namespace)
    model = args.model[: -len("config.json")] or "." if args.model.endswith("config.json") else args.model
    engine_args = EngineArgs(model=model, **{name: getattr(namespace, name) for name in ENGINE_FLAGS})
    inputs = resolve_inputs(args, engine_args)
    result = report(inputs, compute_plan(inputs))
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0 if result["recommended_flags"] is not None else 1
