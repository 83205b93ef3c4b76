"""The frontend's side of sleep (vLLM's POST /sleep, POST /wake_up, GET /is_sleeping): the level the
engine is at, and the wait for its answers. The engine core itself wakes when a request reaches it while
asleep (core.py); this side decides whether a request may do that (--wake-on-request) or gets a 503."""

import asyncio
from collections.abc import Callable

from pagedserve.engine.dp_client import DPClient
from pagedserve.engine.mp_client import MPClient
from pagedserve.errors import EngineAsleepError, InvalidRequestError, RequestFailedError

SLEEP_LEVELS = (1, 2)


def check_sleep_level(level: object) -> None:
    """Raises InvalidRequestError (400) unless `level` is one of vLLM's sleep levels."""
    if isinstance(level, bool) or level not in SLEEP_LEVELS:
        raise InvalidRequestError(f"`level` must be 1 or 2, not {level!r}.", param="level")


class SleepControl:
    """Use from the AsyncLLM's event loop."""

    def __init__(self, client: MPClient | DPClient) -> None:
        self.client = client
        self.wake_on_request = False  # the server's --wake-on-request
        self.level = 0  # 0: awake
        self._answer: asyncio.Future[int] | None = None
        self._lock = asyncio.Lock()  # one change at a time: each waits for its own answer

    async def sleep(self, level: int, num_requests_in_flight: int) -> None:
        """Free the weights and the KV cache; returns once they are. Raises InvalidRequestError for a bad
        level (400), requests in flight (409), or several engine replicas (400); RequestFailedError (500)
        when the engine could not (it stays awake)."""
        check_sleep_level(level)
        if num_requests_in_flight:
            raise InvalidRequestError(
                f"Cannot sleep with {num_requests_in_flight} request(s) in flight: retry once they finish.",
                param="level",
                status_code=409,
            )
        client = self._client()
        async with self._lock:
            await self._change(lambda: client.sleep(level))
        if self.level != level:
            raise RequestFailedError(
                f"The engine could not sleep (level {level}) and stays awake: see the server log."
            )

    async def wake_up(self) -> None:
        """Load the weights and allocate the KV cache again; returns once done (at once when awake)."""
        client = self._client()
        async with self._lock:
            if self.level:
                await self._change(client.wake_up)

    def before_submit(self) -> None:
        """A request is about to reach the engine. Raises EngineAsleepError (503) while asleep unless
        --wake-on-request, with which the request wakes it (the engine core loads before taking it)."""
        if not self.level:
            return
        if not self.wake_on_request:
            raise EngineAsleepError(
                f"The model is asleep (POST /sleep, level {self.level}): POST /wake_up first, or start the "
                "server with --wake-on-request."
            )
        self.level = 0

    def answered(self, level: int) -> None:
        """The engine core's answer to SLEEP or WAKE_UP arrived."""
        self.level = level
        if self._answer is not None and not self._answer.done():
            self._answer.set_result(level)

    def engine_died(self, error: Exception) -> None:
        """No answer will come: the change in progress fails with `error`."""
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(error)

    async def _change(self, send: Callable[[], None]) -> None:
        self._answer = asyncio.get_running_loop().create_future()
        send()
        await self._answer

    def _client(self) -> MPClient:
        if not isinstance(self.client, MPClient):
            raise InvalidRequestError(
                "Sleep is not supported with several engine replicas (--data-parallel-size > 1).",
                param="level",
            )
        return self.client
