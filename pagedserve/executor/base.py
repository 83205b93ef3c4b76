"""The interface the EngineCore drives, whatever runs the workers."""

from abc import ABC, abstractmethod
from typing import cast

from pagedserve.config import EngineConfig
from pagedserve.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedserve.sizing import MemoryReport


class Executor(ABC):
    """Runs every rank's worker in lockstep. The output of the last pipeline stage's first rank is the
    engine's (only it samples)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    @abstractmethod
    def collective_rpc(
        self, method: str, args: tuple[object, ...] = (), unique_reply_rank: int | None = None
    ) -> list[object]:
        """Call `Worker.<method>(*args)` on every rank at once and return the results in rank order; with
        `unique_reply_rank`, only that rank's result is sent back (a one-item list), the others only
        acknowledge. Raises EngineDeadError naming the rank when a worker died, raised, or did not answer
        within --distributed-timeout (the executor is then dead: every later call raises it again);
        a ConfigError raised by a worker passes through unchanged. A result is what the Worker method
        returns: the typed calls below cast to its return type."""

    def determine_kv_memory(self) -> list[MemoryReport]:
        """Every rank's KV budget, in rank order (sizing.size_kv_cache takes the tightest)."""
        return cast(list[MemoryReport], self.collective_rpc("determine_kv_memory"))

    def initialize_kv_cache(self, num_blocks: int, num_host_blocks: int = 0) -> None:
        """Allocate `num_blocks` device blocks, and `num_host_blocks` host blocks of swap space, on every
        rank."""
        self.collective_rpc("initialize_kv_cache", (num_blocks, num_host_blocks))

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step on every rank; the sampled tokens of the last pipeline stage's first rank (rank 0
        at pp=1) come back."""
        parallel = self.config.parallel
        sampler_rank = parallel.world_size - parallel.tensor_parallel_size
        output = self.collective_rpc("execute_model", (scheduler_output,), unique_reply_rank=sampler_rank)[0]
        return cast(ModelRunnerOutput, output)

    def shutdown(self) -> None:
        """Release workers (processes, actors, a Ray instance started for the run). Idempotent."""
