"""Engine configuration: EngineArgs (user-facing, vLLM's names) -> frozen, validated EngineConfig.

CLI flags are generated from EngineArgs' fields, so every entry point accepts the same flags.
"""
import argparse
import dataclasses
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from pagedserve.errors import ConfigError
from pagedserve.logger import init_logger
from pagedserve.utils import parse_bytes
from pagedserve.utils.gguf_cache import gguf_hf_folder
from pagedserve.utils.default_model import DEFAULT_MODEL_NAME, default_model_path

logger = init_logger(__name__)

SUPPORTED_BLOCK_SIZES = (8, 16, 32)
SUPPORTED_DTYPES = ("auto", "float32", "float16", "bfloat16")
# model_type -> architecture: every supported family (models/<model_type>.py defines the class).
MODEL_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                       "qwen2": "Qwen2ForCausalLM"}
# --quantization names; each is registered in quantization/__init__.py. "none" loads a GGUF dequantized.
QUANTIZATION_METHODS = ("gguf", "int8", "int4")
# --kv-cache-dtype names (vLLM's): auto is the model's dtype; fp8 is fp8_e4m3.
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


@dataclass(frozen=True)
class ModelConfig:
    model: str  # folder, GGUF file or hub id
    gguf_file: str | None  # set when loading from a GGUF file
    hf_config: Any  # transformers.PretrainedConfig
    architecture: str
    dtype: str  # resolved: float32 | float16 | bfloat16
    max_model_len: int
    served_model_name: str
    seed: int
    load_format: str  # auto | dummy
    tokenizer: str | None
    max_logprobs: int
    quantization: str | None = None  # resolved: one of QUANTIZATION_METHODS, or None (unquantized)

    @property
    def vocab_size(self) -> int:
        return self.hf_config.vocab_size


@dataclass(frozen=True)
class CacheConfig:
    block_size: int
    gpu_memory_utilization: float
    kv_cache_memory: int | None  # bytes; explicit budget (the way to size on CPU)
    num_gpu_blocks_override: int | None
    enable_prefix_caching: bool = True
    swap_space_bytes: int = 0  # host memory per worker for swapped-out KV blocks
    cache_dtype: str = "auto"  # one of KV_CACHE_DTYPES
    calculate_kv_scales: bool = False  # fp8 KV: per-layer scales from the first batch, else 1.0


PREEMPTION_MODES = ("recompute", "swap")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    preemption_mode: str | None = None  # None: swap groups that share blocks, recompute the others


EXECUTOR_BACKENDS = ("uni", "mp", "ray")
# --attention-backend choices; each name but auto is registered in attention/backends/__init__.py.
ATTENTION_BACKENDS = ("auto", "torch", "cpu")


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    distributed_executor_backend: str = "uni"  # resolved: uni (in-process) | mp | ray
    distributed_timeout_s: float = 600.0  # longest a call to the workers (a step, a collective) may take


@dataclass(frozen=True)
class KVCacheConfig:
    """The sized KV cache: decided at startup from measured memory, never written into EngineConfig."""

    num_blocks: int  # including the reserved null block
    block_size: int
    bytes_per_block: int
    num_host_blocks: int = 0  # swap space, per worker

    @property
    def capacity_tokens(self) -> int:
        return (self.num_blocks - 1) * self.block_size


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    parallel: ParallelConfig
    device: str  # cpu | cuda
    enforce_eager: bool
    attention_backend: str = "auto"  # one of ATTENTION_BACKENDS; auto is resolved by the worker


def _arg(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class EngineArgs:
    """Every engine setting, with vLLM's names. `create_engine_config()` validates and resolves them."""

    model: str | None = _arg(None, "Model: HF folder, GGUF file or hub id. Default: the embedded "
                                   f"{DEFAULT_MODEL_NAME}.")
    tokenizer: str | None = _arg(None, "Tokenizer folder or id (default: the model's).")
    dtype: str = _arg("auto", "Weights and activations dtype. auto: the checkpoint's on GPU, float32 "
                              "on CPU.", choices=SUPPORTED_DTYPES)
    max_model_len: int | None = _arg(None, "Context length (prompt + output). Default: the model's.")
    block_size: int = _arg(16, "Tokens per KV-cache block.", choices=SUPPORTED_BLOCK_SIZES)
    gpu_memory_utilization: float = _arg(0.9, "Fraction of GPU memory for this engine (weights, "
                                               "activations, KV cache). Does not apply on CPU.")
    kv_cache_memory: str | None = _arg(None, "Explicit KV-cache budget, e.g. '4GiB'. On CPU the default "
                                             "is the smaller of 4 GiB and a quarter of free RAM.")
    num_gpu_blocks_override: int | None = _arg(None, "Use exactly this many KV blocks (for tests).")
    enable_prefix_caching: bool = _arg(True, "Reuse the KV blocks of earlier requests that start with the "
                                             "same tokens (automatic prefix caching).")
    swap_space: float = _arg(4.0, "Host memory (GiB) per worker for the KV blocks of preempted requests "
                                  "that are swapped out rather than recomputed.")
    preemption_mode: str | None = _arg(
        None, "What happens to preempted requests: recompute (drop their KV, compute it again later) or "
              "swap (copy it to --swap-space host memory). Default: swap for groups that share blocks "
              "(parallel samples, beams), recompute for single requests.", choices=PREEMPTION_MODES)
    max_num_seqs: int = _arg(256, "Maximum requests in one step.")
    max_num_batched_tokens: int | None = _arg(None, "Token budget of one step (default 2048, at least "
                                                    "max_num_seqs); longer prompts are chunked.")
    tensor_parallel_size: int = _arg(1, "Number of tensor-parallel ranks.")
    pipeline_parallel_size: int = _arg(1, "Number of pipeline-parallel stages. Only 1 is supported yet.")
    distributed_executor_backend: str | None = _arg(
        None, "How the ranks run: uni (this process, tp=1 only), mp (one process per rank on this "
              "machine) or ray (Ray actors, across the nodes of a Ray cluster). Default: uni at tp=1, mp "
              "when all ranks fit on this machine, else ray.", choices=EXECUTOR_BACKENDS)
    distributed_timeout: float = _arg(600.0, "Seconds one call to the workers (loading, a step, a "
                                             "collective) may take before the engine is declared dead.")
    quantization: str | None = _arg(
        None, "Weight quantization: gguf (a GGUF file's blocks kept quantized; the default for GGUF files), "
              "int8 / int4 (online, group-wise round-to-nearest of a float checkpoint), or none (a GGUF file "
              "dequantized). Default: what the checkpoint says (config.json's quantization_config, GGUF).",
        choices=(*QUANTIZATION_METHODS, "none"))
    kv_cache_dtype: str = _arg("auto", "KV-cache storage dtype. auto: the model's dtype; fp8 (= fp8_e4m3) "
                                       "and fp8_e5m2: 1 byte per value, with a per-layer scale.",
                               choices=KV_CACHE_DTYPES)
    calculate_kv_scales: bool = _arg(False, "fp8 KV cache: compute each layer's K and V scales from the "
                                            "first batch (else the checkpoint's, else 1.0).")
    seed: int = _arg(0, "Random seed for sampling without a per-request seed.")
    max_logprobs: int = _arg(20, "Largest logprobs / prompt_logprobs a request may ask for.")
    enforce_eager: bool = _arg(False, "Disable CUDA graphs.")
    served_model_name: str | None = _arg(None, "Model name in the API (default: the model argument).")
    load_format: str = _arg("auto", "auto: read the checkpoint; dummy: random weights.",
                            choices=("auto", "dummy"))
    device: str = _arg("auto", "auto | cpu | cuda.", choices=("auto", "cpu", "cuda"))
    attention_backend: str = _arg(
        "auto", "Attention kernels. auto: cpu on CPU when its native kernel builds, else torch; torch: "
                "plain PyTorch (the reference); cpu: native C++ decode kernel (CPU only).",
        choices=ATTENTION_BACKENDS)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "EngineArgs":
        """Build from keyword arguments; unknown names are an error, not silently dropped."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ConfigError(f"Unknown engine argument(s): {', '.join(unknown)}. "
                              f"Supported: {', '.join(sorted(names))}.")
        return cls(**kwargs)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        add_dataclass_cli_args(cls, parser)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        return dataclass_from_cli_args(cls, args)

    def create_engine_config(self) -> EngineConfig:
        """Validate every setting once and resolve defaults. Raises ConfigError naming the flag."""
        device = _resolve_device(self.device)
        model_config = self._model_config(device)
        if self.block_size not in SUPPORTED_BLOCK_SIZES:
            raise ConfigError(f"block_size={self.block_size} is not supported; --block-size must be one "
                              f"of {', '.join(map(str, SUPPORTED_BLOCK_SIZES))}.")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1] "
                              "(--gpu-memory-utilization).")
        if self.max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs={self.max_num_seqs} must be at least 1 (--max-num-seqs).")
        batched = self.max_num_batched_tokens or default_max_num_batched_tokens(self.max_num_seqs)
        if batched < 1:
            raise ConfigError(f"max_num_batched_tokens={batched} must be at least 1 "
                              "(--max-num-batched-tokens).")
        parallel = self._parallel_config(device, model_config.hf_config)
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 2:
            raise ConfigError("num_gpu_blocks_override must be at least 2 (one block is reserved).")
        kv_bytes = None if self.kv_cache_memory is None else parse_bytes(self.kv_cache_memory,
                                                                         "--kv-cache-memory")
        return EngineConfig(
            model=model_config,
            cache=CacheConfig(self.block_size, self.gpu_memory_utilization, kv_bytes,
                              self.num_gpu_blocks_override, self.enable_prefix_caching, self._swap_bytes(),
                              self._kv_cache_dtype(), self.calculate_kv_scales),
            scheduler=SchedulerConfig(self.max_num_seqs, batched, model_config.max_model_len,
                                      self.preemption_mode),
            parallel=parallel,
            device=device,
            enforce_eager=self.enforce_eager,
            attention_backend=self._attention_backend(device),
        )

    def _swap_bytes(self) -> int:
        if self.swap_space < 0:
            raise ConfigError(f"swap_space={self.swap_space} GiB must not be negative (--swap-space).")
        if self.preemption_mode not in (None, *PREEMPTION_MODES):
            raise ConfigError(f"preemption_mode={self.preemption_mode!r} is not supported; "
                              f"--preemption-mode must be one of {', '.join(PREEMPTION_MODES)}.")
        if self.preemption_mode == "swap" and self.swap_space == 0:
            raise ConfigError("--preemption-mode swap needs host memory to swap to: set --swap-space "
                              "(GiB) above 0, or use --preemption-mode recompute.")
        return int(self.swap_space * 2**30)

    def _kv_cache_dtype(self) -> str:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"kv_cache_dtype={self.kv_cache_dtype!r} is not supported; --kv-cache-dtype "
                              f"must be one of {', '.join(KV_CACHE_DTYPES)}.")
        return self.kv_cache_dtype

    def _attention_backend(self, device: str) -> str:
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"attention_backend={self.attention_backend!r} is not supported; "
                              f"--attention-backend must be one of {', '.join(ATTENTION_BACKENDS)}.")
        if self.attention_backend == "cpu" and device != "cpu":
            raise ConfigError(f"--attention-backend cpu runs on the CPU only, but the device is {device}; "
                              "use --attention-backend auto, or --device cpu.")
        return self.attention_backend

    def _parallel_config(self, device: str, hf_config: Any) -> ParallelConfig:
        tp = self.tensor_parallel_size
        if self.pipeline_parallel_size != 1:
            raise ConfigError(f"pipeline_parallel_size={self.pipeline_parallel_size} is not supported yet: "
                              "use --pipeline-parallel-size 1 and split the model with "
                              "--tensor-parallel-size instead.")
        if tp < 1:
            raise ConfigError(f"tensor_parallel_size={tp} must be at least 1 (--tensor-parallel-size).")
        if self.distributed_timeout <= 0:
            raise ConfigError(f"distributed_timeout={self.distributed_timeout} must be positive "
                              "(--distributed-timeout, seconds).")
        _check_tensor_parallel(hf_config, tp)
        return ParallelConfig(tp, _resolve_backend(self.distributed_executor_backend, tp, device),
                              float(self.distributed_timeout))

    def _model_config(self, device: str) -> ModelConfig:
        model = self.model
        if model is None:
            model = default_model_path()
            logger.info("No model given: using the embedded default %s (%s).", DEFAULT_MODEL_NAME, model)
        hf_config, gguf_file = _load_hf_config(model)
        archs = getattr(hf_config, "architectures", None) or [
            MODEL_ARCHITECTURES.get(hf_config.model_type, hf_config.model_type)]
        if archs[0] not in MODEL_ARCHITECTURES.values():
            raise ConfigError(f"Model architecture {archs[0]!r} is not supported. Supported architectures: "
                              f"{', '.join(sorted(MODEL_ARCHITECTURES.values()))}.")
        model_len = hf_config.max_position_embeddings
        window = _sliding_window(hf_config)
        if window and window < model_len:
            logger.info("Sliding-window attention is not implemented: context capped at the window, "
                        "%d tokens.", window)
            model_len = window
        max_model_len = self.max_model_len or model_len
        if max_model_len > model_len:
            key = "sliding_window" if model_len != hf_config.max_position_embeddings else \
                "max_position_embeddings"
            raise ConfigError(f"max_model_len={max_model_len} is larger than the model's "
                              f"{key}={model_len} (config.json); lower --max-model-len.")
        if max_model_len < 1:
            raise ConfigError(f"max_model_len={max_model_len} must be at least 1 (--max-model-len).")
        name = self.served_model_name or (DEFAULT_MODEL_NAME if self.model is None else self.model)
        return ModelConfig(model=model, gguf_file=gguf_file, hf_config=hf_config, architecture=archs[0],
                           dtype=_resolve_dtype(self.dtype, hf_config, device),
                           max_model_len=max_model_len, served_model_name=name, seed=self.seed,
                           load_format=self.load_format, tokenizer=self.tokenizer,
                           max_logprobs=self.max_logprobs,
                           quantization=self._quantization(hf_config, gguf_file, device))

    def _quantization(self, hf_config: Any, gguf_file: str | None, device: str) -> str | None:
        """--quantization, else what the checkpoint says; None is unquantized."""
        quant_config = getattr(hf_config, "quantization_config", None) or {}
        shipped = quant_config.get("quant_method") if isinstance(quant_config, dict) else \
            getattr(quant_config, "quant_method", None)
        detected = "gguf" if gguf_file else (str(shipped) if shipped else None)
        requested = self.quantization
        supported = f"{', '.join(QUANTIZATION_METHODS)} or none"
        if requested not in (None, "none", *QUANTIZATION_METHODS):
            raise ConfigError(f"quantization={requested!r} is not supported; --quantization must be one of "
                              f"{supported}.")
        if detected not in (None, "gguf") and detected not in QUANTIZATION_METHODS:
            raise ConfigError(f"The checkpoint is quantized with {detected!r} (config.json quantization_config), "
                              f"which pagedserve does not support; supported: {supported}.")
        if requested is None:
            if detected == "gguf" and (device != "cpu" or self.load_format == "dummy"):
                logger.info("GGUF weights are dequantized: the native GGUF kernels run on the CPU with "
                            "checkpoint weights only.")
                return None
            return detected
        if requested == "gguf" and not gguf_file:
            raise ConfigError("--quantization gguf needs a GGUF file (--model *.gguf).")
        if requested in QUANTIZATION_METHODS and device != "cpu":
            raise ConfigError(f"--quantization {requested} has CPU kernels only; use --device cpu, or "
                              "--quantization none (GGUF dequantized).")
        if requested in ("int8", "int4") and detected is not None:
            raise ConfigError(f"--quantization {requested} quantizes a float checkpoint, but this one is "
                              f"already {detected}; use --quantization none (GGUF) or leave it unset.")
        return None if requested == "none" else requested


def _sliding_window(hf_config: Any) -> int | None:
    if hf_config.model_type == "mistral" or getattr(hf_config, "use_sliding_window", False):
        return getattr(hf_config, "sliding_window", None)
    return None


def _check_tensor_parallel(hf_config: Any, tp: int) -> None:
    """Heads and the MLP must split evenly over the ranks; KV heads may instead be replicated."""
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    sizes = {"num_attention_heads": hf_config.num_attention_heads,
             "intermediate_size": hf_config.intermediate_size}
    uneven = [f"{name}={size}" for name, size in sizes.items() if size % tp]
    if kv_heads % tp and tp % kv_heads:
        uneven.append(f"num_key_value_heads={kv_heads} (nor is {tp} a multiple of it)")
    if uneven:
        raise ConfigError(f"tensor_parallel_size={tp} does not divide the model's {', '.join(uneven)}; "
                          "choose a --tensor-parallel-size that does.")


def _resolve_backend(backend: str | None, tp: int, device: str) -> str:
    """uni at tp=1, mp when every rank has a device on this machine, else ray."""
    import importlib.util

    import torch

    local_devices = torch.cuda.device_count() if device == "cuda" else tp  # CPU ranks share the host
    if backend is None:
        backend = "uni" if tp == 1 else "mp" if tp <= local_devices else "ray"
    if backend == "uni" and tp > 1:
        raise ConfigError(f"--distributed-executor-backend uni runs one rank, but tensor_parallel_size={tp}; "
                          "use mp (this machine) or ray.")
    if backend == "mp" and tp > local_devices:
        raise ConfigError(f"--distributed-executor-backend mp needs {tp} GPUs on this machine, found "
                          f"{local_devices}; lower --tensor-parallel-size or use "
                          "--distributed-executor-backend ray across nodes.")
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("--distributed-executor-backend ray needs Ray, which is not installed: "
                          "pip install 'pagedserve[ray]'.")
    return backend


def default_max_num_batched_tokens(max_num_seqs: int) -> int:
    """The step's token budget when --max-num-batched-tokens is not given."""
    return max(2048, max_num_seqs)


def add_dataclass_cli_args(cls: type, parser: argparse.ArgumentParser, only: Collection[str] | None = None
                           ) -> None:
    """One flag per field of the dataclass `cls` (or per field named in `only`), with vLLM's spelling
    (--max-model-len). Each field's metadata holds its `help` and, optionally, its `choices`; bool
    fields get --flag / --no-flag."""
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        flag = "--" + f.name.replace("_", "-")
        kwargs: dict[str, Any] = {"dest": f.name, "default": f.default, "help": f.metadata["help"]}
        if f.type is bool or f.type == "bool":
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = _cli_type(f.type)
            if "choices" in f.metadata:
                kwargs["choices"] = f.metadata["choices"]
        parser.add_argument(flag, **kwargs)


def dataclass_from_cli_args(cls: type, args: argparse.Namespace) -> Any:
    """The dataclass `cls` built from the flags `add_dataclass_cli_args` added."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def _cli_type(annotation: Any) -> Any:
    text = str(annotation)
    if "int" in text and "str" not in text:
        return int
    if "float" in text:
        return float
    return str


def _resolve_device(device: str) -> str:
    import torch  # NOTE: lazy, so core/ (which imports this module) stays free of torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for but no CUDA GPU is visible.")
    return device


def _resolve_dtype(dtype: str, hf_config: Any, device: str) -> str:
    if dtype not in SUPPORTED_DTYPES:
        raise ConfigError(f"dtype={dtype!r} is not supported; --dtype must be one of "
                          f"{', '.join(SUPPORTED_DTYPES)}.")
    if dtype != "auto":
        return dtype
    if device == "cpu":
        return "float32"
    checkpoint = str(getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None) or "")
    checkpoint = checkpoint.replace("torch.", "")
    return checkpoint if checkpoint in ("float16", "bfloat16") else "bfloat16"


def _load_hf_config(model: str) -> tuple[Any, str | None]:
    """config.json of a folder, the metadata of a GGUF file, or a hub id (offline cache)."""
    from transformers import AutoConfig

    gguf_file = None
    if model.endswith(".gguf"):
        if not os.path.isfile(model):
            raise ConfigError(f"GGUF file {model} does not exist (--model).")
        gguf_file = model
    elif os.path.isdir(model) and not os.path.isfile(os.path.join(model, "config.json")):
        ggufs = sorted(f for f in os.listdir(model) if f.endswith(".gguf"))
        if not ggufs:
            raise ConfigError(f"Model folder {model} has neither config.json nor a .gguf file (--model).")
        gguf_file = os.path.join(model, ggufs[0])
    try:
        if gguf_file:
            return AutoConfig.from_pretrained(gguf_hf_folder(gguf_file)), gguf_file
        return AutoConfig.from_pretrained(model), None
    except OSError as exc:
        raise ConfigError(f"Cannot load the model config of {model!r}: {exc}") from exc
