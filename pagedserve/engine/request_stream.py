"""One submitted request's outputs as the server reads them: an async iterator that keeps the request's
deadlines (--max-queue-time: a 503; its `timeout` / --request-timeout: aborted, finish_reason "abort") and
that aborts the request in the engine when it is closed before the end, read or not."""

import asyncio
from typing import Protocol

from pagedserve.engine.admission import AdmissionControl, Deadlines
from pagedserve.engine.output_processor import RequestState
from pagedserve.errors import CapacityError, EngineDeadError
from pagedserve.logger import init_logger
from pagedserve.outputs import RequestOutput

logger = init_logger(__name__)


class StreamEngine(Protocol):
    """What a stream needs of the engine that feeds it (AsyncLLM), so this module never imports it."""

    @property
    def admission(self) -> AdmissionControl: ...

    def abort(self, request_id: str, reason: str | None = None) -> None: ...

    def release(self, request_id: str) -> None: ...

    def record_rejected(self, num_requests: int) -> None: ...

    def request_state(self, request_id: str) -> RequestState | None: ...


class RequestStream:
    """Yields the request's outputs (cumulative, deltas or only the final one, per its output_kind), the
    last with `finished=True`. Raises CapacityError when the request waited past --max-queue-time,
    EngineDeadError if the engine dies meanwhile."""

    def __init__(self, engine: StreamEngine, request_id: str, deadlines: Deadlines) -> None:
        self.request_id = request_id
        self.queue: asyncio.Queue[RequestOutput | Exception] = asyncio.Queue()
        self._engine = engine
        self._deadlines = deadlines
        self._ended = False

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self._ended:
            raise StopAsyncIteration
        try:
            item = await self._next_output()
        except BaseException:  # cancelled: the client left
            await self.aclose()
            raise
        if isinstance(item, Exception):
            self._end(abort=not isinstance(item, EngineDeadError))  # a dead engine has nothing to abort
            raise item
        if item.finished:
            self._end(abort=False)
        return item

    async def aclose(self) -> None:
        """Stop reading; a request that has not ended is aborted in the engine (its KV blocks freed)."""
        if not self._ended:
            self._end(abort=True)

    def _end(self, abort: bool) -> None:
        self._ended = True
        if abort:
            self._engine.abort(self.request_id)
        else:
            self._engine.release(self.request_id)

    async def _next_output(self) -> RequestOutput | Exception:
        """The next output; a CapacityError past --max-queue-time; the final, aborted output past the
        request's deadline."""
        admission, deadlines = self._engine.admission, self._deadlines
        while True:
            if not self.queue.empty():
                return self.queue.get_nowait()
            try:
                return await asyncio.wait_for(
                    self.queue.get(), deadlines.wait_s(self.request_id in admission.queued)
                )
            except TimeoutError:
                pass
            if self.request_id in admission.queued and deadlines.queue_expired():
                self._engine.record_rejected(1)
                limit = admission.limits.max_queue_time
                logger.info(
                    "Request %s timed out in the queue after %.1f s (--max-queue-time).",
                    self.request_id,
                    limit,
                )
                return CapacityError(
                    f"The request waited {limit:g} s for the engine without being started "
                    f"(--max-queue-time {limit:g}): the server is overloaded. Retry later.",
                    admission.retry_after_s(),
                )
            if deadlines.expired():
                return self._aborted(
                    f"its deadline of {deadlines.timeout_s:g} s ({deadlines.timeout_source}) passed"
                )

    def abort(self) -> None:
        """End the request now: its reader gets its final output next (finish_reason "abort")."""
        if not self._ended:
            self.queue.put_nowait(self._aborted(None))

    def _aborted(self, reason: str | None) -> RequestOutput | Exception:
        """Abort the request (`reason` logged); its final output carries what it generated."""
        state = self._engine.request_state(self.request_id)
        if state is None:
            return EngineDeadError(f"Request {self.request_id} vanished before it was aborted.")
        if reason is not None:
            num_generated = sum(len(sample.token_ids) for sample in state.samples)
            reason = f"{reason} after {num_generated} generated tokens"
        self._engine.abort(self.request_id, reason)
        return state.to_output(state.samples) or EngineDeadError(f"Request {self.request_id} has no output.")
