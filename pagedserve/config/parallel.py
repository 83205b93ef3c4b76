"""How the model is split over ranks and how the ranks run (uni | mp | ray)."""

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from pagedserve.config.data_parallel import DataParallelBackend, check_data_parallel, check_ray_placement
from pagedserve.envs import pp_layer_partition
from pagedserve.errors import ConfigError
from pagedserve.families import DECODERS
from pagedserve.utils.gpu_probe import visible_gpu_count

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from pagedserve.config.model import ModelConfig

# --distributed-executor-backend choices; executor/__init__.py registers the same names.
ExecutorBackend = Literal["uni", "mp", "ray"]
EXECUTOR_BACKENDS: tuple[str, ...] = get_args(ExecutorBackend)
MAX_CPU_THREADS = 4096
MAX_DATA_PARALLEL_SIZE = 64
PP_LAYER_PARTITION_ENV = "PAGEDSERVE_PP_LAYER_PARTITION"  # envs.pp_layer_partition


@dataclass(frozen=True)
class ParallelConfig:
    """Validated parallelism settings. Raises ConfigError naming the flag to change."""

    tensor_parallel_size: int = 1
    distributed_executor_backend: ExecutorBackend = "uni"  # resolved: uni (in-process) | mp | ray
    distributed_timeout_s: float = 600.0  # longest a call to the workers (a step, a collective) may take
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    cpu_threads: int | None = None  # CPU: threads per rank (None: OMP_NUM_THREADS, else cores / (tp x dp))
    data_parallel_rank: int = 0  # which replica this engine is (set per engine process by its launcher)
    # Multi-node data parallelism (config/data_parallel.py checks them):
    data_parallel_size_local: int | None = None  # replicas on this node (None: all of them)
    data_parallel_start_rank: int = 0  # the first rank this node runs (--headless nodes)
    data_parallel_address: str | None = None  # the head's address, where remote replicas connect
    data_parallel_rpc_port: int | None = None  # the head's port for them (None: DEFAULT_RPC_PORT)
    data_parallel_backend: DataParallelBackend = "mp"  # mp: started per node; ray: placed by Ray
    headless: bool = False  # this node runs replicas only, for the head at data_parallel_address
    # NOTE: which replica on this node this engine is: it offsets the replica's GPUs.
    data_parallel_rank_local: int = 0

    def __post_init__(self) -> None:
        tp, pp, backend = (
            self.tensor_parallel_size,
            self.pipeline_parallel_size,
            self.distributed_executor_backend,
        )
        if pp < 1:
            raise ConfigError(f"pipeline_parallel_size={pp} must be at least 1 (--pipeline-parallel-size).")
        if not 1 <= self.data_parallel_size <= MAX_DATA_PARALLEL_SIZE:
            raise ConfigError(
                f"data_parallel_size={self.data_parallel_size} must be between 1 and {MAX_DATA_PARALLEL_SIZE} "
                "(--data-parallel-size: engine replicas in all, on every node)."
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
        if backend == "uni" and self.world_size > 1:
            raise ConfigError(
                f"--distributed-executor-backend uni runs one rank, but tensor_parallel_size={tp} x "
                f"pipeline_parallel_size={pp} needs {self.world_size}; use mp (this machine) or ray."
            )
        if backend == "ray" and importlib.util.find_spec("ray") is None:
            raise ConfigError(
                "--distributed-executor-backend ray needs Ray, which is not installed: "
                "pip install 'pagedserve[ray]'."
            )
        if self.data_parallel_size_local is None:
            object.__setattr__(self, "data_parallel_size_local", self.data_parallel_size)
        check_data_parallel(self)

    @property
    def local_replicas(self) -> int:
        """Data-parallel replicas on this node (they share its cores and GPUs)."""
        assert self.data_parallel_size_local is not None, "resolved in __post_init__"
        return self.data_parallel_size_local

    @property
    def remote_replicas(self) -> bool:
        """Whether some replicas connect over TCP (from other nodes, or Ray's actors)."""
        return self.data_parallel_backend == "ray" or self.local_replicas < self.data_parallel_size

    @property
    def world_size(self) -> int:
        """Ranks of one engine: tp per stage, pp stages (global rank = pp_rank * tp + tp_rank)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


def resolve_executor_backend(
    backend: ExecutorBackend | None, world_size: int, local_devices: int
) -> ExecutorBackend:
    """uni for one rank, mp when every rank has a device on this machine (`local_devices`), else ray."""
    if backend is None:
        return "uni" if world_size == 1 else "mp" if world_size <= local_devices else "ray"
    if backend == "mp" and world_size > local_devices:
        raise ConfigError(
            f"--distributed-executor-backend mp needs {world_size} GPUs on this machine, found "
            f"{local_devices}; lower --tensor-parallel-size / --pipeline-parallel-size or use "
            "--distributed-executor-backend ray across nodes."
        )
    return backend


@dataclass(frozen=True)
class PipelineStage:
    """The layers [start, end) one pipeline stage runs, of `num_stages`."""

    rank: int
    num_stages: int
    start: int
    end: int

    @property
    def is_first(self) -> bool:  # embeds the tokens
        return self.rank == 0

    @property
    def is_last(self) -> bool:  # the final norm, the LM head and the sampler
        return self.rank == self.num_stages - 1

    def holds(self, layer: int) -> bool:
        return self.start <= layer < self.end


def pipeline_stages(num_layers: int, pp: int) -> tuple[PipelineStage, ...]:
    """Contiguous stages of the model's layers: PAGEDSERVE_PP_LAYER_PARTITION's counts when set, else an
    even split whose extra layers go to the stages before the last (vLLM's rule: the last stage also
    computes the logits)."""
    if num_layers < pp:
        raise ConfigError(
            f"pipeline_parallel_size={pp} exceeds the model's {num_layers} layers; "
            "lower --pipeline-parallel-size."
        )
    partition = pp_layer_partition() if pp > 1 else None
    if partition is None:
        counts = [num_layers // pp] * pp
        for stage in range(num_layers % pp):
            counts[-2 - stage] += 1
    else:
        try:
            counts = [int(count) for count in partition.split(",")]
        except ValueError:
            counts = []
        if len(counts) != pp or sum(counts) != num_layers or min(counts) < 1:
            raise ConfigError(
                f"{PP_LAYER_PARTITION_ENV}={partition!r} must give {pp} positive layer counts (one per "
                f"stage of --pipeline-parallel-size {pp}) summing to num_hidden_layers={num_layers}."
            )
    starts = [sum(counts[:stage]) for stage in range(pp)]
    return tuple(
        PipelineStage(rank, pp, start, start + n) for rank, (start, n) in enumerate(zip(starts, counts))
    )


def check_pipeline_features(pp: int, pooling: bool) -> None:
    """Raises ConfigError for what pipeline stages do not run: a pooling model (every decoder family
    splits into stages, with LoRA and a draft model too)."""
    if pp > 1 and pooling:
        raise ConfigError(
            f"--pipeline-parallel-size {pp} does not serve pooling models (--runner pooling): a pooling "
            "step is one forward over whole prompts without a KV cache, run by one process; use "
            "--pipeline-parallel-size 1 (--tensor-parallel-size splits the model instead)."
        )


# The config fields of every family's MLP sizes: dense, experts' and the shared expert's.
_MLP_SIZE_FIELDS = tuple(
    dict.fromkeys(
        [
            *(family.mlp_size_field for family in DECODERS),
            *(family.moe.expert_size_field for family in DECODERS if family.moe is not None),
            "shared_expert_intermediate_size",
        ]
    )
)


def uneven_for_tensor_parallel(hf_config: "PretrainedConfig", tp: int) -> list[str]:
    """The model's sizes that `tp` ranks cannot split evenly (none: `tp` fits). Heads and the MLP must
    split evenly over the ranks; KV heads may instead be replicated."""
    kv_heads = (
        getattr(hf_config, "num_key_value_heads", None)
        or getattr(hf_config, "num_kv_heads", None)
        or hf_config.num_attention_heads
    )
    sizes = {"num_attention_heads": hf_config.num_attention_heads}
    for key in _MLP_SIZE_FIELDS:
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


def resolve_parallel_config(
    model: "ModelConfig", device: str, backend: ExecutorBackend | None, **settings: Any
) -> ParallelConfig:
    """The ParallelConfig of `settings` (its fields but the backend), checked against the model and this
    machine, with the executor backend resolved (`backend`: --distributed-executor-backend; None: from
    the ranks and the devices)."""
    tp, pp = settings["tensor_parallel_size"], settings["pipeline_parallel_size"]
    local = settings["data_parallel_size_local"]
    check_ray_placement(settings["data_parallel_backend"], local)
    dp = settings["data_parallel_size"] if local is None else local  # replicas on this machine
    if tp >= 1:
        check_tensor_parallel(model.hf_config, tp)
    devices = _local_devices(device, tp * pp)
    # NOTE: on CUDA every data-parallel replica here needs GPUs of its own: tp x pp x dp of them.
    if device == "cuda" and settings["data_parallel_backend"] == "mp" and dp > 1 and tp * pp * dp > devices:
        raise ConfigError(
            f"{dp} data-parallel replicas on this machine x --tensor-parallel-size {tp} x "
            f"--pipeline-parallel-size {pp} need {tp * pp * dp} GPUs, found {devices}; lower "
            "--data-parallel-size (or --data-parallel-size-local)."
        )
    return ParallelConfig(
        distributed_executor_backend=resolve_executor_backend(backend, tp * pp, devices), **settings
    )


def _local_devices(device: str, ranks: int) -> int:
    """Ranks this machine can hold: its GPUs, or any number of CPU ranks (they share the host)."""
    return visible_gpu_count() if device == "cuda" else ranks
