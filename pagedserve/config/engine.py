"""EngineArgs: every engine flag, vLLM's names (the CLI is generated from its fields; the parallelism and
image ones in their own base classes), resolved by create_engine_config() into the EngineConfig the whole
engine is built from."""

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from pagedserve.config.cache import BlockSize, CacheConfig, KVCacheDType
from pagedserve.config.cli import NamedValues, add_dataclass_cli_args, config_field, dataclass_from_cli_args
from pagedserve.config.engine_config import (
    AttentionBackendName,
    Device,
    EngineConfig,
    cuda_graph_capture_sizes,
    resolve_device,
)
from pagedserve.config.generation import generation_defaults
from pagedserve.config.lora_args import LoRAArgs
from pagedserve.config.media_args import MediaArgs
from pagedserve.config.model import DType, LoadFormat, ModelConfig, load_model_config
from pagedserve.config.parallel_args import ParallelArgs
from pagedserve.config.pooling import ConvertName, RunnerName
from pagedserve.config.quantization import (
    LinearBackendName,
    QuantizationName,
    resolve_linear_backend,
    resolve_quantization,
)
from pagedserve.config.reasoning import resolve_reasoning_config
from pagedserve.config.scheduler import (
    PreemptionMode,
    SchedulerConfig,
    SchedulingPolicy,
    default_max_num_batched_tokens,
)
from pagedserve.config.speculative import resolve_speculative_config
from pagedserve.config.vllm_compat_args import VllmCompatArgs
from pagedserve.errors import ConfigError
from pagedserve.reasoning import ReasoningParserName
from pagedserve.utils import parse_bytes
from pagedserve.utils.default_model import DEFAULT_MODEL_NAME
from pagedserve.utils.hub import is_hub_id, resolve_model_path

# EngineArgs' base classes: their flags follow its own in --help, each group under its heading.
_FLAG_GROUPS: dict[type, str] = {
    MediaArgs: "images",
    LoRAArgs: "LoRA adapters",
    VllmCompatArgs: "accepted for vLLM",
    ParallelArgs: "parallelism",
}


@dataclass
class EngineArgs(ParallelArgs, MediaArgs, LoRAArgs, VllmCompatArgs):
    """Every engine setting, with vLLM's names (the parallelism, image, LoRA and vLLM-only ones in base
    classes, each listed under its own heading in --help).
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
        grouped = {f.name for base in _FLAG_GROUPS for f in dataclasses.fields(base)}
        add_dataclass_cli_args(
            cls, parser, [f.name for f in dataclasses.fields(cls) if f.name not in grouped]
        )
        for base, title in _FLAG_GROUPS.items():
            add_dataclass_cli_args(base, parser.add_argument_group(title))

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        return dataclass_from_cli_args(cls, args)

    def create_engine_config(self) -> EngineConfig:
        """Resolve defaults and build every config (each validates itself). Raises ConfigError naming
        the flag."""
        device = resolve_device(self.device)
        # NOTE: the cheap checks first, so a bad flag is reported before the model's config is read.
        self.warn_vllm_only_settings()
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
        lora = self.lora_config(model)
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
            multimodal=self.multimodal_config(model.multimodal),
            batch_invariant=self.batch_invariant,
            cpu_offload_gb=self.cpu_offload_gb,
            quantization=resolve_quantization(self.quantization, model),
            linear_backend=resolve_linear_backend(self.linear_backend, device),
            generation_defaults=generation_defaults(
                self.generation_config, model.model, self.override_generation_config
            ),
        )
