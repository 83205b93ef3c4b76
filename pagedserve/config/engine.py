"""EngineArgs (every engine flag, vLLM's names; the CLI is generated from its fields) -> the frozen,
validated EngineConfig the whole engine is built from."""

import argparse
import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pagedserve.config.cache import BlockSize, CacheConfig, KVCacheDType
from pagedserve.config.cli import NamedValues, add_dataclass_cli_args, config_field, dataclass_from_cli_args
from pagedserve.config.generation import generation_defaults
from pagedserve.config.kv_layout import KVCacheLayout
from pagedserve.config.lora import LoRAConfig
from pagedserve.config.model import DType, LoadFormat, ModelConfig, load_model_config
from pagedserve.config.multimodal import MultiModalConfig, parse_limit_mm_per_prompt
from pagedserve.config.parallel import ParallelConfig, check_pipeline_features
from pagedserve.config.parallel_args import ParallelArgs
from pagedserve.config.pooling import ConvertName, RunnerName
from pagedserve.config.quantization import (
    LinearBackendName,
    QuantizationName,
    resolve_linear_backend,
    resolve_quantization,
)
from pagedserve.config.reasoning import ReasoningConfig, resolve_reasoning_config
from pagedserve.config.scheduler import (
    PreemptionMode,
    SchedulerConfig,
    SchedulingPolicy,
    default_max_num_batched_tokens,
)
from pagedserve.config.speculative import SpeculativeConfig, resolve_speculative_config
from pagedserve.errors import ConfigError
from pagedserve.families import family
from pagedserve.logger import init_logger
from pagedserve.reasoning import ReasoningParserName
from pagedserve.utils import parse_bytes
from pagedserve.utils.default_model import DEFAULT_MODEL_NAME
from pagedserve.utils.gpu_probe import visible_gpu_count
from pagedserve.utils.hub import is_hub_id, resolve_model_path

Device = Literal["auto", "cpu", "cuda"]
# --attention-backend choices; each name but auto is registered in attention/backends/__init__.py.
AttentionBackendName = Literal["auto", "torch", "cpu", "triton"]
ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackendName)

logger = init_logger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    """Every resolved setting, validated once; passed whole to the engine's components."""

    model: ModelConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    parallel: ParallelConfig
    device: str  # resolved: cpu | cuda
    enforce_eager: bool
    attention_backend: AttentionBackendName = "auto"  # auto is resolved by the worker's platform
    cuda_graph_sizes: tuple[int, ...] = ()  # decode batch sizes captured in CUDA graphs, ascending
    speculative: SpeculativeConfig | None = None
    lora: LoRAConfig | None = None  # --enable-lora
    reasoning: ReasoningConfig | None = None  # --reasoning-parser
    # Computed once from the configs above; every part that sizes, allocates or counts blocks reads it.
    kv_layout: KVCacheLayout = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        draft = None if self.speculative is None else self.speculative.draft_model_config
        layout = KVCacheLayout.for_engine(
            self.model,
            self.cache,
            self.parallel.tensor_parallel_size,
            self.scheduler.max_num_batched_tokens,
            draft,
            self.parallel.pipeline_parallel_size,
        )
        object.__setattr__(self, "kv_layout", layout)
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(
                f"device={self.device!r} is not supported; --device must be one of "
                f"{', '.join(get_args(Device))}."
            )
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(
                f"attention_backend={self.attention_backend!r} is not supported; "
                f"--attention-backend must be one of {', '.join(ATTENTION_BACKENDS)}."
            )
        if self.attention_backend == "cpu" and self.device != "cpu":
            raise ConfigError(
                f"--attention-backend cpu runs on the CPU only, but the device is "
                f"{self.device}; use --attention-backend auto, or --device cpu."
            )
        if self.scheduler.preemption_mode == "swap" and self.cache.swap_space == 0:
            raise ConfigError(
                "--preemption-mode swap needs host memory to swap to: set --swap-space "
                "(GiB) above 0, or use --preemption-mode recompute."
            )
        check_pipeline_features(self.parallel.pipeline_parallel_size, self.model.pooling is not None)
        if self.model.multimodal is not None and self.parallel.pipeline_parallel_size > 1:
            raise ConfigError(
                f"{self.model.architecture} takes images, which do not run at --pipeline-parallel-size > 1 "
                "yet: use --tensor-parallel-size instead."
            )
        facts = family(self.model.architecture)
        drafts = self.speculative is not None and self.speculative.draft_model_config is not None
        if drafts and facts is not None and facts.mrope:
            raise ConfigError(
                f"{self.model.architecture} rotates 3-D positions (M-RoPE), which a draft model does not "
                'take yet: use n-gram speculation in --speculative-config ({"method": "ngram", ...}).'
            )


@dataclass
class EngineArgs(ParallelArgs):
    """Every engine setting, with vLLM's names (the parallelism ones in ParallelArgs).
    `create_engine_config()` validates and resolves them."""

    model: str | None = config_field(
        None,
        f"Model: HF folder, GGUF file or hub id. Default: the embedded {DEFAULT_MODEL_NAME}. The server "
        "also takes NAME=PATH, repeatable: each model served under its name, loaded on demand.",
        action=NamedValues,
    )
    tokenizer: str | None = config_field(None, "Tokenizer folder or id (default: the model's).")
    dtype: DType = config_field(
        "auto", "Weights and activations dtype. auto: the checkpoint's on GPU, float32 on CPU."
    )
    max_model_len: int | None = config_field(None, "Context length (prompt + output). Default: the model's.")
    block_size: BlockSize = config_field(16, "Tokens per KV-cache block.")
    gpu_memory_utilization: float = config_field(
        0.9, "Fraction of GPU memory for this engine (weights, activations, KV cache). Does not apply on CPU."
    )
    kv_cache_memory: str | None = config_field(
        None,
        "Explicit KV-cache budget, e.g. '4GiB'. On CPU the "
        "default is the smaller of 4 GiB and a quarter of free RAM.",
    )
    kv_cache_memory_bytes: int | None = config_field(
        None, "vLLM's name for --kv-cache-memory, in bytes (give one of the two)."
    )
    num_gpu_blocks_override: int | None = config_field(None, "Use exactly this many KV blocks (for tests).")
    enable_prefix_caching: bool = config_field(
        True,
        "Reuse the KV blocks of earlier requests that start with the same tokens (automatic prefix caching).",
    )
    batch_invariant: bool = config_field(
        True,
        "A token's logits the same bits whatever shares its step, however its prompt was chunked (CPU: "
        "float32 and the GGUF default). --no-batch-invariant gives that up for float32 prefill speed on "
        "CPU: linear layers take oneDNN's GEMM, whose sums depend on the number of rows in the step.",
    )
    cpu_offload_gb: float = config_field(
        0.0,
        "GiB of weights kept in pinned host memory (vLLM's flag): whole decoder layers from the last, each "
        "copied to the device one layer ahead of its use, so a model this much larger than the GPU's share "
        "runs (slower: every step reads those weights over PCIe). Quantized weights travel packed.",
    )
    swap_space: float = config_field(
        4.0,
        "Host memory (GiB) per worker for the KV blocks of preempted "
        "requests that are swapped out rather than recomputed.",
    )
    preemption_mode: PreemptionMode | None = config_field(
        None,
        "What happens to preempted requests: recompute (drop their KV, compute it again later) or "
        "swap (copy it to --swap-space host memory). Default: swap for groups that share blocks "
        "(parallel samples, beams), recompute for single requests.",
    )
    scheduling_policy: SchedulingPolicy = config_field(
        "fcfs",
        "fcfs: requests are admitted in arrival order and the newest is preempted first. priority: each "
        "request's `priority` (lower first; ties by arrival) orders admission and swap-in, the least "
        "urgent running request is preempted first (vLLM V1's rule), and a waiting request that does not "
        "fit preempts running ones of a larger priority value (as vLLM V0 did).",
    )
    max_num_seqs: int = config_field(256, "Maximum requests in one step.")
    max_num_batched_tokens: int | None = config_field(
        None, "Token budget of one step (default 2048, at least max_num_seqs); longer prompts are chunked."
    )
    quantization: QuantizationName | None = config_field(
        None,
        "Weight quantization: gguf (a GGUF file's blocks kept quantized; the default for GGUF files), "
        "int8 / int4 (online, group-wise round-to-nearest of a float checkpoint), or none (a GGUF file "
        "dequantized). Default: what the checkpoint says (config.json's quantization_config, GGUF).",
    )
    kv_cache_dtype: KVCacheDType = config_field(
        "auto",
        "KV-cache storage dtype. auto: the model's dtype; bfloat16: two bytes per value (half a float32 "
        "model's cache, the same blocks as auto for a 16-bit one); fp8 (= fp8_e4m3) and fp8_e5m2: one byte "
        "per value with a per-layer scale (2x the blocks of float16/bfloat16, 4x float32).",
    )
    calculate_kv_scales: bool = config_field(
        False, "fp8 KV cache: compute each layer's K and V scales from the first batch (else 1.0)."
    )
    seed: int = config_field(0, "Random seed for sampling without a per-request seed.")
    max_logprobs: int = config_field(20, "Largest logprobs / prompt_logprobs a request may ask for.")
    enforce_eager: bool = config_field(False, "Disable CUDA graphs (decode steps then run eagerly).")
    cuda_graph_sizes: str = config_field(
        "512",
        "Decode batch sizes to capture in CUDA graphs (vLLM's): one number N captures 1, 2, 4 and "
        "every multiple of 8 up to N; several (comma-separated) capture exactly those. "
        "Capped at --max-num-seqs; larger decode batches run eagerly.",
    )
    served_model_name: str | list[str] | None = config_field(
        None,
        "Model name(s) in the API, one or more (--served-model-name a b): /v1/models lists them all, a "
        "request may name any, responses report the first. Default: the model argument.",
    )
    load_format: LoadFormat = config_field("auto", "auto: read the checkpoint; dummy: random weights.")
    device: Device = config_field("auto", "auto | cpu | cuda.")
    attention_backend: AttentionBackendName = config_field(
        "auto",
        "Attention kernels. auto: cpu on CPU when its native kernel builds, else torch; triton on "
        "CUDA; torch: plain PyTorch (the reference); cpu: native C++ decode kernel (CPU only); "
        "triton: Triton kernels (CUDA), mixed prefill+decode batches, split-K decode.",
    )
    linear_backend: LinearBackendName = config_field(
        "auto",
        "Kernels of quantized linear layers, embeddings and experts (GGUF, int8/int4, GPTQ/AWQ), on the "
        "stored blocks. auto: native on CPU, triton on CUDA; native: C++ kernels (CPU only); triton: Triton "
        "kernels (CUDA, or CPU under TRITON_INTERPRET=1); torch: dequantize each step with torch ops (the "
        "reference, any device).",
    )
    # NOTE: a JSON string on the command line; from Python a dict works too.
    speculative_config: str | None = config_field(
        None,
        'Speculative decoding, JSON: {"method": "ngram", "num_speculative_tokens": 4, '
        '"prompt_lookup_max": 4, "prompt_lookup_min": 2} (prompt lookup) or {"model": DRAFT, '
        '"num_speculative_tokens": 3} (a draft model with the same tokenizer). Greedy outputs stay '
        "identical; sampled ones keep their distribution.",
    )
    generation_config: str = config_field(
        "auto",
        "Sampling defaults for requests that leave a field unset (temperature, top_p, top_k, min_p, "
        "repetition_penalty, max_new_tokens as max_tokens): auto reads the model folder's "
        "generation_config.json, vllm uses pagedserve's own defaults, a folder reads its "
        "generation_config.json.",
    )
    override_generation_config: str | None = config_field(
        None, "JSON merged over --generation-config's defaults, e.g. '{\"temperature\": 0.5}'."
    )
    # vLLM's flags that change nothing here; accepted so that vLLM command lines run as written.
    enable_chunked_prefill: bool | None = config_field(
        None,
        "Accepted for vLLM: chunked prefill is always on here (a prompt longer than "
        "--max-num-batched-tokens is split across steps); --no-enable-chunked-prefill only warns.",
    )
    trust_remote_code: bool = config_field(
        False, "Accepted for vLLM: pagedserve never runs a model's own Python code (a warning says so)."
    )
    revision: str | None = config_field(
        None, "Hub revision (branch, tag or commit) of a hub id --model. Default: main."
    )
    tokenizer_revision: str | None = config_field(None, "Hub revision of a hub id --tokenizer.")
    hf_config_path: str | None = config_field(
        None,
        "Folder or hub id (at --revision) whose config.json describes the model, instead of the model's "
        "own; e.g. the original model's for a GGUF --model.",
    )
    mmproj: str | None = config_field(
        None,
        "llama.cpp's mmproj GGUF (vision tower and projector) for a Gemma 3 or Qwen2.5-VL GGUF --model: "
        "the model takes images.",
    )
    runner: RunnerName = config_field(
        "auto",
        "generate: sample tokens. pooling: embeddings and scores (/v1/embeddings, /pooling, /classify, "
        "/score, /rerank), one forward per prompt, no KV cache kept. auto: pooling for encoders (BERT, "
        "RoBERTa), generate for decoders.",
    )
    convert: ConvertName = config_field(
        "auto",
        "With --runner pooling: embed (a decoder or encoder used as an embedder) or classify (a "
        "*ForSequenceClassification head). auto: classify for classification heads, else embed.",
    )
    pooler_config: str | None = config_field(
        None,
        'With --runner pooling, JSON over the model\'s own pooling: {"pooling_type": "MEAN"|"CLS"|"LAST", '
        '"normalize": true, "activation": true}. Default: sentence-transformers\' modules.json and '
        "1_Pooling, else CLS for encoders and LAST for decoders, normalized.",
    )
    enable_lora: bool = config_field(
        False, "Serve LoRA adapters over the base model (--lora-modules, lora_request)."
    )
    max_loras: int = config_field(
        1, "--enable-lora: the most adapters in one step (each takes a slot of weights)."
    )
    max_lora_rank: int = config_field(
        16, "--enable-lora: the largest adapter rank (every slot is this wide)."
    )
    max_cpu_loras: int | None = config_field(
        None,
        "--enable-lora: adapters kept read in host memory, least recently used evicted (default --max-loras).",
    )
    reasoning_parser: ReasoningParserName | None = config_field(
        None,
        "A thinking model's tags: chat completions return its thinking as message.reasoning, structured "
        "outputs and tool calls apply from the end of thinking, and thinking_token_budget is enforced.",
    )
    thinking_token_budget: int | None = config_field(
        None,
        "With --reasoning-parser: the most thinking tokens of a request that sets no thinking_token_budget; "
        "then the end-of-thinking token is forced and the answer follows. Default: no limit.",
    )
    limit_mm_per_prompt: str | None = config_field(
        None, 'Image models: the most images in one prompt, JSON {"image": N} (default 8; 0 refuses images).'
    )
    allowed_media_domains: str | list[str] | None = config_field(
        None, "Image models: the only hosts http(s) image URLs may name (default: any host)."
    )
    allowed_local_media_path: str | None = config_field(
        None, "Image models: file:// image URLs are read only under this folder (default: refused)."
    )
    media_fetch_timeout: float = config_field(
        5.0, "Image models: seconds an http(s) image may take to download, all of it."
    )
    max_media_bytes: str = config_field(
        "20MiB", "Image models: the largest image file (download, data: URL or file) accepted."
    )
    download_dir: str | None = config_field(
        None,
        "Hugging Face cache folder for hub ids (default: HF_HUB_CACHE's). With HF_HUB_OFFLINE=1 models are "
        "read from it, never downloaded.",
    )

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "EngineArgs":
        """Build from keyword arguments; unknown names are an error, not silently dropped."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ConfigError(
                f"Unknown engine argument(s): {', '.join(unknown)}. Supported: {', '.join(sorted(names))}."
            )
        return cls(**kwargs)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        parallel = {f.name for f in dataclasses.fields(ParallelArgs)}
        add_dataclass_cli_args(
            cls, parser, [f.name for f in dataclasses.fields(cls) if f.name not in parallel]
        )
        add_dataclass_cli_args(ParallelArgs, parser.add_argument_group("parallelism"))

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        return dataclass_from_cli_args(cls, args)

    def create_engine_config(self) -> EngineConfig:
        """Resolve defaults and build every config (each validates itself). Raises ConfigError naming
        the flag."""
        device = resolve_device(self.device)
        # NOTE: the cheap checks first, so a bad flag is reported before the model's config is read.
        self._check_vllm_only_settings()
        cache = CacheConfig(
            self.block_size,
            self.gpu_memory_utilization,
            self.kv_cache_bytes(),
            self.num_gpu_blocks_override,
            self.enable_prefix_caching,
            self.swap_space,
            self.kv_cache_dtype,
            self.calculate_kv_scales,
        )
        model = self.model_config(device)
        limits = dict(
            max_loras=self.max_loras, max_lora_rank=self.max_lora_rank, max_cpu_loras=self.max_cpu_loras
        )
        lora = LoRAConfig.for_model(model, **limits) if self.enable_lora else None
        scheduler = SchedulerConfig(
            self.max_num_seqs,
            self.max_num_batched_tokens
            or default_max_num_batched_tokens(
                self.max_num_seqs, model.max_model_len, model.pooling is not None
            ),
            model.max_model_len,
            self.preemption_mode,
            self.scheduling_policy,
            pooling=model.pooling is not None,
            max_loras=None if lora is None else lora.max_loras,
            whole_image_tokens=None
            if model.multimodal is None
            else model.multimodal.bidirectional_image_tokens,
        )
        parallel = self.parallel_config(device, model)
        return EngineConfig(
            model=model,
            cache=cache,
            scheduler=scheduler,
            parallel=parallel,
            device=device,
            enforce_eager=self.enforce_eager,
            attention_backend=self.attention_backend,
            speculative=resolve_speculative_config(
                self.speculative_config, model, device, parallel.tensor_parallel_size, self.download_dir
            ),
            cuda_graph_sizes=cuda_graph_capture_sizes(self.cuda_graph_sizes, scheduler.max_num_seqs),
            lora=lora,
            reasoning=resolve_reasoning_config(self.reasoning_parser, model, self.thinking_token_budget),
        )

    def kv_cache_bytes(self) -> int | None:
        """The explicit KV budget (--kv-cache-memory or --kv-cache-memory-bytes), None when neither."""
        if self.kv_cache_memory is not None and self.kv_cache_memory_bytes is not None:
            raise ConfigError(
                "--kv-cache-memory and --kv-cache-memory-bytes both set the KV-cache budget: give one."
            )
        if self.kv_cache_memory_bytes is not None:
            return self.kv_cache_memory_bytes
        return (
            None if self.kv_cache_memory is None else parse_bytes(self.kv_cache_memory, "--kv-cache-memory")
        )

    def _check_vllm_only_settings(self) -> None:
        """Warn about vLLM's settings that change nothing here."""
        if self.trust_remote_code:
            logger.warning(
                "trust_remote_code (--trust-remote-code) is accepted but has no effect: pagedserve never "
                "runs a model's own Python code; its architecture must be one pagedserve implements."
            )
        if self.enable_chunked_prefill is False:
            logger.warning(
                "--no-enable-chunked-prefill has no effect: chunked prefill is always on here (prompts "
                "longer than --max-num-batched-tokens are split across steps)."
            )

    def model_config(self, device: str) -> ModelConfig:
        """The model's settings as they resolve on `device` (reads its config, never its weights)."""
        # NOTE: hub ids become local paths here, once: the engine's processes get the paths.
        hub_model = self.model is not None and is_hub_id(self.model)
        model = load_model_config(
            self.model and resolve_model_path(self.model, self.revision, self.download_dir),
            dtype=self.dtype,
            device=device,
            max_model_len=self.max_model_len,
            served_model_name=self.served_model_name or (self.model if hub_model else None),
            seed=self.seed,
            load_format=self.load_format,
            tokenizer=self.tokenizer
            and resolve_model_path(self.tokenizer, self.tokenizer_revision, self.download_dir, "--tokenizer"),
            max_logprobs=self.max_logprobs,
            hf_config_path=self.hf_config_path
            and resolve_model_path(self.hf_config_path, self.revision, self.download_dir, "--hf-config-path"),
            runner=self.runner,
            convert=self.convert,
            pooler_config=self.pooler_config,
            mmproj=self.mmproj,
        )
        return dataclasses.replace(
            model,
            multimodal=self._multimodal(model.multimodal),
            batch_invariant=self.batch_invariant,
            cpu_offload_gb=self.cpu_offload_gb,
            quantization=resolve_quantization(self.quantization, model),
            linear_backend=resolve_linear_backend(self.linear_backend, device),
            generation_defaults=generation_defaults(
                self.generation_config, model.model, self.override_generation_config
            ),
        )

    def _multimodal(self, multimodal: MultiModalConfig | None) -> MultiModalConfig | None:
        """The image bounds of an image model (None for a text model, which refuses images)."""
        if multimodal is None:
            return None
        domains = self.allowed_media_domains
        return dataclasses.replace(
            multimodal,
            max_images_per_prompt=parse_limit_mm_per_prompt(self.limit_mm_per_prompt),
            allowed_media_domains=None
            if domains is None
            else tuple([domains] if isinstance(domains, str) else domains),
            allowed_local_media_path=self.allowed_local_media_path
            and os.path.realpath(self.allowed_local_media_path),
            fetch_timeout_s=self.media_fetch_timeout,
            max_media_bytes=parse_bytes(self.max_media_bytes, "--max-media-bytes"),
        )


def cuda_graph_capture_sizes(sizes: str | list[int], max_num_seqs: int) -> tuple[int, ...]:
    """--cuda-graph-sizes resolved as vLLM does: [N] -> 1, 2, 4, 8, 16, ..., N (multiples of 8); several
    sizes -> those; then capped at max_num_seqs (no decode batch is larger; it becomes the largest size)."""
    try:
        values = [int(v) for v in (sizes.split(",") if isinstance(sizes, str) else sizes)]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ConfigError(
            f"cuda_graph_sizes={sizes!r} must be positive integers, e.g. 512 or 1,2,4,8 (--cuda-graph-sizes)."
        )
    if len(values) == 1:
        values = [v for v in (1, 2, 4) if v <= values[0]] + list(range(8, values[0] + 1, 8))
    capped = {v for v in values if v <= max_num_seqs}
    if max(values) > max_num_seqs:
        capped.add(max_num_seqs)
    return tuple(sorted(capped))


def resolve_device(device: str) -> str:
    """auto -> cuda when a GPU is visible, else cpu. Raises ConfigError for cuda without a GPU. Probed
    without torch (utils/gpu_probe.py), so the API server resolves its settings without importing it."""
    if device == "auto":
        return "cuda" if visible_gpu_count() > 0 else "cpu"
    if device == "cuda" and visible_gpu_count() == 0:
        raise ConfigError("--device cuda was asked for but no CUDA GPU is visible.")
    if device not in ("cpu", "cuda"):
        raise ConfigError(
            f"device={device!r} is not supported; --device must be one of {', '.join(get_args(Device))}."
        )
    return device
