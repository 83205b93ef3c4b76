"""Pipeline micro-batches: up to --pipeline-parallel-size scheduled batches in flight, so that while the
last stage computes one batch the earlier stages compute the next ones (vLLM's batch queue). Each step
schedules and sends a new batch while there is room, and waits for the oldest batch and applies its
output (the scheduler's update, in the order the batches went out) when the queue is full or nothing new
could go out. The scheduler keeps each request in at most one batch in flight (core/steps_in_flight.py);
the workers run the batches in the order they were sent, so a batch sees every earlier one's KV."""

from collections import deque
from collections.abc import Callable

from pagedserve.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedserve.core.scheduler import Scheduler
from pagedserve.executor.base import Executor, StepFuture
from pagedserve.protocol import EngineCoreOutput


class BatchQueue:
    """The batches in flight between the scheduler and a non-blocking executor. Driven by EngineCore.step."""

    def __init__(
        self,
        scheduler: Scheduler,
        executor: Executor,
        max_batches: int,
        wait_for_compile: Callable[[], None],
    ) -> None:
        self.scheduler, self.executor, self.max_batches = scheduler, executor, max_batches
        # NOTE: called when nothing runs and only grammars being compiled are left (not a busy loop)
        self._wait_for_compile = wait_for_compile
        self._batches: deque[tuple[SchedulerOutput, StepFuture]] = deque()  # in flight, oldest first

    def __len__(self) -> int:
        return len(self._batches)

    def step(self) -> tuple[list[EngineCoreOutput], SchedulerOutput | None]:
        """One engine step: the outputs applied, and the batch scheduled (None when the queue was full)."""
        outputs: list[EngineCoreOutput] = []
        scheduled = None
        if len(self._batches) < self.max_batches and self.scheduler.has_unfinished_requests():
            scheduled = self.scheduler.schedule()
            if scheduled.is_empty and not scheduled.has_block_ops and not scheduled.finished_req_ids:
                # NOTE: nothing for the workers (every request waits for its step in flight, for blocks or
                # for a grammar): applied at once, for the outputs of requests cut short.
                outputs = self.scheduler.update_from_output(scheduled, ModelRunnerOutput({}))
                if not self._batches:
                    self._wait_for_compile()
            else:
                self._batches.append((scheduled, self.executor.execute_model(scheduled, non_block=True)))
                if len(self._batches) < self.max_batches:
                    return outputs, scheduled  # room for another batch: schedule it before waiting
        if self._batches:
            oldest, future = self._batches.popleft()
            outputs += self.scheduler.update_from_output(oldest, future.result())
        return outputs, scheduled
