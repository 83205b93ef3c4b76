"""EngineArgs' parallelism flags (vLLM's names: tensor, pipeline and data parallelism, the data-parallel
nodes, the executor, CPU threads) and their resolution into a ParallelConfig."""

from dataclasses import dataclass

from pagedserve.config.cli import config_field
from pagedserve.config.data_parallel import DataParallelBackend
from pagedserve.config.model import ModelConfig
from pagedserve.config.parallel import ExecutorBackend, ParallelConfig, resolve_parallel_config


# NOTE: keyword-only, so that in EngineArgs' __init__ they come after its own fields: EngineArgs("model")
# still names the model.
@dataclass(kw_only=True)
class ParallelArgs:
    """The parallelism half of EngineArgs (its base class: the flags are one flat set)."""

    tensor_parallel_size: int = config_field(1, "Number of tensor-parallel ranks.", aliases=("-tp",))
    pipeline_parallel_size: int = config_field(
        1,
        "Number of pipeline-parallel stages (contiguous layers each, several batches in flight).",
        aliases=("-pp",),
    )
    data_parallel_size: int = config_field(
        1,
        "Engine replicas in all (each a full copy of the model, itself tp x pp ranks, in its own "
        "process); each request goes to the least loaded.",
        aliases=("-dp",),
    )
    data_parallel_size_local: int | None = config_field(
        None,
        "Replicas this node runs (default: all of --data-parallel-size); the head runs ranks 0 .. this - 1, "
        "the others connect from --headless nodes.",
        aliases=("-dpl",),
    )
    data_parallel_start_rank: int = config_field(
        0, "--headless: the first data-parallel rank this node runs.", aliases=("-dpr",)
    )
    data_parallel_address: str | None = config_field(
        None,
        "The head's address for replicas on other nodes: the head listens there (only), --headless nodes "
        "connect to it. Needs PAGEDSERVE_DATA_PARALLEL_SECRET on every node.",
        aliases=("-dpa",),
    )
    data_parallel_rpc_port: int | None = config_field(
        None,
        "The head's port for replicas on other nodes (default 29550; with --data-parallel-backend ray, "
        "any free port).",
        aliases=("-dpp",),
    )
    data_parallel_backend: DataParallelBackend = config_field(
        "mp",
        "mp: replicas are processes started on each node (the head's, and --headless nodes'); ray: Ray "
        "places them as actors on the cluster at RAY_ADDRESS, else on a private local Ray instance.",
        aliases=("-dpb",),
    )
    headless: bool = config_field(
        False,
        "Run engine replicas only (no API server), for the head at --data-parallel-address: ranks "
        "--data-parallel-start-rank .. + --data-parallel-size-local - 1.",
    )
    distributed_executor_backend: ExecutorBackend | None = config_field(
        None,
        "How the ranks run: uni (this process, tp=1 only), mp (one process per rank on this "
        "machine) or ray (Ray actors, across the nodes of a Ray cluster). Default: uni at tp=1, mp "
        "when all ranks fit on this machine, else ray.",
    )
    cpu_threads: int | None = config_field(
        None,
        "CPU: threads per rank for the matmuls and attention (one pool, started once). Default: "
        "OMP_NUM_THREADS if set (as llama.cpp's -t), else the physical cores shared by the ranks.",
    )
    distributed_timeout: float = config_field(
        600.0,
        "Seconds one call to the workers (loading, a step, a "
        "collective) may take before the engine is declared dead.",
    )

    def parallel_config(self, device: str, model: ModelConfig) -> ParallelConfig:
        return resolve_parallel_config(
            model,
            device,
            self.distributed_executor_backend,
            tensor_parallel_size=self.tensor_parallel_size,
            distributed_timeout_s=float(self.distributed_timeout),
            pipeline_parallel_size=self.pipeline_parallel_size,
            data_parallel_size=self.data_parallel_size,
            cpu_threads=self.cpu_threads,
            data_parallel_size_local=self.data_parallel_size_local,
            data_parallel_start_rank=self.data_parallel_start_rank,
            data_parallel_address=self.data_parallel_address,
            data_parallel_rpc_port=self.data_parallel_rpc_port,
            data_parallel_backend=self.data_parallel_backend,
            headless=self.headless,
        )
