"""`pagedserve plan`: the KV budget an operator otherwise works out by hand. From a model's config.json
alone (no weights loaded) and the accelerator's memory: weights, KV bytes per token, blocks, capacity,
the concurrency that fits, recommended flags, or plainly that the workload does not fit and what would.

Every figure comes from sizing.py, the arithmetic the engine's startup log uses, so with the same
settings (e.g. --kv-cache-memory, which both accept) the numbers are the engine's own. On a GPU the
engine measures the peak activations with a profiling run; the plan estimates them (and says so).
"""

import argparse
import json
import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from pagedserve.config import (
    EngineArgs,
    KVCacheConfig,
    ModelConfig,
    add_dataclass_cli_args,
    config_field,
    dataclass_from_cli_args,
    default_max_num_batched_tokens,
)
from pagedserve.config.kv_layout import DTYPE_BYTES, KVCacheLayout
from pagedserve.config.lora import LoRAConfig
from pagedserve.config.parallel import PipelineStage, uneven_for_tensor_parallel
from pagedserve.entrypoints.model_tag import take_model_tag
from pagedserve.entrypoints.plan_images import checked_image_tokens, encoder_cache_bytes
from pagedserve.entrypoints.plan_report import format_table
from pagedserve.entrypoints.plan_weights import (
    LinearStorage,
    gguf_types,
    gguf_weights_bytes,
    linear_storage,
    mmproj_weights_bytes,
    weights_bytes,
)
from pagedserve.errors import ConfigError
from pagedserve.lora.shapes import ModelShapes
from pagedserve.sizing import (
    ModelShape,
    WeightBytes,
    choose_offloaded_layers,
    gpu_kv_budget,
    kv_cache_config,
    max_concurrency,
    max_full_requests,
)
from pagedserve.utils import format_bytes, parse_bytes

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
# Memory a GPU engine uses outside torch's allocator (NCCL buffers, cuBLAS workspaces): an estimate.
NON_TORCH_BYTES = 512 * 2**20
MAX_UTILIZATION = 0.95  # the most the plan recommends: leave the driver and other processes room
TP_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class PlanArgs:
    """The workload and the accelerator (the engine's own flags come from EngineArgs)."""

    model: str = config_field("", "Model: HF folder (its config.json), a config.json file or a GGUF file.")
    gpu_memory: str | None = config_field(
        None, "Memory of one accelerator, e.g. 80GiB. Default: the local GPU's."
    )
    concurrency: int = config_field(1, "Requests to serve at once.")
    input_tokens: int | None = config_field(
        None, "Prompt tokens per request (default: the context less --output-tokens)."
    )
    output_tokens: int | None = config_field(None, "Generated tokens per request (default 0).")
    image_tokens: int = config_field(
        0, "Image placeholder tokens per request, beyond --input-tokens (an image model's; default 0)."
    )
    json: bool = config_field(False, "Print one JSON object instead of the table.")


@dataclass(frozen=True)
class PlanInputs:
    """Everything the figures depend on, resolved."""

    shape: ModelShape
    model_config: ModelConfig
    tp: int
    pp: int
    dtype_bytes: int
    kv_dtype_bytes: int
    block_size: int
    gpu_memory: int | None  # bytes of one GPU; None with an explicit KV budget
    utilization: float
    kv_cache_memory: int | None
    max_num_batched_tokens: int
    concurrency: int
    request_tokens: int
    linear_storage: LinearStorage | None = None  # a quantized checkpoint's linear layers
    lora_bytes: int = 0  # --enable-lora: the adapters' slots (--max-loras x --max-lora-rank), all layers
    cpu_offload_gb: float = 0.0  # --cpu-offload-gb: decoder-layer weights kept in host memory
    device: str = "cuda"  # the device the weights are counted for (their resident formats)
    encoder_cache_bytes: int = 0  # an image model's encoder cache at its budget (plan_images.py)

    def stage_weights(self, stage: PipelineStage) -> WeightBytes:
        """One rank's weights on `stage`, in the formats the engine holds on the device: a GGUF file
        tensor by tensor from its header, else from the model's shape."""
        gguf_file, mmproj_file = self.model_config.gguf_file, self.model_config.mmproj_file
        if gguf_file is not None:
            weights = gguf_weights_bytes(gguf_file, self.tp, stage, self.device, self.dtype_bytes)
            if mmproj_file is None or not stage.is_first:
                return weights
            vision = mmproj_weights_bytes(mmproj_file, self.dtype_bytes)
            return replace(weights, outside=weights.outside + vision)
        return weights_bytes(self.shape.stage(stage), self.tp, self.dtype_bytes, self.linear_storage)

    def stage_lora_bytes(self, stage: PipelineStage) -> int:
        """The slots a rank of `stage` allocates: those beside its own layers."""
        return self.lora_bytes * (stage.end - stage.start) // self.shape.num_layers

    @property
    def layout(self) -> KVCacheLayout:
        """The KV cache layout the engine would have on its `tp` x `pp` ranks (the engine's own arithmetic)."""
        return KVCacheLayout.build(
            self.model_config,
            self.block_size,
            self.kv_dtype_bytes,
            self.tp,
            self.max_num_batched_tokens,
            pp=self.pp,
        )


@dataclass(frozen=True)
class Plan:
    """The figures, per GPU (rank), as the engine's startup log gives them; at pp > 1 the largest
    stage's weights and block, the budget of the stage that holds the fewest blocks."""

    weights_bytes: int  # on the device: the LoRA slots and --cpu-offload-gb's buffers included
    lora_bytes: int
    cpu_offload_bytes: int  # the weights --cpu-offload-gb keeps in host memory
    kv_bytes_per_token: int
    bytes_per_block: int
    activation_bytes: int  # estimated (0 with an explicit KV budget)
    encoder_cache_bytes: int  # an image model's (plan_images.py); outside an explicit KV budget
    non_torch_bytes: int
    kv_budget_bytes: int
    num_blocks: int  # usable, the reserved null block not counted
    capacity_tokens: int
    max_concurrency_at_max_model_len: float
    max_requests_at_request_tokens: int
    fits: bool


def compute_plan(inputs: PlanInputs) -> Plan:
    """The engine's arithmetic (sizing.py) on `inputs`: every pipeline stage gets the block count of the
    stage whose budget holds the fewest blocks (its own layers' bytes per block)."""
    layout = inputs.layout
    stages = [_stage_memory(inputs, stage) for stage in layout.stages]
    blocks = [
        kv_cache_config(memory.kv_budget, layout.stage_bytes_per_block(rank), inputs.block_size).num_blocks
        for rank, memory in enumerate(stages)
    ]
    tightest = stages[blocks.index(min(blocks))]
    kv = KVCacheConfig(min(blocks), inputs.block_size, layout.bytes_per_block)
    max_model_len = inputs.model_config.max_model_len
    fitting = max_full_requests(kv, inputs.request_tokens, layout)
    fits = fitting >= inputs.concurrency and max_full_requests(kv, max_model_len, layout) >= 1
    usable = max(0, kv.num_blocks - 1)
    return Plan(
        max(memory.weights for memory in stages),
        max(inputs.stage_lora_bytes(stage) for stage in layout.stages),
        max(memory.host_weights for memory in stages),
        layout.bytes_per_token,
        layout.bytes_per_block,
        tightest.activations,
        inputs.encoder_cache_bytes,
        0 if inputs.kv_cache_memory is not None else NON_TORCH_BYTES,
        tightest.kv_budget,
        usable,
        usable * inputs.block_size,
        max(0.0, max_concurrency(kv, max_model_len, layout)),
        fitting,
        fits,
    )


@dataclass(frozen=True)
class _StageMemory:
    """One rank's memory in a pipeline stage (every rank at pp=1)."""

    weights: int  # on the device
    host_weights: int  # --cpu-offload-gb's
    activations: int  # estimated (0 with an explicit KV budget)
    kv_budget: int


def _stage_memory(inputs: PlanInputs, stage: PipelineStage) -> _StageMemory:
    shape = inputs.shape.stage(stage)
    all_weights = inputs.stage_weights(stage)
    offload = choose_offloaded_layers(all_weights.layers, inputs.cpu_offload_gb)
    weights = offload.device_bytes(all_weights) + inputs.stage_lora_bytes(stage)
    if inputs.kv_cache_memory is not None:
        return _StageMemory(weights, offload.host_bytes, 0, inputs.kv_cache_memory)
    assert inputs.gpu_memory is not None, "resolve_inputs sets one of the two"
    # NOTE: the engine profiles one request of this many tokens (worker._profile_run).
    num_tokens = min(inputs.max_num_batched_tokens, inputs.model_config.max_model_len)
    activations = shape.activation_bytes(num_tokens, inputs.tp, inputs.dtype_bytes)
    budget = (
        gpu_kv_budget(inputs.gpu_memory, inputs.utilization, weights, activations, NON_TORCH_BYTES)
        - inputs.encoder_cache_bytes
    )
    return _StageMemory(weights, offload.host_bytes, activations, budget)


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


def resolve_inputs(args: PlanArgs, engine_args: EngineArgs) -> PlanInputs:
    """Read the model's config (no weights) and resolve defaults as the engine does. Raises ConfigError."""
    if args.concurrency < 1:
        raise ConfigError(f"--concurrency {args.concurrency} must be at least 1.")
    # NOTE: dtype "auto" resolves as on a GPU: the checkpoint's.
    model_config = engine_args.model_config("cuda")
    shape = ModelShape.from_hf_config(model_config.hf_config, model_config.architecture)
    tp = engine_args.tensor_parallel_size
    if tp < 1 or uneven_for_tensor_parallel(model_config.hf_config, tp):
        choices = [t for t in TP_SIZES if not uneven_for_tensor_parallel(model_config.hf_config, t)]
        raise ConfigError(
            f"--tensor-parallel-size {tp} does not divide the model's heads and MLP; choose "
            f"one of {', '.join(str(t) for t in choices)}."
        )
    pp = engine_args.pipeline_parallel_size
    image_tokens = checked_image_tokens(args.image_tokens, model_config)
    request_tokens = _request_tokens(args, model_config.max_model_len, image_tokens)
    if engine_args.max_model_len is None:  # the recommended context: what the workload needs
        model_config = replace(model_config, max_model_len=request_tokens)
    dtype_bytes = DTYPE_BYTES[model_config.dtype]
    kv_cache_dtype = engine_args.kv_cache_dtype
    kv_dtype_bytes = dtype_bytes if kv_cache_dtype == "auto" else DTYPE_BYTES[kv_cache_dtype]
    kv_memory = engine_args.kv_cache_bytes()
    gpu_memory = None if kv_memory is not None else _gpu_memory(args.gpu_memory)
    batched = engine_args.max_num_batched_tokens or default_max_num_batched_tokens(args.concurrency)
    return PlanInputs(
        shape,
        model_config,
        tp,
        pp,
        dtype_bytes,
        kv_dtype_bytes,
        engine_args.block_size,
        gpu_memory,
        engine_args.gpu_memory_utilization,
        kv_memory,
        batched,
        args.concurrency,
        request_tokens,
        linear_storage(model_config),
        _lora_bytes(engine_args, model_config, tp, dtype_bytes),
        model_config.cpu_offload_gb,
        encoder_cache_bytes=encoder_cache_bytes(model_config, batched, dtype_bytes),
    )


def _lora_bytes(engine_args: EngineArgs, model_config: ModelConfig, tp: int, dtype_bytes: int) -> int:
    """What the workers allocate for --enable-lora's slots (as the engine validates the flags)."""
    if not engine_args.enable_lora:
        return 0
    config = LoRAConfig.for_model(
        model_config,
        max_loras=engine_args.max_loras,
        max_lora_rank=engine_args.max_lora_rank,
    )
    slot = ModelShapes.of(model_config.hf_config).slot_elements(config.max_lora_rank, tp)
    return config.max_loras * slot * dtype_bytes


def _request_tokens(args: PlanArgs, max_model_len: int, image_tokens: int) -> int:
    output = args.output_tokens or 0
    text = args.input_tokens if args.input_tokens is not None else max_model_len - output - image_tokens
    total = text + image_tokens + output
    if total < 1 or total > max_model_len:
        raise ConfigError(
            f"--input-tokens + --image-tokens + --output-tokens = {total} must be between 1 and the model's "
            f"context, {max_model_len} tokens (--max-model-len)."
        )
    return total


def _gpu_memory(value: str | None) -> int:
    if value is not None:
        return parse_bytes(value, "--gpu-memory")
    import torch  # NOTE: only to read the local GPU's size

    if not torch.cuda.is_available():
        raise ConfigError(
            "No GPU is visible here: give the accelerator's memory with --gpu-memory (e.g. "
            "80GiB), or an explicit KV budget with --kv-cache-memory."
        )
    return torch.cuda.mem_get_info()[1]


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
