"""`pagedserve plan`'s inputs: the workload and accelerator flags (PlanArgs) and the engine flags the
plan shares, resolved from the model's config (no weights read) as the engine resolves them (PlanInputs).
"""

from dataclasses import dataclass, replace

from pagedserve.config import EngineArgs, ModelConfig, config_field, default_max_num_batched_tokens
from pagedserve.config.kv_layout import DTYPE_BYTES, KVCacheLayout
from pagedserve.config.lora import LoRAConfig
from pagedserve.config.parallel import PipelineStage, uneven_for_tensor_parallel
from pagedserve.entrypoints.plan_images import checked_image_tokens, encoder_cache_bytes
from pagedserve.entrypoints.plan_weights import (
    LinearStorage,
    gguf_weights_bytes,
    linear_storage,
    mmproj_weights_bytes,
    weights_bytes,
)
from pagedserve.errors import ConfigError
from pagedserve.lora.shapes import ModelShapes
from pagedserve.model_shape import ModelShape
from pagedserve.sizing import WeightBytes
from pagedserve.utils import parse_bytes

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
