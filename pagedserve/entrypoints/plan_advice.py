"""`pagedserve plan`'s advice: the flags to serve a workload that fits with, and for one that does not,
what would fit (more GPUs, a shorter context, fewer requests, quantized weights, offloading, a higher
--gpu-memory-utilization)."""

import math
from dataclasses import replace
from typing import Any

from pagedserve.config.parallel import uneven_for_tensor_parallel
from pagedserve.entrypoints.plan_figures import Plan, compute_plan
from pagedserve.entrypoints.plan_inputs import TP_SIZES, PlanInputs
from pagedserve.entrypoints.plan_weights import LinearStorage
from pagedserve.utils import format_bytes

MAX_UTILIZATION = 0.95  # the most the plan recommends: leave the driver and other processes room


def needed_utilization(inputs: PlanInputs, plan: Plan) -> float | None:
    """The smallest --gpu-memory-utilization (0.01 steps) at which the workload fits; None without a GPU
    size."""
    if inputs.gpu_memory is None:
        return None
    blocks = inputs.concurrency * inputs.layout.max_blocks(inputs.request_tokens) + 1  # + the null block
    needed = plan.weights_bytes + plan.activation_bytes + plan.non_torch_bytes + plan.encoder_cache_bytes
    needed += blocks * plan.bytes_per_block
    return math.ceil(needed / inputs.gpu_memory * 100) / 100


def recommendations(inputs: PlanInputs, plan: Plan) -> dict[str, Any]:
    """The flags to serve this workload with (when it fits)."""
    flags: dict[str, Any] = {
        "--max-model-len": inputs.model_config.max_model_len,
        "--max-num-seqs": inputs.concurrency,
        "--max-num-batched-tokens": inputs.max_num_batched_tokens,
        "--tensor-parallel-size": inputs.tp,
    }
    if inputs.pp > 1:
        flags["--pipeline-parallel-size"] = inputs.pp
    needed = needed_utilization(inputs, plan)
    if needed is not None:
        # NOTE: keep the asked-for share when it fits: the extra KV absorbs bursts.
        flags["--gpu-memory-utilization"] = max(needed, inputs.utilization)
    else:
        flags["--kv-cache-memory"] = inputs.kv_cache_memory
    return flags


def alternatives(inputs: PlanInputs) -> list[str]:
    """What would fit a workload that does not: more GPUs, a shorter context, fewer requests, an 8-bit
    KV cache and weights, a higher utilization."""
    found: list[str] = []
    for tp in TP_SIZES:
        if (
            tp > inputs.tp
            and not uneven_for_tensor_parallel(inputs.model_config.hf_config, tp)
            and compute_plan(replace(inputs, tp=tp, cpu_offload_gb=0)).fits
        ):
            found.append(f"--tensor-parallel-size {tp} ({tp} GPUs)")
            break
    plan = compute_plan(inputs)
    usable = plan.num_blocks // max(1, inputs.concurrency)
    if usable >= 1:
        found.append(
            f"requests of at most {usable * inputs.block_size} tokens (--max-model-len, "
            f"--input-tokens + --output-tokens) for {inputs.concurrency} at once"
        )
    if plan.max_requests_at_request_tokens >= 1:
        found.append(
            f"--concurrency {plan.max_requests_at_request_tokens} (--max-num-seqs) at "
            f"{inputs.request_tokens} tokens each"
        )
    found += _quantized_alternatives(inputs)
    offload_gb = _cpu_offload_that_fits(inputs)
    if offload_gb is not None:
        found.append(
            f"--cpu-offload-gb {offload_gb} (that many GiB of decoder layers in pinned host memory, "
            "streamed to the GPU each step: slower)"
        )
    needed = needed_utilization(inputs, plan)
    if needed is not None and needed <= MAX_UTILIZATION and needed > inputs.utilization:
        found.append(f"--gpu-memory-utilization {needed:.2f}")
    return found


def _quantized_alternatives(inputs: PlanInputs) -> list[str]:
    """4-bit, then 8-bit linear layers (with an fp8 KV cache), where a float checkpoint's do not fit:
    counted as the engine holds them on the GPU (ggml rows; embeddings and LM head in the model's dtype,
    so a GGUF file, whose embeddings are quantized too, takes a little less)."""
    if inputs.linear_storage is not None or inputs.model_config.gguf_file is not None:
        return []
    int4 = replace(inputs, linear_storage=LinearStorage("int4"), cpu_offload_gb=0)
    if compute_plan(int4).fits:
        weights = format_bytes(compute_plan(int4).weights_bytes)
        return [
            f"4-bit weights ({weights} per GPU): a GPTQ/AWQ 4-bit checkpoint, a GGUF Q4_K_M or Q4_0 file, "
            "or --quantization int4"
        ]
    int8 = replace(inputs, linear_storage=LinearStorage("int8"), kv_dtype_bytes=1, cpu_offload_gb=0)
    if compute_plan(int8).fits:
        weights = format_bytes(compute_plan(int8).weights_bytes)
        return [
            f"8-bit weights ({weights} per GPU: an fp8 checkpoint, a GGUF Q8_0 file or --quantization "
            "int8) and an fp8 KV cache (--kv-cache-dtype fp8)"
        ]
    return []


def _cpu_offload_that_fits(inputs: PlanInputs) -> int | None:
    """The fewest whole GiB of --cpu-offload-gb (beyond the one asked for) with which the workload fits;
    None when offloading every decoder layer is not enough."""
    layers = min(sum(inputs.stage_weights(stage).layers) for stage in inputs.layout.stages)
    for gib in range(math.floor(inputs.cpu_offload_gb) + 1, layers // 2**30 + 1):
        if compute_plan(replace(inputs, cpu_offload_gb=gib)).fits:
            return gib
    return None
