"""The interface the EngineCore drives, whatever runs the workers."""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal, Protocol, cast, overload

from pagedserve.config import EngineConfig
from pagedserve.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedserve.sizing import MemoryReport


class StepFuture(Protocol):
    """A step sent to the workers (`execute_model(..., non_block=True)`): `result()` waits for its sampled
    output. concurrent.futures.Future fits, so an executor may hand out its own kind of future."""

    def result(self) -> ModelRunnerOutput: ...


@dataclass(frozen=True)
class CompletedStep:
    """A step that already ran (an executor that cannot overlap steps runs it at once)."""

    output: ModelRunnerOutput

    def result(self) -> ModelRunnerOutput:
        return self.output


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

    @property
    def sampler_rank(self) -> int:
        """The rank that samples: the last pipeline stage's first (rank 0 at pp=1)."""
        parallel = self.config.parallel
        return parallel.world_size - parallel.tensor_parallel_size

    @overload
    def execute_model(
        self, scheduler_output: SchedulerOutput, non_block: Literal[False] = False
    ) -> ModelRunnerOutput: ...

    @overload
    def execute_model(self, scheduler_output: SchedulerOutput, non_block: Literal[True]) -> StepFuture: ...

    def execute_model(
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | StepFuture:
        """Run one step on every rank; the sampled tokens of the sampler rank come back. With `non_block`,
        return as soon as the step is on its way: a future of those tokens. Steps run on every rank in
        the order they were sent (pipeline micro-batches rely on it: a step sees every earlier step's KV
        writes), and their futures resolve in that order."""
        if non_block:
            return self._start_step(scheduler_output)
        return self._run_step(scheduler_output)

    def _run_step(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run a step on every rank and wait: the sampler rank's output."""
        output = self.collective_rpc(
            "execute_model", (scheduler_output,), unique_reply_rank=self.sampler_rank
        )
        return cast(ModelRunnerOutput, output[0])

    def _start_step(self, scheduler_output: SchedulerOutput) -> StepFuture:
        """Send a step without waiting for it; executors that can overlap steps override this."""
        return CompletedStep(self.execute_model(scheduler_output))

    def shutdown(self) -> None:
        """Release workers (processes, actors, a Ray instance started for the run). Idempotent."""
