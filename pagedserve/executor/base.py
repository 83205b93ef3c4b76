"""The interface the EngineCore drives, whatever runs the workers."""
from abc import ABC, abstractmethod

from pagedserve.config import EngineConfig
from pagedserve.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedserve.platforms.memory import MemoryReport


class Executor(ABC):
    """Runs every rank's worker. Rank 0's output is the engine's."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    @abstractmethod
    def kv_cache_bytes_per_block(self) -> int:
        """Bytes of one KV block on one rank."""

    @abstractmethod
    def determine_kv_memory(self) -> MemoryReport:
        """The KV budget of the tightest rank."""

    @abstractmethod
    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate `num_blocks` blocks on every rank."""

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step on every rank."""

    def shutdown(self) -> None:
        """Release workers (processes, if any)."""


def get_executor_class(config: EngineConfig) -> type[Executor]:
    if config.parallel.tensor_parallel_size == 1:
        from pagedserve.executor.uniproc import UniProcExecutor

        return UniProcExecutor
    from pagedserve.errors import ConfigError

    raise ConfigError(f"tensor_parallel_size={config.parallel.tensor_parallel_size} is not supported yet; "
                      "use --tensor-parallel-size 1.")
