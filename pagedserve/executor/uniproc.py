"""One worker in the engine's own process (tp=1)."""

from pagedserve.config import EngineConfig
from pagedserve.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedserve.executor.base import Executor
from pagedserve.worker.worker import Worker


class UniProcExecutor(Executor):
    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.worker = Worker(config)

    def collective_rpc(
        self, method: str, args: tuple[object, ...] = (), unique_reply_rank: int | None = None
    ) -> list[object]:
        return [getattr(self.worker, method)(*args)]

    def _run_step(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        # NOTE: the worker's step called directly: the RPC's lookups and list cost microseconds per step
        return self.worker.execute_model(scheduler_output)
