"""How the model is split over ranks and how the ranks run (uni | mp | ray)."""

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from pagedserve.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# --distributed-executor-backend choices; executor/__init__.py registers the same names.
ExecutorBackend = Literal["uni", "mp", "ray"]
EXECUTOR_BACKENDS: tuple[str, ...] = get_args(ExecutorBackend)
MAX_CPU_THREADS = 4096
MAX_DATA_PARALLEL_SIZE = 64


@dataclass(frozen=True)
class ParallelConfig:
    """Validated parallelism settings. Raises ConfigError naming the flag to change."""

    tensor_parallel_size: int = 1
    distributed_executor_backend: ExecutorBackend = "uni"  # resolved: uni (in-process) | mp | ray
    distributed_timeout_s: float = 600.0  # longest a call to the workers (a step, a collective) may take
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    cpu_threads: int | None = None  # CPU: threads per rank (None: OMP_NUM_THREADS, else cores / (tp x dp))
    data_parallel_rank: int = 0  # which replica this engine is (set per engine process by the DP client)

    def __post_init__(self) -> None:
        tp, backend = self.tensor_parallel_size, self.distributed_executor_backend
        if self.pipeline_parallel_size != 1:
            raise ConfigError(
                f"pipeline_parallel_size={self.pipeline_parallel_size} is not supported yet: "
                "use --pipeline-parallel-size 1 and split the model with "
                "--tensor-parallel-size instead."
            )
        if not 1 <= self.data_parallel_size <= MAX_DATA_PARALLEL_SIZE:
            raise ConfigError(
                f"data_parallel_size={self.data_parallel_size} must be between 1 and {MAX_DATA_PARALLEL_SIZE} "
                "(--data-parallel-size: engine replicas on this machine)."
            )
        if tp < 1:
            raise ConfigError(f"tensor_parallel_size={tp} must be at least 1 (--tensor-parallel-size).")
        if self.cpu_threads is not None and not 1 <= self.cpu_threads <= MAX_CPU_THREADS:
            raise ConfigError(
                f"cpu_threads={self.cpu_threads} must be between 1 and {MAX_CPU_THREADS} (--cpu-threads; "
                "leave it unset for one thread per physical core)."
            )
        if self.distributed_timeout_s <= 0:
            raise ConfigError(
                f"distributed_timeout={self.distributed_timeout_s} must be positive "
                "(--distributed-timeout, seconds)."
            )
        if backend not in EXECUTOR_BACKENDS:
            raise ConfigError(
                f"distributed_executor_backend={backend!r} is not supported; "
                f"--distributed-executor-backend must be one of {', '.join(EXECUTOR_BACKENDS)}."
            )
        if backend == "uni" and tp > 1:
            raise ConfigError(
                f"--distributed-executor-backend uni runs one rank, but tensor_parallel_size="
                f"{tp}; use mp (this machine) or ray."
            )
        if backend == "ray" and importlib.util.find_spec("ray") is None:
            raise ConfigError(
                "--distributed-executor-backend ray needs Ray, which is not installed: "
                "pip install 'pagedserve[ray]'."
            )


def resolve_executor_backend(backend: ExecutorBackend | None, tp: int, local_devices: int) -> ExecutorBackend:
    """uni at tp=1, mp when every rank has a device on this machine (`local_devices`), else ray."""
    if backend is None:
        return "uni" if tp == 1 else "mp" if tp <= local_devices else "ray"
    if backend == "mp" and tp > local_devices:
        raise ConfigError(
            f"--distributed-executor-backend mp needs {tp} GPUs on this machine, found "
            f"{local_devices}; lower --tensor-parallel-size or use "
            "--distributed-executor-backend ray across nodes."
        )
    return backend


def uneven_for_tensor_parallel(hf_config: "PretrainedConfig", tp: int) -> list[str]:
    """The model's sizes that `tp` ranks cannot split evenly (none: `tp` fits). Heads and the MLP must
    split evenly over the ranks; KV heads may instead be replicated."""
    kv_heads = (
        getattr(hf_config, "num_key_value_heads", None)
        or getattr(hf_config, "num_kv_heads", None)
        or hf_config.num_attention_heads
    )
    sizes = {"num_attention_heads": hf_config.num_attention_heads}
    for key in (
        "intermediate_size",
        "ffn_hidden_size",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
    ):  # the dense, Falcon, expert and shared-expert MLPs
        if getattr(hf_config, key, None):
            sizes[key] = getattr(hf_config, key)
    uneven = [f"{name}={size}" for name, size in sizes.items() if size % tp]
    if kv_heads % tp and tp % kv_heads:
        uneven.append(f"num_key_value_heads={kv_heads} (nor is {tp} a multiple of it)")
    return uneven


def check_tensor_parallel(hf_config: "PretrainedConfig", tp: int) -> None:
    """Raises ConfigError naming the sizes `tp` ranks cannot split."""
    uneven = uneven_for_tensor_parallel(hf_config, tp)
    if uneven:
        raise ConfigError(
            f"tensor_parallel_size={tp} does not divide the model's {', '.join(uneven)}; "
            "choose a --tensor-parallel-size that does."
        )
