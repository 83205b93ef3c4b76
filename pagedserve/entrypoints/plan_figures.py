"""`pagedserve plan`'s figures: the engine's sizing arithmetic (sizing.py) on the resolved inputs, per
rank and pipeline stage (Plan)."""

from dataclasses import dataclass

from pagedserve.config import KVCacheConfig
from pagedserve.config.parallel import PipelineStage
from pagedserve.entrypoints.plan_inputs import PlanInputs
from pagedserve.sizing import (
    choose_offloaded_layers,
    gpu_kv_budget,
    kv_cache_config,
    max_concurrency,
    max_full_requests,
)

# Memory a GPU engine uses outside torch's allocator (NCCL buffers, cuBLAS workspaces): an estimate.
NON_TORCH_BYTES = 512 * 2**20


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
