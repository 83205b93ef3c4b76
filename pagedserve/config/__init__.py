"""Engine configuration, one module per concern: model, cache, scheduler, parallel, engine (EngineArgs),
engine_config (EngineConfig) and cli (dataclass fields -> flags). Every name users and tests import from
`pagedserve.config` stays importable from here."""

from pagedserve.config.cache import SUPPORTED_BLOCK_SIZES, BlockSize, CacheConfig, KVCacheConfig
from pagedserve.config.cli import add_dataclass_cli_args, config_field, dataclass_from_cli_args
from pagedserve.config.engine import EngineArgs
from pagedserve.config.engine_config import ATTENTION_BACKENDS, AttentionBackendName, Device, EngineConfig
from pagedserve.config.model import MODEL_ARCHITECTURES, SUPPORTED_DTYPES, DType, LoadFormat, ModelConfig
from pagedserve.config.parallel import EXECUTOR_BACKENDS, ExecutorBackend, ParallelConfig
from pagedserve.config.scheduler import (
    PREEMPTION_MODES,
    PreemptionMode,
    SchedulerConfig,
    default_max_num_batched_tokens,
)
from pagedserve.config.speculative import SpeculativeConfig

__all__ = [
    "ATTENTION_BACKENDS",
    "EXECUTOR_BACKENDS",
    "MODEL_ARCHITECTURES",
    "PREEMPTION_MODES",
    "SUPPORTED_BLOCK_SIZES",
    "SUPPORTED_DTYPES",
    "AttentionBackendName",
    "BlockSize",
    "CacheConfig",
    "DType",
    "Device",
    "EngineArgs",
    "EngineConfig",
    "ExecutorBackend",
    "KVCacheConfig",
    "LoadFormat",
    "ModelConfig",
    "ParallelConfig",
    "PreemptionMode",
    "SchedulerConfig",
    "SpeculativeConfig",
    "add_dataclass_cli_args",
    "config_field",
    "dataclass_from_cli_args",
    "default_max_num_batched_tokens",
]
