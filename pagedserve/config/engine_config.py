"""EngineConfig: every resolved engine setting, frozen and checked across its parts once; with the
device and CUDA-graph flags' resolution it is built from."""

import dataclasses
from dataclasses import dataclass
from typing import Literal, get_args

from pagedserve.config.cache import CacheConfig
from pagedserve.config.kv_layout import KVCacheLayout
from pagedserve.config.lora import LoRAConfig
from pagedserve.config.model import ModelConfig
from pagedserve.config.parallel import ParallelConfig, check_pipeline_features
from pagedserve.config.reasoning import ReasoningConfig
from pagedserve.config.scheduler import SchedulerConfig
from pagedserve.config.speculative import SpeculativeConfig
from pagedserve.errors import ConfigError
from pagedserve.families import family
from pagedserve.utils.gpu_probe import visible_gpu_count

Device = Literal["auto", "cpu", "cuda"]
# --attention-backend choices; each name but auto is registered in attention/backends/__init__.py.
AttentionBackendName = Literal["auto", "torch", "cpu", "triton"]
ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackendName)


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
